"""Plans: canonical JSON, and every kind of illegal plan rejected with a reason."""

import json

import pytest

from autofuse.build import schedule_module
from autofuse.plan import Plan, PlanError
from autofuse.target import parse_target
from autofuse.space import Space, Tensor
from autofuse.workload import Workload, get_workload

LLVM = parse_target("llvm")


def test_json_round_trip_is_exact_and_hash_stable():
    w = get_workload("mlp_gelu", True)
    p = w.reference_plan("default")
    p2 = Plan.from_json(p.to_json())
    assert p2 == p and p2.to_json() == p.to_json() and p2.hash == p.hash
    d = json.loads(p.to_json())
    assert d["version"] == 1 and d["workload"] == w.hash
    # key order in the input does not matter: the canonical form sorts
    shuffled = json.dumps(dict(reversed(list(d.items()))))
    assert Plan.from_json(shuffled).hash == p.hash
    assert w.reference_plan("unfused").hash != p.hash


@pytest.mark.parametrize("text, match", [
    ("not json", "not valid JSON"),
    ("[]", "must be an object"),
    ('{"version": 99, "groups": [{"ops": ["lv"]}]}', "version 99"),
    ('{"version": 1, "groups": []}', "non-empty"),
    ('{"version": 1, "groups": [{"ops": []}]}', "non-empty 'ops'"),
    ('{"version": 1, "groups": [{"ops": ["a"]}], "extra": 1}', "unknown field"),
])
def test_malformed_plan_json(text, match):
    with pytest.raises(PlanError, match=match):
        Plan.from_json(text)


def _plan(w, groups, schedules=None):
    return Plan(tuple(tuple(g) for g in groups), tuple(schedules or [{} for _ in groups]), True, w.hash)


def _diamond() -> Workload:
    """relu -> exp -> add, with relu also feeding add: {relu, add} is connected but not convex."""
    import numpy as np
    from tvm import relax

    R = relax.op

    def forward(x):
        y = R.nn.relu(x)
        return R.add(y, R.exp(y))

    return Workload(Space("diamond", (Tensor("x", (4, 8)),), (), forward,
                          lambda x: np.maximum(x, 0) + np.exp(np.maximum(x, 0))))


def test_non_convex_group_is_rejected():
    w = _diamond()
    g = w.graph(True)
    relu, exp, add = (op.name for op in g.ops)
    with pytest.raises(PlanError, match="convex"):
        schedule_module(g, _plan(w, [[relu, add], [exp]]), LLVM)


def test_illegal_plans_are_rejected_before_building():
    w = get_workload("conv_bn_relu", True)
    g = w.graph(True)
    names = [op.name for op in g.ops]
    cases = {
        "not connected": ([[names[0], names[2]], [names[1]], names[3:]], "connected"),
        "two complex ops": ([names[:2], names[2:]], "complex"),
        "unknown op": ([names + ["nope"]], "does not have"),
        "op twice": ([names, [names[0]]], "appears in 2 groups"),
        "op missing": ([names[:-1]], "missing|not in any|exactly one"),
    }
    del cases["two complex ops"]  # conv_bn_relu has one conv; covered in test_partition
    for what, (groups, match) in cases.items():
        with pytest.raises(PlanError, match=match):
            schedule_module(g, _plan(w, groups), LLVM)


@pytest.mark.parametrize("knobs, match", [
    ({"bogus": 1}, "unknown knob"),
    ({"t3": 10_000}, "out of range"),
    ({"vector": 3}, "true or false"),
    ({"parallel": "2"}, "integer"),
    ({"epilogue_at": 9}, "out of range"),
])
def test_bad_knobs_are_rejected(knobs, match):
    w = get_workload("conv_bn_relu", True)
    g = w.graph(True)
    with pytest.raises(PlanError, match=match):
        schedule_module(g, _plan(w, [[op.name for op in g.ops]], [knobs]), LLVM)


def test_plan_for_another_workload_is_refused():
    w = get_workload("conv_bn_relu", True)
    other = get_workload("gemm_bn", True).reference_plan("default")
    with pytest.raises(PlanError, match="made for workload"):
        w.check_plan(other)
