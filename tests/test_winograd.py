"""Winograd convolutions (``winograd`` knob): offered where they apply, computing the reference
at sizes the tiles do not divide, with producers and epilogues fused; refused elsewhere."""

import numpy as np
import optuna
import pytest
import tvm
from tvm import relax

from autofuse.build import anchor_op, schedule_module
from autofuse.graph import default_partition
from autofuse.measure import QUICK
from autofuse.nn_ref import conv3x3_pad1
from autofuse.partition import most_fused
from autofuse.plan import PlanError
from autofuse.runner import OK, evaluate_plan
from autofuse.schedule import (LoopNest, ScheduleRejected, _realizes, fit_winograd_tile, seed_schedule,
                               winograd_block)
from autofuse.search import PlanSpace
from autofuse.space import Space, Tensor
from autofuse.target import VectorUnit, parse_target, vector_unit
from autofuse.workload import Workload, get_workload
from autofuse import winograd

LLVM = parse_target("llvm")


def _conv_relu(n: int, c: int, k: int, h: int, w: int) -> Workload:
    def forward(x, wt):
        return relax.op.nn.relu(relax.op.nn.conv2d(x, wt, padding=(1, 1)))

    def reference(x, wt):
        return np.maximum(conv3x3_pad1(x, wt), 0.0)

    space = Space("conv_relu", (Tensor("x", (n, c, h, w)),), (Tensor("wt", (k, c, 3, 3), scale=1 / np.sqrt(9 * c)),),
                  forward, reference)
    return Workload(space)


def _winograd_plan(w: Workload, part, m: int, **knobs):
    g = w.graph(True)
    schedules = [{"winograd": m, **knobs} if winograd.eligible(g, anchor_op(g, grp)) else {} for grp in part]
    assert any(schedules), "no group of this partition can use Winograd"
    return w.partition_plan(part, True, f"winograd{m}", schedules)


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("shape, knobs", [((1, 8, 16, 5, 7), {}),  # rows and columns not multiples of m
                                          ((2, 16, 8, 6, 9), {"wino_rows": 3, "wino_cols": 32}),  # a batch of 2
                                          ((1, 8, 16, 5, 7), {"wino_block": 1}),  # a block per row of tiles
                                          ((2, 16, 8, 8, 9), {"wino_block": 2, "wino_rows": 3})])  # blocks of 2 rows, 2 images
def test_winograd_computes_the_convolution_where_its_tiles_do_not_divide_the_image(m, shape, knobs):
    w = _conv_relu(*shape)
    plan = _winograd_plan(w, default_partition(w.graph(True)), m, **knobs)
    res = evaluate_plan(w, plan, LLVM, QUICK)
    assert res["status"] == OK and res["correct"], res


@pytest.mark.parametrize("partition", ["default", "most-fused"])
@pytest.mark.parametrize("block", [0, 1])
def test_resnet_block_with_both_convolutions_by_winograd_is_correct(partition, block):
    """The second convolution's group holds a residual add in its epilogue; fused most, also
    the first block's BN and ReLU as producers of its padding (per block of tiles: ``wino_block``)."""
    w = get_workload("resnet_block", tiny=True)
    g = w.graph(True)
    part = default_partition(g) if partition == "default" else most_fused(g.dag())
    plan = _winograd_plan(w, part, 4, wino_block=block)
    res = evaluate_plan(w, plan, LLVM, QUICK)
    assert res["status"] == OK and res["correct"], res


def test_winograd_is_offered_only_for_eligible_convolutions():
    """A 3x3 stride-1 convolution of a constant weight: yes; the same on the unfolded graph
    (a runtime weight), a depthwise or a 1x1 convolution, a GEMM: no."""
    def offered(name: str, fold: bool) -> list[bool]:
        ps = PlanSpace(get_workload(name, tiny=True))
        g = ps.workload.graph(fold)
        return ["winograd" in ps._group_space(fold, grp)[2] for grp in default_partition(g)]

    assert offered("conv_bn_relu", True) == [True]
    assert offered("resnet_block", True).count(True) == 2
    assert not any(offered("conv_bn_relu", False))
    assert not any(offered("mobilenet_block", True))
    assert not any(offered("gemm_bn", True))


def test_a_winograd_seed_is_measured_first_where_a_convolution_can_use_it():
    ps = PlanSpace(get_workload("conv_bn_relu", tiny=True))
    seeds = {label: params for params, label in ps.seed_trials(None)}
    assert "seed:winograd" in seeds
    plan = ps.suggest(optuna.trial.FixedTrial(seeds["seed:winograd"]))[0]
    assert [s.get("winograd") for s in plan.schedules] == [4]
    assert not any("winograd" in label for _, label in PlanSpace(get_workload("gemm_bn", tiny=True)).seed_trials(None))


def test_winograd_where_it_does_not_apply_is_a_plan_error():
    w = get_workload("mobilenet_block", tiny=True)
    g = w.graph(True)
    part = default_partition(g)
    schedules = [{"winograd": 4} if g.ops[anchor_op(g, grp)].func.startswith("conv") else {} for grp in part]
    with pytest.raises(PlanError, match="Winograd needs a float32 3x3 stride-1 pad-1"):
        schedule_module(g, w.partition_plan(part, True, "bad", schedules), LLVM)
    cbr = get_workload("conv_bn_relu", tiny=True)
    for bad, message in (({"winograd": 3}, "winograd=3 must be 0"), ({"wino_cols": 12}, "wino_cols=12 must be one of"),
                         ({"wino_block": 3}, "wino_block=3 must be one of")):
        plan = cbr.partition_plan(default_partition(cbr.graph(True)), True, "bad", [bad])
        with pytest.raises(PlanError, match=message):
            schedule_module(cbr.graph(True), plan, LLVM)


def test_the_weight_transform_and_the_tiles_reproduce_a_one_dimensional_convolution():
    """F(m, 3) in one dimension: A^T [(G g) * (B^T d)] equals the m outputs of correlating
    the m + 2 inputs d with the 3 taps g."""
    rng = np.random.default_rng(0)
    for m in (2, 4):
        a, b, g = winograd.matrices(m)
        d, taps = rng.standard_normal(m + 2), rng.standard_normal(3)
        direct = np.array([d[i:i + 3] @ taps for i in range(m)])
        np.testing.assert_allclose(a.T @ ((g @ taps) * (b.T @ d)), direct, rtol=1e-12, atol=1e-12)


def _parallel_loops_by_block(w: Workload, plan) -> dict[str, set[str]]:
    """Each block of the Winograd kernel: the names of the parallel loops around it."""
    mod = schedule_module(w.graph(True), plan, LLVM)
    kernel = next(f for _, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc) and "wino_gemm" in f.script())
    return {realize.block.name_hint: {l.loop_var.name for l in loops if l.kind == tvm.tirx.ForKind.PARALLEL}
            for realize, loops in _realizes(kernel.body)}


def test_blocked_winograd_takes_each_block_through_every_stage_on_one_thread():
    """``wino_block``: one parallel loop over blocks of rows of tiles, and every stage (padding,
    input transform, GEMMs, inverse transform with the epilogue) under it, so a thread reads only
    what it wrote; stage by stage, each stage has a parallel loop of its own (NOTES 42).  A block
    that does not divide the rows of tiles is refused with the reason."""
    w = get_workload("conv_bn_relu", tiny=True)  # 8 x 8: two rows of F(4x4) tiles
    part = default_partition(w.graph(True))
    blocked = _parallel_loops_by_block(w, _winograd_plan(w, part, 4, wino_block=1))
    del blocked["root"]
    assert {"wino_pad", "wino_data", "wino_gemm_update", "wino_out_rows"} <= set(blocked)
    assert len(set().union(*blocked.values())) == 1 and all(len(loops) == 1 for loops in blocked.values())
    by_stage = _parallel_loops_by_block(w, _winograd_plan(w, part, 4))
    stages = ("wino_pad", "wino_data", "wino_gemm_update", "wino_out_rows")
    assert len(set().union(*(by_stage[s] for s in stages))) == 4
    with pytest.raises(ScheduleRejected, match="wino_block=4 does not divide the 2 rows of tiles"):
        schedule_module(w.graph(True), _winograd_plan(w, part, 4, wino_block=4), LLVM)


def test_the_winograd_seed_cuts_the_rows_of_tiles_into_a_block_per_thread_at_least():
    conv = LoopNest((1, 64, 56, 56), (64, 3, 3))  # 14 rows of F(4x4) tiles
    assert winograd_block(conv, 4, threads=2) == 7
    assert winograd_block(conv, 4, threads=4) == 2
    assert winograd_block(conv, 4, threads=16) == 0  # 14 rows: fewer blocks than threads
    assert winograd_block(LoopNest((2, 64, 56, 56), (64, 3, 3)), 4, threads=2) == 14  # a block per image
    assert winograd_block(conv, 2, threads=2) == 14


def test_the_winograd_seeds_register_tile_its_loaded_row_and_broadcast_fit_the_registers():
    conv = LoopNest((1, 64, 56, 56), (64, 3, 3))
    avx512 = seed_schedule(conv, "winograd", VectorUnit(16, 32))  # 6 x 2 + 2 + 1 = 15 of 32 registers
    assert (avx512["winograd"], avx512["wino_rows"], avx512["wino_cols"]) == (4, 6, 32)
    avx2 = seed_schedule(conv, "winograd", VectorUnit(8, 16))  # 6 x 2 + 2 + 1 = 15 of 16 (6 x 32: 29)
    assert (avx2["wino_rows"], avx2["wino_cols"]) == (6, 16)
    neon = seed_schedule(conv, "winograd", VectorUnit(4, 32))  # 6 x 4 + 4 + 1 = 29 of 32
    assert (neon["wino_rows"], neon["wino_cols"]) == (6, 16)
    sse = seed_schedule(conv, "winograd", VectorUnit(4, 16))  # 6 x 2 + 2 + 1 = 15 of 16
    assert (sse["wino_rows"], sse["wino_cols"]) == (6, 8)
    tiny = seed_schedule(conv, "winograd", VectorUnit(4, 8))  # the narrowest columns, then fewer rows: 2 x 2 + 3
    assert (tiny["wino_rows"], tiny["wino_cols"]) == (2, 8)
    w = get_workload("resnet_block", tiny=True)
    ps = PlanSpace(w)
    vectors = vector_unit(LLVM)  # the host's: AVX-512 keeps 6 x 32, AVX2 gets 6 x 16
    tile = fit_winograd_tile({"wino_rows": 6, "wino_cols": 32}, vectors) if vectors else (6, 32)
    seeds = {label: params for params, label in ps.seed_trials(None, vectors)}
    plan = ps.suggest(optuna.trial.FixedTrial(seeds["seed:winograd"]))[0]
    tiles = [(s["wino_rows"], s["wino_cols"]) for s in plan.schedules if s.get("winograd")]
    assert tiles and all(t == tile for t in tiles), (tiles, tile)
    res = evaluate_plan(w, plan, LLVM, QUICK)
    assert res["status"] == OK and res["correct"], res
