"""Plans: a partition of a graph's ops into kernels plus one schedule per kernel.

A plan is plain data with a canonical JSON form (sorted keys, versioned) so that
its hash identifies it in the database and a plan file round-trips exactly.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

PLAN_VERSION = 1


class PlanError(Exception):
    """A plan is malformed or does not fit the graph it is applied to."""


@dataclass(frozen=True)
class Plan:
    """``groups``: op names per kernel; ``schedules``: knob dict per group ({} = default schedule).

    ``fold_params``: parameters bound as constants and parameter-only ops folded.
    ``workload``: structural hash of the graph the plan was made for ("" = any).
    ``fast_math``: exp/tanh/sigmoid/erf as vectorizable polynomials (``autofuse.fast_math``);
    in the JSON only when on, so plans from before the flag keep their hashes.
    """

    groups: tuple[tuple[str, ...], ...]
    schedules: tuple[dict[str, Any], ...]
    fold_params: bool = True
    workload: str = ""
    label: str = field(default="", compare=False)
    fast_math: bool = False

    def __post_init__(self) -> None:
        if len(self.groups) != len(self.schedules):
            raise PlanError(f"plan has {len(self.groups)} groups but {len(self.schedules)} schedules")

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": PLAN_VERSION,
            "workload": self.workload,
            "fold_params": self.fold_params,
            "groups": [{"ops": list(g), "schedule": _plain(s)} for g, s in zip(self.groups, self.schedules)],
            **({"fast_math": True} if self.fast_math else {}),
        }

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, no whitespace; equal plans give equal strings."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    @classmethod
    def from_dict(cls, d: Any, label: str = "") -> Plan:
        if not isinstance(d, dict):
            raise PlanError("plan JSON must be an object")
        version = d.get("version")
        if version != PLAN_VERSION:
            raise PlanError(f"plan version {version!r} is not supported (this autofuse reads version {PLAN_VERSION})")
        unknown = set(d) - {"version", "workload", "fold_params", "groups", "fast_math"}
        if unknown:
            raise PlanError(f"plan has unknown field(s) {sorted(unknown)}")
        groups_in = d.get("groups")
        if not isinstance(groups_in, list) or not groups_in:
            raise PlanError("plan 'groups' must be a non-empty list")
        groups, schedules = [], []
        for i, g in enumerate(groups_in):
            if not isinstance(g, dict) or not isinstance(g.get("ops"), list) or not g["ops"]:
                raise PlanError(f"plan group {i} must be an object with a non-empty 'ops' list")
            if not all(isinstance(o, str) for o in g["ops"]):
                raise PlanError(f"plan group {i}: op names must be strings")
            sched = g.get("schedule", {})
            if not isinstance(sched, dict):
                raise PlanError(f"plan group {i}: 'schedule' must be an object")
            groups.append(tuple(g["ops"]))
            schedules.append(sched)
        fold = d.get("fold_params", True)
        if not isinstance(fold, bool):
            raise PlanError("plan 'fold_params' must be true or false")
        workload = d.get("workload", "")
        if not isinstance(workload, str):
            raise PlanError("plan 'workload' must be a string")
        fast = d.get("fast_math", False)
        if not isinstance(fast, bool):
            raise PlanError("plan 'fast_math' must be true or false")
        return cls(tuple(groups), tuple(schedules), fold, workload, label, fast)

    @classmethod
    def from_json(cls, text: str, label: str = "") -> Plan:
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise PlanError(f"plan is not valid JSON: {e}") from e
        return cls.from_dict(d, label)


def _plain(x: Any) -> Any:
    """Knob values as JSON-native types (tuples -> lists, numpy ints -> int)."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return x
    if isinstance(x, float):
        return x
    return int(x)
