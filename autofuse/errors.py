"""Which exceptions are the user's input (exit 2) and which are runtime failures (exit 1)."""

from __future__ import annotations


def classify(exc: BaseException) -> int | None:
    """Exit code for a known autofuse error, or None for an unexpected one (a bug)."""
    from autofuse.build import BuildError
    from autofuse.db import DBError
    from autofuse.deploy import DeployError
    from autofuse.graph import GraphError
    from autofuse.plan import PlanError
    from autofuse.schedule import ScheduleRejected
    from autofuse.space import SpaceError
    from autofuse.target import TargetError

    from autofuse.job import JobError
    from autofuse.search import SamplerUnavailable

    if isinstance(exc, (SpaceError, PlanError, TargetError, GraphError, ScheduleRejected, SamplerUnavailable, JobError)):
        return 2
    if isinstance(exc, (BuildError, DBError, DeployError, OSError)):
        return 1
    return None
