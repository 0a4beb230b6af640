"""Fast math: exp/tanh/sigmoid/erf as vectorized polynomials, per plan, checked like any plan."""

import json
from dataclasses import replace
from math import erf

import numpy as np
import optuna
import pytest
import tvm
from tvm import s_tir, te, topi

from autofuse import fast_math
from autofuse.measure import QUICK
from autofuse.plan import Plan, PlanError
from autofuse.runner import OK, evaluate_plan
from autofuse.search import PlanSpace
from autofuse.target import parse_target
from autofuse.workload import get_workload

LLVM = parse_target("llvm")
X = np.concatenate([np.linspace(-20, 20, 4096), np.random.default_rng(0).standard_normal(4096) * 3]).astype(np.float32)
X64 = X.astype(np.float64)
REFERENCE = {"exp": np.exp, "tanh": np.tanh, "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "erf": np.vectorize(erf)}
LIBM = {"exp": "expf", "tanh": "expf", "sigmoid": "expf", "erf": "erff"}


def _run(name: str, on: bool) -> tuple[np.ndarray, str]:
    a = te.placeholder(X.shape, "float32", name="A")
    sch = s_tir.Schedule(te.create_prim_func([a, getattr(topi, name)(a)]))
    (loop,) = sch.get_loops(sch.get_child_blocks(sch.get_sblock("root"))[0])
    sch.vectorize(sch.split(loop, [None, 16])[1])
    with fast_math.enabled(on):
        lib = tvm.compile(sch.mod, target=LLVM.tvm())
    out = tvm.runtime.tensor(np.zeros_like(X))
    lib["main"](tvm.runtime.tensor(X), out)
    return out.numpy().astype(np.float64), lib.mod.inspect_source("asm")


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_fast_functions_are_accurate_and_call_no_libm(name):
    ref = REFERENCE[name](X64)
    exact, exact_asm = _run(name, False)
    fast, fast_asm = _run(name, True)
    assert LIBM[name] in exact_asm and LIBM[name] not in fast_asm  # scalar libm calls gone
    abs_err = np.abs(fast - ref)
    rel_err = abs_err / np.maximum(np.abs(ref), 1e-30)
    assert np.all(abs_err <= 1e-6 + 2e-6 * np.abs(ref)), (abs_err.max(), rel_err.max())
    if name == "exp":
        assert rel_err.max() < 5e-7
    _, again = _run(name, False)  # the switch is per compilation: off again afterwards
    assert LIBM[name] in again


def test_plan_json_has_fast_math_only_when_on_and_rejects_non_bool():
    w = get_workload("mlp_gelu", True)
    plain = w.reference_plan("default")
    assert "fast_math" not in json.loads(plain.to_json())  # hashes of plans from before the flag are kept
    fast = replace(plain, fast_math=True)
    assert json.loads(fast.to_json())["fast_math"] is True and fast.hash != plain.hash
    assert Plan.from_json(fast.to_json()) == fast
    with pytest.raises(PlanError, match="fast_math"):
        Plan.from_json(json.dumps({**json.loads(plain.to_json()), "fast_math": "yes"}))


def test_search_offers_fast_math_only_where_a_kernel_calls_transcendentals():
    gelu, gemm = get_workload("mlp_gelu", True), get_workload("gemm_bn", True)
    assert gelu.graph(True).uses_transcendentals and not gemm.graph(True).uses_transcendentals
    assert "seed:fast_math" in [label for _, label in PlanSpace(gelu).seed_trials()]
    assert not [label for _, label in PlanSpace(gemm).seed_trials() if "fast_math" in label]
    # the templates of the default partition are seeded with the flag too (NOTES 35)
    seeds = dict((label, params) for params, label in PlanSpace(gelu).seed_trials())
    assert seeds["seed:wide-packed:fast_math"] == {**seeds["seed:wide-packed"], "fast_math": True}
    assert not [label for label in seeds if label.startswith("seed:most-fused:") and label.count(":") > 2]
    assert "fast_math" not in PlanSpace(gemm).params_of(gemm.reference_plan("default"))
    space = PlanSpace(gelu)
    fast = replace(gelu.reference_plan("default"), fast_math=True)
    study = optuna.create_study()
    study.enqueue_trial(space.params_of(fast))
    plan, _ = space.suggest(study.ask())
    assert plan.fast_math and space.params_of(plan) == space.params_of(fast)  # the trial builds that plan


@pytest.mark.parametrize("space", ["attention", "mlp_gelu"])
def test_fast_math_plans_build_and_pass_the_correctness_check(space):
    w = get_workload(space, tiny=True)
    res = evaluate_plan(w, replace(w.reference_plan("default"), fast_math=True), LLVM, QUICK)
    assert res["status"] == OK and res["correct"], res
