"""Probe: would a Winograd convolution in topi's NCHW layouts, scheduled by autofuse's generic
scheduler, beat the best direct convolution autofuse found?  (Issue 4's onnxruntime target on
conv_bn_relu and resnet_block; NOTES 39: no, 0.18-0.37x of its speed.)  Kept as the record of
that negative result: the Winograd autofuse searches (the ``winograd`` knob) is
``autofuse/winograd.py``, in layouts made for vectors (NOTES 40).

The conv2d of a space is legalized as Winograd F(m x m, 3 x 3) (topi's NCHW compute, the
weight transformed once at build time by FoldConstant); the rest of the graph as usual.
A plan on that graph (default knobs, ``--knobs``, the best of a ``--search``, or
``--hand``'s hand-written schedule) is built, checked against NumPy and timed, interleaved
with a direct plan (a plan JSON file, e.g.
``autofuse best conv_bn_relu --target llvm --db sqlite:///results/bench/bench.db > best.json``).

    TVM_NUM_THREADS=2 python benchmarks/winograd_probe.py conv_bn_relu best.json [--tile 4] [--rounds 5] \
        [--search 60 | --hand]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

from tvm import relax, te
from tvm.relax.transform.legalize_ops.nn import _nn_conv2d
from tvm.topi.nn.conv2d import _conv2d_winograd_nchw_impl
from tvm.topi.nn.winograd_util import winograd_transform_matrices

from autofuse.graph import default_partition, from_relax, lower
from autofuse.measure import TimingConfig
from autofuse.plan import Plan
from autofuse.relax_module import bind_params, space_to_relax
from autofuse.runner import evaluate_plan
from autofuse.target import parse_target
from autofuse.workload import Workload, get_workload


def weight_transform(w: te.Tensor, m: int) -> te.Tensor:
    """G w G^T per (ci, co), laid out (alpha, alpha, CI, CO) as topi's pre-computed path reads it."""
    co_n, ci_n, kh, kw = (int(x) for x in w.shape)
    alpha = m + kh - 1
    _, _, g = winograd_transform_matrices(m, kh, str(w.dtype))
    r_kh = te.reduce_axis((0, kh), "r_kh")
    r_kw = te.reduce_axis((0, kw), "r_kw")
    return te.compute((alpha, alpha, ci_n, co_n), lambda e, n, ci, co: te.sum(
        w[co, ci, r_kh, r_kw] * g[e, r_kh] * g[n, r_kw], axis=[r_kh, r_kw]), name="kernel_pack")


def winograd_legalize(m: int):
    """conv2d -> Winograd F(m x m, 3 x 3) where it is a plain 3x3 stride-1 NCHW convolution,
    TVM's own legalization elsewhere."""
    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        attrs = call.attrs
        x, w = call.args
        wshape = [int(s) for s in w.ty.shape]
        plain = (list(attrs.strides) == [1, 1] and list(attrs.dilation) == [1, 1] and int(attrs.groups) == 1
                 and wshape[2:] == [3, 3] and attrs.data_layout == "NCHW" and attrs.kernel_layout == "OIHW")
        if not plain:
            return _nn_conv2d(bb, call)
        packed = bb.emit_te(weight_transform, w, m, primfunc_name_hint="winograd_weight")
        pad = [int(p) for p in attrs.padding]
        return bb.call_te(_wino, x, packed, pad, m, primfunc_name_hint="conv2d_winograd")
    return legalize


def _wino(x: te.Tensor, packed: te.Tensor, pad: list[int], m: int) -> te.Tensor:
    return _conv2d_winograd_nchw_impl(x, packed, (1, 1), pad, (1, 1), str(x.dtype), m, pre_computed=True)


def winograd_workload(name: str, m: int) -> Workload:
    """The space's workload whose folded graph lowers its 3x3 convolutions as Winograd."""
    w = get_workload(name)
    fresh = Workload(w.space, w.tiny, w.params)
    mod = bind_params(space_to_relax(w.space), w.params)
    lowered = lower(mod, True, {"relax.nn.conv2d": winograd_legalize(m)})
    fresh._graphs[True] = from_relax(lowered, w.space.name, w.space.activations)  # the folded graph only
    return fresh


def search(w: Workload, start: Plan, target, trials: int) -> Plan:
    """A quick in-process TPE search of the Winograd graph's plans (no isolation: a probe)."""
    import optuna

    from autofuse.search import PlanSpace

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = PlanSpace(w)
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=1))
    study.enqueue_trial(space.params_of(start))
    cfg = TimingConfig(repeats=3, min_repeat_ms=20)
    plans: dict[int, Plan] = {}

    def objective(trial: optuna.Trial) -> float:
        plan, _ = space.suggest(trial)
        if not plan.fold_params:  # the unfolded graph is the direct one (only the folded one is Winograd)
            raise optuna.TrialPruned("direct")
        plans[trial.number] = plan
        try:
            res = evaluate_plan(w, plan, target, cfg)
        except Exception as e:  # a rejected schedule
            raise optuna.TrialPruned(str(e)[:100]) from None
        if res["status"] != "ok":
            raise optuna.TrialPruned(res["status"])
        print(f"  trial {trial.number}: {res['median_ms']:.3f} ms groups={len(plan.groups)}", file=sys.stderr)
        return res["median_ms"]

    study.optimize(objective, n_trials=trials)
    best = plans[study.best_trial.number]
    print("best winograd plan:", best.to_json(), file=sys.stderr)
    return best


def hand_schedule(graph: Any, plan: Plan, target: Any) -> Any:
    """A Winograd schedule written for F(2x2, 3x3) on AVX2, not searched: the transforms'
    small loops unrolled (their matrices are Select chains of the loop indices, which
    LLVM folds to constants only when unrolled) and vectorized over the tiles; the batched
    GEMM register-tiled 4 output channels x 16 tiles; the BN/ReLU epilogue inlined into one
    output loop.  Only a probe of what a dedicated schedule could reach."""
    from tvm import s_tir

    from autofuse.build import outline, partition_of

    fused = outline(graph, partition_of(graph, plan))
    sch = s_tir.Schedule(fused.mod)
    kernel = next(k for k in fused.kernels if "winograd" in k)
    sch.work_on(kernel)
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    for name in names:  # padding, tile gather and the transform matrices into their readers
        if name in ("data_pad", "input_tile", "A", "B"):
            sch.compute_inline(name)
    out = names[-1]
    for name in names[names.index("inverse") + 1:-1]:  # the output gather and BN ops into the ReLU
        sch.compute_inline(name)
    # data_pack[eps, nu, ci, p]: per (ci, 16 tiles), all 4 x 4 outputs from the 4 x 4 inputs
    dp = sch.get_sblock("data_pack")
    eps, nu, ci, p, ra, rb = sch.get_loops(dp)
    _unrolled_transform(sch, dp, ci, p, (eps, nu), (ra, rb))
    # bgemm[eps, nu, co, p] = sum_ci data_pack[eps, nu, ci, p] * kernel_pack[eps, nu, ci, co]
    bg = sch.get_sblock("bgemm")
    eps, nu, co, p, ci = sch.get_loops(bg)
    co_o, co_i = sch.split(co, [None, 4])
    p_o, p_i = sch.split(p, [None, 16])
    sch.reorder(eps, nu, co_o, p_o, ci, co_i, p_i)
    sch.parallel(sch.fuse(eps, nu))
    sch.unroll(co_i)
    sch.vectorize(p_i)
    sch.decompose_reduction(bg, ci)
    # inverse[co, p, vh, vw] from bgemm[.., co, p]: per (co, 16 tiles), unrolled
    inv = sch.get_sblock("inverse")
    co, p, vh, vw, ra, rb = sch.get_loops(inv)
    _unrolled_transform(sch, inv, co, p, (vh, vw), (ra, rb))
    # the output, BN and ReLU inlined: parallel over channels, vectorized along rows
    loops = sch.get_loops(sch.get_sblock(out))
    sch.parallel(sch.fuse(*loops[:2]))
    sch.vectorize(sch.split(loops[-1], [None, 8])[1])
    return sch.mod


def _unrolled_transform(sch: Any, block: Any, channel: Any, tiles: Any, small: tuple, reduced: tuple) -> None:
    """A transform block run per (channel, 16 tiles) in parallel over channels: its small
    output and reduction loops unrolled (constant matrix entries), the 16 tiles one vector."""
    outer, lanes = sch.split(tiles, [None, 16])
    sch.reorder(channel, outer, *small, *reduced, lanes)
    sch.parallel(channel)
    for loop in (*small, *reduced):
        sch.unroll(loop)
    sch.vectorize(lanes)
    sch.decompose_reduction(block, reduced[0])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("space")
    ap.add_argument("direct_plan")
    ap.add_argument("--tile", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--knobs", default="{}", help="JSON knob overrides for every Winograd group")
    ap.add_argument("--search", type=int, default=0, help="first tune the Winograd graph for this many TPE trials")
    ap.add_argument("--hand", action="store_true", help="time hand_schedule (F(2x2) only) instead of a plan's")
    args = ap.parse_args()
    target = parse_target("llvm")
    direct_w = get_workload(args.space)
    direct = Plan.from_json(open(args.direct_plan).read())
    wino_w = winograd_workload(args.space, args.tile)
    g = wino_w.graph(True)
    print("winograd graph ops:", [(op.name, op.func, op.kind) for op in g.ops], file=sys.stderr)
    part = default_partition(g)
    overrides = json.loads(args.knobs)
    wino = wino_w.partition_plan(part, True, "winograd", [dict(overrides) for _ in part])
    if args.search:
        wino = search(wino_w, wino, target, args.search)
    if args.hand:
        import autofuse.build

        generic = autofuse.build.schedule_module
        autofuse.build.schedule_module = lambda g, p, t: hand_schedule(g, p, t) if g is wino_w.graph(True) \
            else generic(g, p, t)
    print("winograd plan groups:", wino.groups, file=sys.stderr)
    cfg = TimingConfig(repeats=5, min_repeat_ms=50)
    times: dict[str, list[float]] = {"direct": [], "winograd": []}
    for r in range(args.rounds):
        for label, w, plan in ((("direct", direct_w, direct), ("winograd", wino_w, wino))[::1 if r % 2 == 0 else -1]):
            res = evaluate_plan(w, plan, target, cfg)
            if res["status"] != "ok":
                print(f"{label}: {res['status']} {res.get('error', '')}")
                return
            times[label].append(res["median_ms"])
    d, wn = statistics.median(times["direct"]), statistics.median(times["winograd"])
    print(f"direct   {d:.3f} ms  {[round(t, 3) for t in times['direct']]}")
    print(f"winograd {wn:.3f} ms  {[round(t, 3) for t in times['winograd']]}  (F({args.tile}x{args.tile},3x3), knobs {overrides})")
    print(f"direct / winograd = {d / wn:.2f}x")


if __name__ == "__main__":
    main()
