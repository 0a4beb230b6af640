"""A workload: a space at a size, its graphs, reference plans, inputs and expected output.

Everything downstream (build, measure, search, deploy) gets its graph and its
reference data from here, so a tuning job, ``autofuse run`` and ``deploy.load``
agree on what "the same workload" means: the structural hash of its graph.
"""

from __future__ import annotations

import json
from functools import cache, cached_property
from pathlib import Path

import numpy as np

from autofuse.graph import Graph, default_partition, space_graph
from autofuse.partition import Partition, unfused
from autofuse.plan import Plan, PlanError
from autofuse.space import Space, load_space

REFERENCE_PLANS = ("unfused", "default")


class Workload:
    """A space (full or tiny size) with parameters bound to given or default values."""

    def __init__(self, space: Space, tiny: bool = False, params: dict[str, np.ndarray] | None = None):
        self.space = space
        self.tiny = tiny
        self.params = space.check_params(params or {})
        self._graphs: dict[bool, Graph] = {}

    @property
    def name(self) -> str:
        return self.space.name + (":tiny" if self.tiny else "")

    def graph(self, fold: bool) -> Graph:
        if fold not in self._graphs:
            self._graphs[fold] = space_graph(self.space, fold, self.params)
        return self._graphs[fold]

    @cached_property
    def hash(self) -> str:
        """Workload key: structural hash of the graph with parameters as inputs."""
        return self.graph(False).structural_hash()

    def graph_json(self) -> str:
        return json.dumps(self.graph(False).to_json(), sort_keys=True)

    # -- plans -------------------------------------------------------------
    def partition_plan(self, part: Partition, fold: bool = True, label: str = "", schedules=None,
                       fast_math: bool = False) -> Plan:
        g = self.graph(fold)
        groups = tuple(tuple(g.ops[i].name for i in grp) for grp in part)
        scheds = tuple(schedules) if schedules is not None else tuple({} for _ in part)
        return Plan(groups, scheds, fold, self.hash, label, fast_math)

    def reference_plan(self, label: str, fold: bool = True) -> Plan:
        """``unfused`` (one op per kernel) or ``default`` (TVM FuseOps), default schedules."""
        g = self.graph(fold)
        if label == "unfused":
            return self.partition_plan(unfused(g.dag()), fold, label)
        if label == "default":
            return self.partition_plan(default_partition(g), fold, label)
        raise PlanError(f"unknown reference plan {label!r} (use unfused, default, or a plan JSON file)")

    def resolve_plan(self, text: str) -> Plan:
        """A reference plan name, or the path of a plan JSON file."""
        if text in REFERENCE_PLANS:
            return self.reference_plan(text)
        path = Path(text)
        if not path.is_file():
            raise PlanError(f"plan {text!r} is neither unfused, default, nor a readable plan file")
        try:
            plan = Plan.from_json(path.read_text(), label=path.stem)
        except OSError as e:
            raise PlanError(f"cannot read plan file {text}: {e.strerror}") from e
        self.check_plan(plan)
        return plan

    def check_plan(self, plan: Plan) -> None:
        if plan.workload and plan.workload != self.hash:
            raise PlanError(
                f"plan was made for workload {plan.workload}, but {self.name} is {self.hash} "
                "(the graph changed, or it is another workload)"
            )

    # -- data --------------------------------------------------------------
    def activations(self, seed: int = 1) -> dict[str, np.ndarray]:
        return self.space.random_activations(seed)

    def check_data(self) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Activations and the reference output every candidate is checked against (cached)."""
        if not hasattr(self, "_check_data"):
            acts = self.activations()
            self._check_data = (acts, self.expected(acts))
        return self._check_data

    def expected(self, acts: dict[str, np.ndarray]) -> np.ndarray:
        ref = self.space.reference(**acts, **self.params)
        return np.asarray(ref, dtype=np.float64)

    def runtime_inputs(self, fold: bool, acts: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Arrays in the order ``main`` takes them (activations, then unfolded parameters)."""
        values = {**acts, **self.params}
        return [values[t.name] for t in self.graph(fold).inputs]


@cache
def get_workload(name: str, tiny: bool = False) -> Workload:
    """The workload of a named space with its default parameters (cached per process).

    ``name`` may also be a model spec (``model:{...}``, see :mod:`autofuse.onnx_import`; with a
    ``region`` key: one region of that model, see :mod:`autofuse.regions`) or an ``.onnx`` path.
    Models have no tiny variant (``tiny`` is ignored for them)."""
    from autofuse.onnx_import import MODEL_PREFIX, model_space, model_space_from_spec, parse_spec

    if name.startswith(MODEL_PREFIX):
        import json

        region = json.loads(name[len(MODEL_PREFIX):]).get("region")
        if region:
            from autofuse.regions import region_workload

            path, shapes = parse_spec(name)
            return region_workload(get_workload(MODEL_PREFIX + json.dumps(
                {"path": path, "shapes": {k: list(v) for k, v in shapes.items()}}, sort_keys=True,
                separators=(",", ":"))), region)
        return Workload(model_space_from_spec(name))
    if name.endswith(".onnx"):
        return Workload(model_space(str(Path(name).resolve())))
    return Workload(load_space(name, tiny), tiny)
