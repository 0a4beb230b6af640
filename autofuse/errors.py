"""Which exceptions are the user's input (exit 2) and which are runtime failures (exit 1)."""

from __future__ import annotations


def classify(exc: BaseException) -> int | None:
    """Exit code for a known autofuse error, or None for an unexpected one (a bug)."""
    from autofuse.bench import BenchAppendError
    from autofuse.build import BuildError
    from autofuse.db import DBError
    from autofuse.deploy import DeployError
    from autofuse.graph import GraphError
    from autofuse.plan import PlanError
    from autofuse.schedule import ScheduleRejected
    from autofuse.space import SpaceError
    from autofuse.target import TargetError

    from autofuse.job import JobError
    from autofuse.search import SamplerUnavailable, SpaceChanged

    if isinstance(exc, (SpaceError, PlanError, TargetError, GraphError, ScheduleRejected, SamplerUnavailable, JobError,
                        SpaceChanged, BenchAppendError)):
        return 2
    if isinstance(exc, (BuildError, DBError, DeployError, OSError)) or storage_error(exc) is not None:
        return 1
    return None


def storage_error(exc: BaseException) -> str | None:
    """One line for a database failure raised below autofuse (SQLAlchemy/Optuna storage: disk
    full, I/O error, file not writable), or None when ``exc`` is not one."""
    import sqlite3

    from sqlalchemy import exc as sa_exc

    seen = exc
    for _ in range(5):  # Optuna wraps the driver error (StorageInternalError from OperationalError)
        if isinstance(seen, (sa_exc.DBAPIError, sqlite3.Error)):
            orig = getattr(seen, "orig", None) or seen
            first = (str(orig).strip().splitlines() or [type(orig).__name__])[0]
            if not isinstance(orig, sqlite3.Error):  # a database server's driver (PostgreSQL)
                return f"database error: {first}; check that the database server is running and reachable"
            return (f"database error: {first}; check that the disk is not full and the database file "
                    "and its directory are writable")
        seen = seen.__cause__ or (None if seen.__suppress_context__ else seen.__context__)
        if seen is None:
            return None
    return None
