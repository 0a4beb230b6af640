"""Every space: unfused, default and a sampled plan build and compute the reference; CUDA builds."""

import random

import pytest
import tvm

from autofuse.build import build, group_anchor
from autofuse.measure import QUICK
from autofuse.partition import decisions, partition_from_choices
from autofuse.plan import PlanError
from autofuse.runner import OK, evaluate_plan
from autofuse.schedule import LoopNest, ScheduleRejected, knob_space
from autofuse.space import space_names
from autofuse.target import VectorUnit, parse_target
from autofuse.workload import get_workload

LLVM = parse_target("llvm")
SPACES = space_names()


def test_all_eight_spaces_present():
    assert {"mlp_gelu", "conv_bn_relu", "ew_chain", "layernorm_residual", "attention", "resnet_block",
            "gemm_bn", "mobilenet_block"} <= set(SPACES)


def sampled_plan(w, seed: int):
    """A random legal partition with random knob values per group."""
    rng = random.Random(seed)
    fold = rng.random() < 0.7
    g = w.graph(fold)
    dag = g.dag()
    part, _ = partition_from_choices(dag, [rng.random() < 0.6 for _ in decisions(dag)])
    schedules = []
    for grp in part:
        _, nest = group_anchor(g, grp)
        schedules.append({k: rng.choice(v) for k, v in knob_space(nest).items()})
    return w.partition_plan(part, fold, "sampled", schedules)


@pytest.mark.parametrize("space", SPACES)
def test_reference_and_sampled_plans_are_correct(space):
    w = get_workload(space, tiny=True)
    for label in ("unfused", "default"):
        res = evaluate_plan(w, w.reference_plan(label), LLVM, QUICK)
        assert res["status"] == OK and res["correct"], (label, res)
        assert res["median_ms"] > 0
    accepted = 0
    for seed in range(12):
        try:
            res = evaluate_plan(w, sampled_plan(w, seed), LLVM, QUICK)
        except ScheduleRejected:
            continue
        assert res["correct"], (seed, res)  # a schedule that builds must compute the right thing
        accepted += 1
        if accepted == 2:
            break
    assert accepted >= 1


@pytest.mark.parametrize("space", SPACES)
def test_cuda_build_has_a_device_module(space):
    from autofuse.build import _imports

    w = get_workload(space, tiny=True)
    ex = build(w.graph(True), w.reference_plan("default"), parse_target('{"kind":"cuda","arch":"sm_90"}'))
    assert "cuda" in [m.kind for m in _imports(ex)]


def test_horizontal_fusion_of_siblings_builds_and_is_correct():
    """exp(x) and relu(x) share x and are independent: one kernel computes both (two outputs)."""
    import numpy as np
    from tvm import relax

    from autofuse.space import Space, Tensor
    from autofuse.workload import Workload

    R = relax.op
    w = Workload(Space("siblings", (Tensor("x", (16, 32)),), (), lambda x: R.multiply(R.exp(x), R.nn.relu(x)),
                       lambda x: np.exp(x) * np.maximum(x, 0)))
    g = w.graph(True)
    assert "s0_1" in [d.key for d in decisions(g.dag())]
    for knobs in ({}, {"producer_at": -1}, {"epilogue_at": -1}, {"parallel": 0}):
        plan = w.partition_plan(((0, 1), (2,)), True, "siblings", [knobs, {}])
        res = evaluate_plan(w, plan, LLVM, QUICK)
        assert res["status"] == OK and res["correct"], (knobs, res)


@pytest.mark.parametrize("width", [0, 8, 16])
def test_vectorized_partial_sums_of_norm_statistics(width):
    """reduce_vector rfactors the layer-norm statistics into vector partial sums (and 0 does
    not); every width computes the same result as the reference."""
    from autofuse.build import outline, partition_of
    from autofuse.schedule import apply_cpu, resolve_knobs
    from tvm import s_tir

    w = get_workload("layernorm_residual", tiny=True)
    g = w.graph(True)
    plan = w.partition_plan((tuple(range(len(g.ops))),), True, "ln", [{"reduce_vector": width}])
    part = partition_of(g, plan)
    fused = outline(g, part)
    sch = s_tir.Schedule(fused.mod)
    anchor, nest = group_anchor(g, part[0])
    apply_cpu(sch, fused.kernels[0], anchor, resolve_knobs(nest, plan.schedules[0]))
    text = sch.mod[fused.kernels[0]].script()
    assert ("_rf" in text) == (width > 0)
    if width:
        assert f"T.vectorized(T.int64({width}))" in text
    res = evaluate_plan(w, plan, LLVM, QUICK)
    assert res["status"] == OK and res["correct"], res


@pytest.mark.parametrize("outer_first", [0, 1])
def test_outer_first_puts_that_tile_loop_outermost(outer_first):
    """outer_first=1 on a GEMM runs the column tiles outside the row tiles (the loop nest
    says so), and both orders compute the reference result."""
    from autofuse.build import outline, partition_of
    from autofuse.schedule import apply_cpu, resolve_knobs
    from tvm import s_tir

    w = get_workload("gemm_bn", tiny=True)
    g = w.graph(True)
    knobs = {"outer_first": outer_first, "parallel": 0, "t0": 4, "t1": 4}
    plan = w.partition_plan((tuple(range(len(g.ops))),), True, "gemm", [knobs])
    part = partition_of(g, plan)
    fused = outline(g, part)
    sch = s_tir.Schedule(fused.mod)
    anchor, nest = group_anchor(g, part[0])
    apply_cpu(sch, fused.kernels[0], anchor, resolve_knobs(nest, plan.schedules[0]))
    block = sch.get_child_blocks(sch.get_sblock("root"))[anchor]
    first = sch.get(sch.get_loops(block)[0])
    rows, cols = nest.spatial
    assert (rows // 4, cols // 4) == (4, 8)  # tiny gemm_bn: the two orders differ
    assert int(first.extent) == (cols // 4 if outer_first else rows // 4)
    res = evaluate_plan(w, plan, LLVM, QUICK)
    assert res["status"] == OK and res["correct"], res


def test_outer_first_out_of_range_is_a_plan_error():
    from autofuse.schedule import LoopNest, resolve_knobs

    with pytest.raises(PlanError, match="outer_first=2 is out of range"):
        resolve_knobs(LoopNest((8, 16), (4,)), {"outer_first": 2})


@pytest.mark.parametrize("space, k_block", [("gemm_bn", 8), ("mlp_gelu", 16), ("conv_bn_relu", 2)])
def test_k_block_runs_the_reduction_in_blocks_outermost(space, k_block):
    """k_block splits the first reduction loop and puts the block loop outermost, around the
    parallel tile loops; the result is the reference's."""
    from autofuse.build import outline, partition_of
    from autofuse.schedule import apply_cpu, resolve_knobs
    from tvm import s_tir

    w = get_workload(space, tiny=True)
    g = w.graph(True)
    part = partition_of(g, w.reference_plan("default"))
    knobs = [{"k_block": k_block} if group_anchor(g, grp)[1].reduce else {} for grp in part]
    plan = w.partition_plan(part, True, "kb", knobs)
    gi = next(i for i, kn in enumerate(knobs) if kn)
    fused = outline(g, part)
    sch = s_tir.Schedule(fused.mod)
    anchor, nest = group_anchor(g, part[gi])
    sch.work_on(fused.kernels[gi])
    name = sch.get(sch.get_child_blocks(sch.get_sblock("root"))[anchor]).name_hint
    apply_cpu(sch, fused.kernels[gi], anchor, resolve_knobs(nest, knobs[gi]))
    loops = [sch.get(l) for l in sch.get_loops(sch.get_sblock(f"{name}_update"))]
    assert int(loops[0].extent) == nest.reduce[0] // k_block and loops[0].kind == tvm.tirx.ForKind.SERIAL
    assert loops[1].kind == tvm.tirx.ForKind.PARALLEL
    res = evaluate_plan(w, plan, LLVM, QUICK)
    assert res["status"] == OK and res["correct"], res


def test_k_block_needs_a_reduction_long_enough():
    from autofuse.schedule import LoopNest, resolve_knobs

    with pytest.raises(PlanError, match="k_block=64 needs a reduction loop"):
        resolve_knobs(LoopNest((8, 16), (32,)), {"k_block": 64})
    with pytest.raises(PlanError, match="k_block=16 needs a reduction loop"):
        resolve_knobs(LoopNest((8, 16), ()), {"k_block": 16})
    with pytest.raises(PlanError, match="must be 0"):
        resolve_knobs(LoopNest((8, 16), (32,)), {"k_block": -4})
    assert resolve_knobs(LoopNest((8, 16), (32,)), {"k_block": 8})["k_block"] == 8


def _vector_widths(text: str) -> list[int]:
    import re

    return [int(x) for x in re.findall(r"T\.vectorized\(T\.int64\((\d+)\)\)", text)]


def _scheduled_text(w, plan) -> str:
    from autofuse.build import schedule_module

    mod = schedule_module(w.graph(plan.fold_params), plan, LLVM)
    return "\n".join(f.script() for _, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc))


@pytest.mark.parametrize("epilogue_at", [-1, 0])
def test_epilogue_rows_are_vectorized_a_few_registers_at_a_time(epilogue_at):
    """A GELU epilogue at the outer row-tile loop (or at root) loops over whole 3072-float
    rows; vectorized in one piece it became one LLVM vector of 3072 lanes, which took LLVM
    20 s to compile (NOTES 18).  No loop gets more than MAX_VECTOR_LANES lanes."""
    from autofuse.schedule import MAX_VECTOR_LANES

    w = get_workload("mlp_gelu")
    part = _default_partition(w)
    knobs = {"t0": 8, "t1": 16, "parallel": 1, "epilogue_at": epilogue_at, "vector": True}
    plan = w.partition_plan(part, True, "rows", [dict(knobs) for _ in part], fast_math=True)
    widths = _vector_widths(_scheduled_text(w, plan))
    assert widths and max(widths) <= MAX_VECTOR_LANES
    assert MAX_VECTOR_LANES in widths  # the 3072-float rows: split, not left scalar


def test_split_vectors_compute_the_reference(monkeypatch):
    """The split path (a row wider than the cap) is correct: tiny mlp_gelu's 64-float rows
    under a 16-lane cap."""
    from autofuse import schedule

    monkeypatch.setattr(schedule, "MAX_VECTOR_LANES", 16)
    w = get_workload("mlp_gelu", tiny=True)
    part = _default_partition(w)
    knobs = {"t0": 8, "t1": 8, "parallel": 1, "epilogue_at": 0, "vector": True}
    plan = w.partition_plan(part, True, "rows", [dict(knobs) for _ in part])
    assert "for ax1_1 in T.vectorized(T.int64(16))" in _scheduled_text(w, plan)  # the row loop, split
    res = evaluate_plan(w, plan, LLVM, QUICK)
    assert res["status"] == OK and res["correct"], res


def test_vector_lanes_prefer_whole_avx512_registers():
    from autofuse.schedule import _vector_lanes

    assert [_vector_lanes(n) for n in (3072, 768, 96, 100, 127)] == [64, 64, 48, 50, 0]


def _default_partition(w):
    from autofuse.build import partition_of

    return partition_of(w.graph(True), w.reference_plan("default"))


def _first_group_plan(w, label: str, knobs: dict):
    """The default partition, ``knobs`` on its first group, default schedules elsewhere."""
    part = _default_partition(w)
    return w.partition_plan(part, True, label, [knobs] + [{} for _ in part[1:]])


def _packable(w, fold: bool) -> list[bool]:
    """Per group of the default partition: whether its knob space offers pack_weight."""
    from autofuse.search import PlanSpace

    g, space = w.graph(fold), PlanSpace(w)
    part = [tuple(sorted(g.index()[o] for o in grp)) for grp in w.reference_plan("default", fold).groups]
    return ["pack_weight" in space._group_space(fold, grp)[2] for grp in part]


def test_pack_weight_is_offered_where_the_anchor_reads_a_constant_weight():
    """gemm_bn's and mlp_gelu's GEMMs and the convolutions read bound weights; attention's
    batched GEMMs read computed tensors, and with the parameters as runtime inputs
    (fold_params=False) there is no constant to repack."""
    assert _packable(get_workload("gemm_bn", tiny=True), True) == [True]
    assert _packable(get_workload("mlp_gelu", tiny=True), True) == [True, True]
    assert _packable(get_workload("conv_bn_relu", tiny=True), True) == [True]
    assert _packable(get_workload("resnet_block", tiny=True), True) == [True, True]
    assert not any(_packable(get_workload("gemm_bn", tiny=True), False))
    assert not any(_packable(get_workload("conv_bn_relu", tiny=True), False))
    assert not any(_packable(get_workload("attention", tiny=True), True))


@pytest.mark.parametrize("t1", [16, 8])
def test_pack_weight_repacks_the_constant_at_build_time(t1):
    """The GEMM reads its weight as (columns // tile, k, tile): the kernel's parameter has that
    shape, no kernel repacks at run time (FoldConstant ran the repacking), and the result is
    the reference's."""
    w = get_workload("gemm_bn", tiny=True)  # x (16, 32) @ w.T (32, 32), one kernel in the default partition
    plan = w.partition_plan([tuple(range(len(w.graph(True).ops)))], True, "packed", [{"pack_weight": True, "t1": t1}])
    text = _scheduled_text(w, plan)
    assert f"T.Buffer((T.int64({32 // t1}), T.int64(32), T.int64({t1})), \"float32\")" in text
    assert "layout_rewrite_preproc" not in text
    res = evaluate_plan(w, plan, LLVM, QUICK)
    assert res["status"] == OK and res["correct"], res


@pytest.mark.parametrize("t1", [8, 4])
def test_pack_weight_repacks_a_convolution_weight_by_output_channels(t1):
    """A convolution's weight W[c, rc, rh, rw] is read as (c // tile, rc, rh, rw, tile), tile
    the output-channel tile t1, repacked at build time; the result is the reference's."""
    w = get_workload("conv_bn_relu", tiny=True)  # W (8, 8, 3, 3)
    plan = _first_group_plan(w, "packed", {"pack_weight": True, "t1": t1})
    text = _scheduled_text(w, plan)
    assert f"T.Buffer((T.int64({8 // t1}), T.int64(8), T.int64(3), T.int64(3), T.int64({t1})), \"float32\")" in text
    assert "layout_rewrite_preproc" not in text
    res = evaluate_plan(w, plan, LLVM, QUICK)
    assert res["status"] == OK and res["correct"], res


def test_pack_weight_where_no_weight_can_be_repacked_is_rejected():
    w = get_workload("attention", tiny=True)  # its GEMMs read computed tensors, indexed by the batch
    plan = _first_group_plan(w, "bad", {"pack_weight": True})
    with pytest.raises(ScheduleRejected, match="pack_weight: the anchor reads no weight"):
        evaluate_plan(w, plan, LLVM, QUICK)


def test_vector_axis_is_offered_for_convolutions_only():
    from autofuse.schedule import LoopNest

    assert knob_space(LoopNest((1, 8, 8, 8), (8, 3, 3)))["vector_axis"] == [1, 2, 3]
    assert "vector_axis" not in knob_space(LoopNest((16, 32), (32,)))  # a GEMM vectorizes its columns
    assert "vector_axis" not in knob_space(LoopNest((1, 8, 8, 8), ()))  # element-wise


@pytest.mark.parametrize("pack", [True, False])
def test_vector_axis_over_channels_accumulates_a_local_tile(pack):
    """With the output channels as the vector axis, the convolution sums into a local tile
    whose innermost axis is the channels (a vector there is contiguous), written back once per
    tile; the result is the reference's, with the weight packed to match or not."""
    w = get_workload("conv_bn_relu", tiny=True)
    plan = _first_group_plan(w, "channels", {"vector_axis": 1, "t1": 8, "t3": 4, "pack_weight": pack})
    text = _scheduled_text(w, plan)
    assert 'scope="local")' in text
    assert ("T.int64(3), T.int64(8)), \"float32\")" in text) == pack
    res = evaluate_plan(w, plan, LLVM, QUICK)
    assert res["status"] == OK and res["correct"], res


def test_vector_axis_needs_whole_sums_in_a_tile():
    from autofuse.schedule import LoopNest, resolve_knobs

    w = get_workload("conv_bn_relu", tiny=True)
    plan = _first_group_plan(w, "bad", {"vector_axis": 1, "t1": 8, "k_block": 2})
    with pytest.raises(ScheduleRejected, match="vector_axis=1 needs an outer tile loop"):
        evaluate_plan(w, plan, LLVM, QUICK)
    with pytest.raises(PlanError, match="vector_axis=4 is out of range"):
        resolve_knobs(LoopNest((1, 8, 8, 8), (8, 3, 3)), {"vector_axis": 4})


def test_vector_unit_is_read_from_the_targets_cpu_features():
    from autofuse.target import vector_unit

    assert vector_unit(parse_target({"kind": "llvm", "mcpu": "znver3"})) == VectorUnit(8, 16)  # AVX2
    assert vector_unit(parse_target({"kind": "llvm", "mcpu": "skylake-avx512"})) == VectorUnit(16, 32)
    assert vector_unit(parse_target("cuda")) is None
    # a tile's registers: its accumulators, the row each step loads, the broadcast element
    assert VectorUnit(8, 16).tile_registers(8, 16) == 19 and not VectorUnit(8, 16).fits(8, 16)  # AVX2 spills 8 x 16
    assert VectorUnit(8, 16).tile_registers(6, 16) == 15 and VectorUnit(8, 16).fits(6, 16)
    assert VectorUnit(16, 32).tile_registers(8, 32) == 19 and VectorUnit(16, 32).fits(14, 32)
    assert not VectorUnit(16, 32).fits(15, 32) and VectorUnit(4, 16).tile_registers(1, 14) == 9


GEMM = LoopNest((256, 1024), (1024,))
CONV = LoopNest((1, 64, 56, 56), (64, 3, 3))


@pytest.mark.parametrize("nest", [GEMM, CONV, LoopNest((1, 24, 28, 28), (48, 1, 1)), LoopNest((2, 16, 30), (7,))],
                         ids=["gemm", "conv", "conv1x1", "odd"])
@pytest.mark.parametrize("vectors", [VectorUnit(4, 16), VectorUnit(8, 16), VectorUnit(8, 32), VectorUnit(16, 32)],
                         ids=["sse", "avx2", "256bit-x32", "avx512"])
def test_seed_register_tiles_fit_the_register_file(nest, vectors):
    """Every template that applies here (``registers`` always does) has a register tile (its
    rows: the product of the inner spatial tiles off the vector axis) that fits the target's
    registers, except where only the vector axis is left to cut; the vector axis's tile is
    never cut."""
    import math

    from autofuse.schedule import SEED_TEMPLATES, resolve_knobs, seed_schedule

    for template in SEED_TEMPLATES:
        if template != "registers" and not seed_schedule(nest, template):
            assert seed_schedule(nest, template, vectors) == {}  # not applicable stays not applicable
            continue
        knobs = resolve_knobs(nest, seed_schedule(nest, template, vectors))
        tiles = [min(knobs[f"t{i}"], ext) for i, ext in enumerate(nest.spatial)]
        others = [t for i, t in enumerate(tiles) if i != knobs["vector_axis"]]
        assert vectors.fits(math.prod(others), tiles[knobs["vector_axis"]]) or all(t == 1 for t in others), \
            (template, tiles)
        unfitted = resolve_knobs(nest, seed_schedule(nest, template))
        assert knobs[f"t{knobs['vector_axis']}"] == unfitted[f"t{unfitted['vector_axis']}"]
        # a Winograd convolution's GEMMs: their accumulators, the row each step loads and the
        # broadcast element within the register file, one row of the narrowest columns at least
        def wino_fit(k: dict) -> bool:
            return vectors.fits(k["wino_rows"], k["wino_cols"])

        wino_fits = not unfitted["winograd"] or wino_fit(unfitted)
        if knobs["winograd"]:
            assert wino_fit(knobs) or (knobs["wino_rows"], knobs["wino_cols"]) == (1, 8), knobs
            assert knobs["wino_cols"] <= unfitted["wino_cols"] and knobs["wino_rows"] <= unfitted["wino_rows"]
        axis = unfitted["vector_axis"]
        unfitted_rows = math.prod(min(unfitted[f"t{i}"], e) for i, e in enumerate(nest.spatial) if i != axis)
        if vectors.fits(unfitted_rows, min(unfitted[f"t{axis}"], nest.spatial[axis])) and wino_fits:
            assert knobs == unfitted, template  # a tile that fits is left alone
    assert seed_schedule(nest, "registers") == {}


def test_register_tiles_on_avx2_and_avx512():
    """AVX2's 16 ymm registers fit 6 rows of a 16-column tile (12 accumulators, the 2 vectors
    each step loads, 1 broadcast): a GEMM's 8 x 16 tile becomes 6 x 16 where 6 divides its
    rows, 4 x 16 where not, the wide 8 x 32 one 2 x 32, a convolution's 16-channel vector tile
    keeps 4 columns; on AVX-512 every template is the one tuned on it (measured, NOTES 36)."""
    from autofuse.schedule import seed_schedule

    avx2, avx512 = VectorUnit(8, 16), VectorUnit(16, 32)
    assert seed_schedule(GEMM, "registers", avx2) == {"t0": 4}
    assert seed_schedule(LoopNest((192, 256), (256,)), "registers", avx2) == {"t0": 6}  # 15 of 16 registers
    assert seed_schedule(GEMM, "wide-packed", avx2) == {"t1": 32, "pack_weight": True, "t0": 2}
    assert seed_schedule(CONV, "channels-vector", avx2) == {"vector_axis": 1, "t1": 16, "pack_weight": True, "t3": 4}
    assert seed_schedule(CONV, "registers", avx2) == {"t1": 4}
    assert seed_schedule(GEMM, "tall", avx512) == {"t0": 16}  # 16 x 16: half of AVX-512's registers
    assert seed_schedule(CONV, "tall", avx512) == {"t2": 2}  # 8 channels x 2 image rows x 16 columns
    assert seed_schedule(CONV, "tall", avx2) == {"t2": 2, "t1": 2}  # AVX2: the channels give way
    assert seed_schedule(LoopNest((8, 30), (7,)), "tall") == {}  # 8 rows: no taller divisor of 8
    assert seed_schedule(LoopNest((1, 32, 112, 112), (1, 3, 3)), "tall") == {}  # depthwise: no shared loads
    for template in ("registers", "wide-packed", "channels-vector", "inline"):
        for nest in (GEMM, CONV):
            assert seed_schedule(nest, template, avx512) == seed_schedule(nest, template)


def test_coarse_seed_keeps_only_an_outer_loop_that_feeds_every_thread(monkeypatch):
    """Attention's heads (12) give each of 2 threads 6 chunks: the ``coarse`` template runs them
    alone in parallel, with the wide tile and the reduction 4 at a time for its batched GEMMs and
    two rows per tile for its softmax; with 16 threads (12 < 4 x 16) it does not apply, nor on
    a 2-D GEMM or an NCHW convolution (one loop in parallel already), nor on tiny shapes."""
    from autofuse.schedule import coarse_parallel, seed_schedule

    scores, softmax = LoopNest((12, 128, 128), (64,)), LoopNest((12, 128, 128), ())
    monkeypatch.setenv("TVM_NUM_THREADS", "2")
    assert coarse_parallel(scores, 2) == 1 and coarse_parallel(scores, 16) == 2
    assert seed_schedule(scores, "coarse") == {"parallel": 1, "t2": 32, "r0": 4}
    assert seed_schedule(LoopNest((12, 128, 64), (128,)), "coarse") == {"parallel": 1, "t2": 32, "r0": 4}
    assert seed_schedule(softmax, "coarse") == {"parallel": 1, "t1": 2}
    assert seed_schedule(LoopNest((12, 128, 48), (6,)), "coarse") == {"parallel": 1}  # 48 columns: not wide; 6 steps
    for nest in (GEMM, CONV, LoopNest((2, 16, 16), (8,))):
        assert seed_schedule(nest, "coarse") == {}
    monkeypatch.setenv("TVM_NUM_THREADS", "16")
    assert seed_schedule(scores, "coarse") == {} and seed_schedule(softmax, "coarse") == {}


def test_coarse_seed_of_attention_builds_and_computes_the_reference(monkeypatch):
    """The full-size attention space (the tiny one has 2 heads: no template applies) seeds its
    coarse plans on 2 threads, and the one with fast math runs correctly."""
    import optuna

    from autofuse.search import PlanSpace

    monkeypatch.setenv("TVM_NUM_THREADS", "2")
    w = get_workload("attention", tiny=False)
    ps = PlanSpace(w)
    seeds = {label: params for params, label in ps.seed_trials(None, VectorUnit(16, 32))}
    assert {"seed:coarse", "seed:coarse:fast_math"} <= set(seeds)
    plan = ps.suggest(optuna.trial.FixedTrial(seeds["seed:coarse:fast_math"]))[0]
    assert plan.fast_math and {s.get("parallel") for s in plan.schedules} == {1}
    res = evaluate_plan(w, plan, LLVM, QUICK)
    assert res["status"] == OK and res["correct"], res


@pytest.mark.parametrize("space", ["gemm_bn", "conv_bn_relu"])
def test_seeds_fitted_to_a_small_register_file_build_and_compute_the_reference(space):
    """SSE's 16 registers of 4 floats (32 accumulator floats): even the tiny shapes' tiles are cut."""
    import optuna

    from autofuse.search import PlanSpace
    from autofuse.target import VectorUnit

    w = get_workload(space, tiny=True)
    ps = PlanSpace(w)
    sse = dict((label, params) for params, label in ps.seed_trials(None, VectorUnit(4, 16)))
    assert "seed:registers" in sse and sse != dict((label, p) for p, label in ps.seed_trials(None))
    for label in ("seed:registers", "seed:packed"):
        plan = ps.suggest(optuna.trial.FixedTrial(sse[label]))[0]
        res = evaluate_plan(w, plan, LLVM, QUICK)
        assert res["status"] == OK and res["correct"], (label, res)


def _matmul_then_column_sums():
    """A workload of one op: y = x @ w, then every column of y summed (a reduction over the
    GEMM's rows, the anchor's first axis), the shape of a Winograd inverse transform."""
    import numpy as np
    from tvm import relax, te

    from autofuse.space import Space, Tensor
    from autofuse.workload import Workload

    def compute(x, w):
        k = te.reduce_axis((0, 32), "k")
        y = te.compute((32, 16), lambda i, j: te.sum(x[i, k] * w[k, j], axis=k), name="y")
        i = te.reduce_axis((0, 32), "i")
        return te.compute((16,), lambda j: te.sum(y[i, j], axis=i), name="colsum")

    def forward(x, w):
        return relax.BlockBuilder.current().call_te(compute, x, w, primfunc_name_hint="matmul_colsum")

    space = Space("colsum", (Tensor("x", (32, 32)),), (Tensor("w", (32, 16)),), forward,
                  lambda x, w: (x.astype(np.float64) @ w).sum(axis=0))
    return Workload(space)


def test_an_epilogue_summing_over_the_tile_loops_stays_at_root_and_computes_the_reference():
    """Moved under the GEMM's row tiles, the column sums would be added tile by tile, and by
    two threads at once when the tiles run in parallel: a Winograd probe gave wrong results in
    some runs (NOTES 39).  Such an epilogue keeps its own loop nest; every placement is right."""
    from autofuse.build import schedule_module
    from autofuse.schedule import _realizes

    w = _matmul_then_column_sums()
    for knobs in ({"epilogue_at": 0, "parallel": 1, "t0": 4}, {"epilogue_at": 1, "parallel": 2, "t0": 4, "t1": 8},
                  {"epilogue_at": 0, "parallel": 0}):
        plan = w.partition_plan(((0,),), True, "colsum", [knobs])
        mod = schedule_module(w.graph(True), plan, LLVM)
        kernel = next(f for gv, f in mod.functions.items() if "colsum" in gv.name_hint)
        loops_of = {r.block.name_hint: loops for r, loops in _realizes(kernel.body)}
        gemm_loops = [l for name, loops in loops_of.items() if name.startswith("y") for l in loops]
        assert gemm_loops and not [l for l in loops_of["colsum"] if any(l.same_as(g) for g in gemm_loops)], knobs
        for _ in range(3):  # a race shows in some runs only
            res = evaluate_plan(w, plan, LLVM, QUICK)
            assert res["status"] == OK and res["correct"], (knobs, res)


def test_a_schedule_that_sums_over_a_parallel_loop_is_rejected(monkeypatch):
    """The safety net under the placement rule: with the rule off, the same plan is refused
    with its reason, not built into a kernel that is right only on one thread."""
    from autofuse import schedule
    from autofuse.build import schedule_module

    w = _matmul_then_column_sums()
    monkeypatch.setattr(schedule, "_splits_reduction", lambda *_: False)
    plan = w.partition_plan(((0,),), True, "colsum", [{"epilogue_at": 0, "parallel": 1, "t0": 4}])
    with pytest.raises(ScheduleRejected, match="sum over a parallel loop"):
        schedule_module(w.graph(True), plan, LLVM)


def _computes_reference(w, plan, ex) -> bool:
    from autofuse.measure import Session

    acts, expected = w.check_data()
    return Session(ex, LLVM).check(w.runtime_inputs(plan.fold_params, acts), expected, w.space.rtol, w.space.atol)[0]


def test_a_build_reuses_the_kernels_it_shares_with_an_earlier_one(monkeypatch):
    """A tuning worker compiles each kernel once: a plan built again compiles nothing, a
    plan with one group's knob changed compiles that group's kernel alone, linking leaves
    the cached modules as they were, and every executable computes the reference."""
    from collections import OrderedDict
    from dataclasses import replace

    from autofuse import build as af_build

    monkeypatch.setattr(af_build, "_KERNELS", OrderedDict())
    w = get_workload("attention", tiny=True)
    g = w.graph(True)
    plan = w.reference_plan("default")
    first = build(g, plan, LLVM, reuse_kernels=True)
    kernels = len(af_build._KERNELS)
    assert kernels == len(plan.groups)
    cached = [lib for _, lib in af_build._KERNELS.values()]

    again = build(g, plan, LLVM, reuse_kernels=True)
    assert len(af_build._KERNELS) == kernels

    _, nest = group_anchor(g, tuple(sorted(g.index()[o] for o in plan.groups[-1])))
    choices = knob_space(nest)["unroll"]
    unroll = next(v for v in choices if v != choices[0])
    changed = replace(plan, schedules=plan.schedules[:-1] + ({"unroll": unroll},))
    other = build(g, changed, LLVM, reuse_kernels=True)
    assert len(af_build._KERNELS) == kernels + 1

    assert all(len(lib.imports) == 0 for lib in cached)
    for p, ex in ((plan, first), (plan, again), (changed, other)):
        assert _computes_reference(w, p, ex)


def test_the_kernel_cache_is_bounded_and_its_executables_outlive_it(monkeypatch):
    from collections import OrderedDict

    from autofuse import build as af_build

    monkeypatch.setattr(af_build, "_KERNELS", OrderedDict())
    monkeypatch.setattr(af_build, "KERNELS_KEPT", 1)
    w = get_workload("layernorm_residual", tiny=True)
    plan = w.reference_plan("unfused")
    ex = build(w.graph(True), plan, LLVM, reuse_kernels=True)
    assert len(plan.groups) > 1 and len(af_build._KERNELS) == 1
    assert _computes_reference(w, plan, ex)
