"""TVM's own tuner as a peer: FuseOps' partition, each kernel tuned by MetaSchedule.

The weights are marked layout-free (``AttachAttrLayoutFreeBuffers``, as TVM's
``static_shape_tuning_pipeline`` does with ``cpu_weight_prepack``), so MetaSchedule may
pick a packed weight layout (its ``RewriteLayout`` postprocessor); the repacking then runs
once at build time (``SplitLayoutRewritePreproc`` + ``FoldConstant``), as autofuse's
``pack_weight`` does.  MetaSchedule has no wall-clock budget, so it runs in a child process that is
killed when the budget is spent; its JSON database keeps every record committed
so far, and the parent applies the best ones.  The builder skips the
re-import of ``tvm.s_tir.tensor_intrin`` per worker (18 s each on this machine)
that would otherwise eat the budget.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import time
from pathlib import Path
from typing import Any, Callable

import tvm
from tvm import relax

from autofuse.target import Target


def fused_module(graph_mod: tvm.IRModule) -> tvm.IRModule:
    """TVM's default fusion of an already legalized + annotated module, weights marked layout-free."""
    seq = [relax.transform.FuseOps(fuse_opt_level=2), relax.transform.FuseTIR(), relax.transform.DeadCodeElimination(),
           relax.transform.AttachAttrLayoutFreeBuffers()]
    return tvm.transform.Sequential(seq)(graph_mod)


def _fast_build(mod: tvm.IRModule, target: tvm.target.Target, _params: Any) -> Any:
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    return tvm_build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)


def _ms_target(spec: dict[str, Any]) -> tvm.target.Target:
    """MetaSchedule insists on knowing the core count; give it the threads kernels will use."""
    from autofuse.target import num_threads

    return tvm.target.Target({**spec, "num-cores": spec.get("num-cores", num_threads())})


def _tune_child(space: str, tiny: bool, target_json: str, work_dir: str, seed: int) -> None:
    # MetaSchedule logs to stdout: keep it out of the parent's output (e.g. bench --json)
    log = os.open(os.path.join(work_dir, "tuner.out"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    from tvm.s_tir import meta_schedule as ms

    from autofuse.workload import get_workload

    w = get_workload(space, tiny)
    mod = fused_module(w.graph(True).mod)
    target = _ms_target(json.loads(target_json))
    builder = ms.builder.LocalBuilder(f_build=_fast_build, max_workers=max(1, (os.cpu_count() or 2)), timeout_sec=60)
    runner = ms.runner.LocalRunner(evaluator_config=ms.runner.EvaluatorConfig(
        number=3, repeat=1, min_repeat_ms=20, enable_cpu_cache_flush=False))
    ms.relax_integration.tune_relax(
        mod, params={}, target=target, work_dir=work_dir, max_trials_global=100_000, num_trials_per_iter=16,
        builder=builder, runner=runner, database=ms.database.JSONDatabase(work_dir=work_dir), seed=seed)


def tune(space: str, tiny: bool, target: Target, budget_s: float, work_dir: Path, seed: int = 0,
         poll_s: float = 5.0, on_poll: Callable[[int, float | None], None] | None = None,
         ) -> tuple[list[tuple[float, float]], dict[str, Any]]:
    """Run MetaSchedule for ``budget_s`` wall seconds; returns (curve, info).

    ``curve``: (seconds since start, sum over tasks of the best per-task time so far, ms),
    from the moment every task has a record -- an estimate from MetaSchedule's own
    records, used for the search-efficiency chart.  ``on_poll(records, estimate_ms)`` is
    called at every poll (progress for the user).
    """
    work_dir.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")
    proc = ctx.Process(target=_tune_child, args=(space, tiny, target.spec_json, str(work_dir), seed))
    t0 = time.time()
    proc.start()
    curve: list[tuple[float, float]] = []
    while time.time() - t0 < budget_s and proc.is_alive():
        time.sleep(min(poll_s, max(0.1, budget_s - (time.time() - t0))))
        est = _estimate_ms(work_dir)
        if est is not None:
            curve.append((time.time() - t0, est))
        if on_poll is not None:
            on_poll(_count_records(work_dir), est)
    if proc.is_alive():
        _kill_tree(proc.pid)
    proc.join(10)
    return curve, {"records": _count_records(work_dir), "wall_s": time.time() - t0, "exitcode": proc.exitcode}


def _kill_tree(pid: int) -> None:
    """The tuner and its builder/runner popen workers."""
    import psutil

    try:
        parent = psutil.Process(pid)
        procs = parent.children(recursive=True) + [parent]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass


def _records(work_dir: Path) -> list[tuple[int, float]]:
    path = work_dir / "database_tuning_record.json"
    out = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            wid, rec = json.loads(line)
            secs = rec[1]
            if secs:
                out.append((int(wid), sum(float(s) for s in secs) / len(secs)))
        except (ValueError, TypeError, IndexError):
            continue  # a line being written when the tuner was killed
    return out


def _count_records(work_dir: Path) -> int:
    return len(_records(work_dir))


_FAILED_S = 1e9  # MetaSchedule records a candidate that failed to build or run as 1e10 s


def _estimate_ms(work_dir: Path) -> float | None:
    """Sum of every task's best time, once every task has a working record (a partial sum
    would grow as tasks get their first record, which is no latency at all)."""
    best: dict[int, float] = {}
    for wid, secs in _records(work_dir):
        if secs < _FAILED_S:
            best[wid] = min(secs, best.get(wid, float("inf")))
    path = work_dir / "database_workload.json"
    tasks = len(path.read_text().splitlines()) if path.exists() else 0
    return sum(best.values()) * 1e3 if best and len(best) >= tasks else None


def apply_best(graph_mod: tvm.IRModule, target: Target, work_dir: Path) -> tuple[tvm.IRModule, int, int]:
    """FuseOps' module with each kernel's best MetaSchedule schedule; (module, tuned, total kernels)."""
    from tvm.s_tir import meta_schedule as ms

    from autofuse.build import prepack_weights

    mod = fused_module(graph_mod)
    db = ms.database.JSONDatabase(work_dir=str(work_dir))
    with _ms_target(target.spec), db:
        tuned = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(mod)
    kernels = [gv for gv, f in tuned.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    scheduled = sum(1 for gv in kernels if tuned[gv].attrs and "tirx.is_scheduled" in tuned[gv].attrs)
    return prepack_weights(tuned), scheduled, len(kernels)
