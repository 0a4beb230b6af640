"""``autofuse bench``: autofuse's best plan against its peers, measured side by side.

For each space, in one process, on the same inputs: every column is built (or
tuned for the same wall-clock budget), checked against the NumPy reference, then
timed in interleaved rounds so that machine noise hits all columns alike.
Reported: median per column, spread (max-min over all samples), ratios to autofuse,
and the roofline floor from this machine's measured peak FLOP/s and bandwidth.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from autofuse.measure import Session, TimingConfig, compare
from autofuse.target import Target, num_threads
from autofuse.workload import Workload, get_workload

COLUMNS = ("unfused", "tvm-default", "tvm-metaschedule", "onnxruntime", "numpy", "autofuse")


@dataclass
class Column:
    name: str
    correct: bool | None = None
    error: str | None = None
    samples_ms: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def median_ms(self) -> float | None:
        return statistics.median(self.samples_ms) if self.samples_ms else None

    @property
    def spread_ms(self) -> float | None:
        return (max(self.samples_ms) - min(self.samples_ms)) if self.samples_ms else None

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "correct": self.correct, "error": self.error, "median_ms": self.median_ms,
                "spread_ms": self.spread_ms, "samples": len(self.samples_ms), "note": self.note}


# ------------------------------------------------------------------ machine peaks
def machine_peaks(seconds: float = 1.0) -> dict[str, float]:
    """Peak FLOP/s from a large SGEMM through NumPy's BLAS, bandwidth from a large copy."""
    n = 2048
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
    a @ b
    times = []
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end or len(times) < 3:
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    flops = 2 * n**3 / min(times)
    source = "numpy"
    try:  # onnxruntime's MLAS GEMM is often the fastest library present
        import onnx.helper as h
        from onnx import TensorProto

        from autofuse.peers import onnxruntime_session

        g = h.make_graph([h.make_node("MatMul", ["a", "b"], ["c"])], "mm",
                         [h.make_tensor_value_info(x, TensorProto.FLOAT, [n, n]) for x in "ab"],
                         [h.make_tensor_value_info("c", TensorProto.FLOAT, [n, n])])
        sess = onnxruntime_session(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), num_threads())
        feed = {"a": a, "b": b}
        sess.run(None, feed)
        ort_best = min(_time_python(lambda: sess.run(None, feed), 1.0, 5)) / 1e3
        if 2 * n**3 / ort_best > flops:
            flops, source = 2 * n**3 / ort_best, "onnxruntime"
    except ImportError:
        pass
    # Copy bandwidth with as many threads as kernels use (one thread cannot saturate DRAM):
    # each thread copies its own slice; np.copyto releases the GIL.
    from concurrent.futures import ThreadPoolExecutor

    threads = num_threads()
    src = np.ones(64 << 20, dtype=np.float32)  # 256 MiB
    dst = np.empty_like(src)
    step = src.size // threads
    chunks = [(dst[i * step:(i + 1) * step], src[i * step:(i + 1) * step]) for i in range(threads)]
    ctimes = []
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(6):
            t = time.perf_counter()
            list(pool.map(lambda c: np.copyto(*c), chunks))
            ctimes.append(time.perf_counter() - t)
    bw = 2 * step * threads * src.itemsize / min(ctimes[1:])
    bw_source = "numpy copy"
    tvm_bw = _tvm_copy_bandwidth(src.size, threads)
    if tvm_bw > bw:
        bw, bw_source = tvm_bw, "TVM parallel vectorized copy"
    return {"peak_gflops": flops / 1e9, "peak_source": source, "bandwidth_gbs": bw / 1e9, "bandwidth_source": bw_source,
            "copy_threads": threads}


def _tvm_copy_bandwidth(n: int, threads: int) -> float:
    """Bytes read + written per second by a parallel, vectorized TVM copy of n floats."""
    import tvm
    from tvm import s_tir, te

    a = te.placeholder((n,), "float32", name="A")
    b = te.compute((n,), lambda i: a[i], name="B")
    sch = s_tir.Schedule(te.create_prim_func([a, b]))
    (i,) = sch.get_loops("B")
    outer, inner = sch.split(i, [threads * 64, None])
    sch.parallel(outer)
    _, vec = sch.split(inner, [None, 16])
    sch.vectorize(vec)
    rt = tvm.compile(sch.mod, tvm.target.Target({"kind": "llvm"})).jit()
    ta = tvm.runtime.tensor(np.ones(n, "float32"))
    tb = tvm.runtime.tensor(np.zeros(n, "float32"))
    r = rt.time_evaluator("main", tvm.cpu(), number=3, repeat=5)(ta, tb)
    return 2 * n * 4 / min(r.results)


def work_of(w: Workload) -> dict[str, float]:
    """FLOPs of the computation and the bytes a perfectly fused kernel must move."""
    from autofuse.schedule import block_nests

    g = w.graph(True)
    flops = 0.0
    for op in g.ops:
        for _, nest in block_nests(g.mod[op.func]):
            spatial = math.prod(nest.spatial) if nest.spatial else 1
            flops += 2.0 * spatial * math.prod(nest.reduce) if nest.reduce else spatial
    nbytes = sum(4 * math.prod(t.shape) for t in g.inputs)  # activations
    nbytes += sum(4 * math.prod(shape) for shape, _ in g.consts)  # parameters (folded)
    nbytes += 4 * math.prod(g.ops[g.index()[g.output]].shape)  # output
    return {"flops": flops, "bytes": float(nbytes)}


# ------------------------------------------------------------------ timing
def _time_python(fn: Callable[[], Any], min_ms: float, repeats: int) -> list[float]:
    fn()
    out = []
    for _ in range(repeats):
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            if (time.perf_counter() - t0) * 1e3 >= min_ms:
                break
        out.append((time.perf_counter() - t0) * 1e3 / n)
    return out


class _Runnable:
    """One column, ready to check and time."""

    def __init__(self, column: Column, timer: Callable[[int, float], list[float]], output: Callable[[], np.ndarray]):
        self.column, self.timer, self.output = column, timer, output


def _vm_runnable(name: str, ex: Any, w: Workload, fold: bool, target: Target, note: str = "") -> _Runnable:
    acts, _ = w.check_data()
    session = Session(ex, target)
    inputs = w.runtime_inputs(fold, acts)
    args = session.to_device(inputs)

    def timer(repeats: int, min_ms: float) -> list[float]:
        return session.time(inputs, TimingConfig(repeats=repeats, min_repeat_ms=int(min_ms), warmup=1))

    return _Runnable(Column(name, note=note), timer, lambda: session(args))


PROGRESS_EVERY_S = 60.0  # a tuning phase's progress line at most this often


class _Ticker:
    """A progress line at most once a minute during a long tuning phase: how far into the
    budget, and what the tuner has found so far."""

    def __init__(self, progress: Callable[[str], None], label: str, budget_s: float):
        self.progress, self.label, self.budget_s, self.every_s = progress, label, budget_s, PROGRESS_EVERY_S
        self.t0 = self.last = time.time()

    def __call__(self, found: str) -> None:
        now = time.time()
        if now - self.last >= self.every_s:
            self.last = now
            self.progress(f"{self.label}: {_mmss(now - self.t0)} of {_mmss(self.budget_s)}, {found}")

    def study_update(self, study: Any) -> None:
        """For a tuning job's per-trial callback (an Optuna study)."""
        if time.time() - self.last < self.every_s:
            return
        done = study.get_trials(deepcopy=False)
        ok = [t.value for t in done if t.value is not None]
        self(f"{len(done)} trials, best {min(ok):.4f} ms" if ok else f"{len(done)} trials, none verified yet")


def _mmss(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


def _job_ticker(ticker: _Ticker) -> Callable[..., Any]:
    """``run_job``'s progress factory: a context manager yielding the per-trial update."""
    from contextlib import nullcontext

    return lambda _cfg, _before: nullcontext(ticker.study_update)


def _build_columns(w: Workload, target: Target, budget_s: float, out_dir: Path, progress: Callable[[str], None],
                   seed: int, include: tuple[str, ...], compare_random: bool = False) -> tuple[list[_Runnable], dict[str, Any]]:
    import tvm
    from tvm import relax

    from autofuse import metaschedule
    from autofuse.build import build
    from autofuse.peers import has_onnx, onnx_model, onnxruntime_session
    from autofuse.relax_module import bind_params, space_to_relax

    acts, expected = w.check_data()
    cols: list[_Runnable] = []
    extra: dict[str, Any] = {}
    source = getattr(w.space, "source", None) or {}
    model_path = source.get("path")  # an imported ONNX model rather than a hand-written space
    # what a child process (model tune, MetaSchedule) loads the workload by
    spec = w.space.name
    if model_path:
        from autofuse.onnx_import import model_spec

        spec = model_spec(model_path, source.get("shapes"))

    def guarded(name: str, make: Callable[[], _Runnable | None]) -> None:
        if name not in include:
            return
        progress(f"{w.space.name}: preparing {name}")
        try:
            r = make()
        except Exception as e:  # a peer that cannot run is reported, not fatal
            r = _Runnable(Column(name, correct=False, error=f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:200]}"),
                          lambda *_: [], lambda: None)
        if r is not None:
            cols.append(r)

    guarded("unfused", lambda: _vm_runnable("unfused", build(w.graph(True), w.reference_plan("unfused"), target), w, True, target))

    def tvm_default() -> _Runnable:
        mod = bind_params(space_to_relax(w.space), w.params)
        ex = tvm.compile(mod, target.tvm(), relax_pipeline=relax.get_default_pipeline(target.tvm()))
        vm = relax.VirtualMachine(ex, tvm.cpu())
        args = [tvm.runtime.tensor(acts[t.name]) for t in w.space.activations]
        vm.save_function("main", "main_timed", *args)

        def timer(repeats: int, min_ms: float) -> list[float]:
            r = vm.time_evaluator("main_timed", tvm.cpu(), number=1, repeat=repeats, min_repeat_ms=int(min_ms))()
            return [x * 1e3 for x in r.results]

        return _Runnable(Column("tvm-default", note="FuseOps, no schedule"), timer, lambda: vm["main"](*args).numpy())

    guarded("tvm-default", tvm_default)

    db_url = f"sqlite:///{out_dir / 'bench.db'}"
    candidate_timeout = min(120.0, max(20.0, budget_s / 6))  # one slow compile can't eat the budget

    def best_plan_runnable(note: str) -> _Runnable:
        """autofuse's column: the best verified plan the tuning stored, built here."""
        from autofuse.db import PlanDB
        from autofuse.plan import Plan

        best = PlanDB(db_url, create=False, readonly=True).best_plan(w.hash, target.spec)
        if best is None:
            raise RuntimeError("autofuse found no verified plan in the budget")
        plan = Plan.from_json(best.plan_json)
        ex = build(w.graph(plan.fold_params), plan, target)
        return _vm_runnable("autofuse", ex, w, plan.fold_params, target,
                            note=f"plan {plan.hash} ({best.label}), {len(plan.groups)} kernels, {note}")

    def autofuse_model_col() -> _Runnable:
        """A whole model: regions tuned within the budget, their best plans stitched."""
        from autofuse.model_job import ModelTuneConfig, tune_model
        ticker = _Ticker(progress, f"{w.space.name}: autofuse", budget_s)
        result = tune_model(ModelTuneConfig(model=spec, timeout_s=budget_s,
                                            db_url=db_url, seed=seed, candidate_timeout_s=candidate_timeout),
                            progress=lambda i: ticker(
                                f"{i['trial']} region trials, {i['regions_untried']} regions untried, model estimate "
                                + ("-" if i["model_estimate_ms"] is None else f"{i['model_estimate_ms']:.4f} ms")))
        extra["autofuse_model_job"] = {k: v for k, v in result.items() if k not in ("regions_detail", "curve")}
        extra["autofuse_curve"] = result["curve"]  # sum over regions of instances x best time
        return best_plan_runnable(f"{result['trials']} region trials")

    def autofuse_col() -> _Runnable:
        from autofuse.job import JobConfig, run_job

        if model_path:
            return autofuse_model_col()
        cfg = JobConfig(space=w.space.name, target=target.spec_json, tiny=w.tiny, trials=None, timeout_s=budget_s,
                        db_url=db_url, study=f"bench-{w.space.name}-{int(time.time())}", seed=seed,
                        candidate_timeout_s=candidate_timeout, progress=False, log_dir=str(out_dir), final_rounds=2)
        result = run_job(cfg, progress_factory=_job_ticker(_Ticker(progress, f"{w.space.name}: autofuse", budget_s)))
        extra["autofuse_job"] = result.as_dict()
        extra["autofuse_curve"], guided_by_measured = _search_curves(db_url, result.study)
        runnable = best_plan_runnable(f"{result.trials_this_job} trials")  # before random search adds plans
        if compare_random:  # the same budget with random sampling: is the guided search earning its keep?
            rcfg = JobConfig(**{**cfg.__dict__, "study": cfg.study + "-random", "sampler": "random", "top_k": 1, "warm_start": False,
                                "final_rounds": 1})
            rres = run_job(rcfg, progress_factory=_job_ticker(_Ticker(progress, f"{w.space.name}: random search", budget_s)))
            extra["random_curve"], random_by_measured = _search_curves(db_url, rres.study)
            extra["random_job"] = {"trials": rres.trials_this_job, "measured": rres.measured, "best": rres.best,
                                   "study": rres.study}
            extra.update(search_vs_random(guided_by_measured, random_by_measured))
        return runnable

    def metaschedule_col() -> _Runnable:
        work = out_dir / f"ms-{w.space.name}"
        ticker = _Ticker(progress, f"{w.space.name}: tvm-metaschedule", budget_s)
        curve, info = metaschedule.tune(spec, w.tiny, target, budget_s, work, seed=seed, on_poll=lambda n, est: ticker(
            f"{n} records, " + ("not every kernel tuned yet" if est is None else f"sum of kernel bests {est:.4f} ms")))
        extra["metaschedule_curve"] = curve
        extra["metaschedule"] = info
        mod, tuned, total = metaschedule.apply_best(w.graph(True).mod, target, work)
        ex = tvm.compile(mod, target.tvm())
        return _vm_runnable("tvm-metaschedule", ex, w, True, target,
                            note=f"{info['records']} records, {tuned}/{total} kernels tuned")

    guarded("tvm-metaschedule", metaschedule_col)
    guarded("autofuse", autofuse_col)

    def ort_col() -> _Runnable | None:
        if model_path:  # the model file itself, with the weights the workload uses
            import onnx

            ref = w.space.reference
            sess = onnxruntime_session(onnx.load_from_string(ref.model_bytes), num_threads())
            feed = {o: np.asarray(acts[r], dtype=np.float32) for r, o in ref.relax_to_onnx.items()}
        elif has_onnx(w.space.name):
            sess = onnxruntime_session(onnx_model(w.space, w.params, expected.shape), num_threads())
            feed = {k: v for k, v in acts.items()}
        else:
            return None
        return _Runnable(Column("onnxruntime", note=f"{num_threads()} threads, ORT_ENABLE_ALL"),
                         lambda r, m: _time_python(lambda: sess.run(None, feed), m, r),
                         lambda: sess.run(None, feed)[0])

    guarded("onnxruntime", ort_col)
    ref_inputs = {**acts, **w.params}
    if model_path:  # a model's reference is onnxruntime itself: no NumPy column
        return cols, extra
    guarded("numpy", lambda: _Runnable(Column("numpy", note="the reference (float64 where it casts)"),
                                       lambda r, m: _time_python(lambda: w.space.reference(**ref_inputs), m, r),
                                       lambda: w.space.reference(**ref_inputs)))
    return cols, extra


def _search_curves(db_url: str, study_name: str) -> tuple[list[tuple[float, float]], list[tuple[int, float]]]:
    """A study's best-so-far ms, in the order its trials finished, against two clocks: seconds
    since the first trial started, and candidates measured so far.

    Measured: the candidates built and run (timed out and failed ones too: their time was
    spent), as tuners count measurement trials. Not measured: a plan suggested again (its
    earlier result is reused) and one the cost model skipped; both take milliseconds, and
    the guided search makes many more of them than random sampling does."""
    import optuna

    study = optuna.load_study(study_name=study_name, storage=db_url)
    trials = sorted((t for t in study.trials if t.datetime_complete), key=lambda t: t.datetime_complete)
    if not trials:
        return [], []
    t0 = min(t.datetime_start for t in trials)
    best, measured, by_time, by_measured = math.inf, 0, [], []
    for t in trials:
        built = "seconds" in t.user_attrs  # not a repeat or a pre-screened plan
        measured += built
        if t.state == optuna.trial.TrialState.COMPLETE and t.value < best:
            best = t.value
        if best < math.inf:
            by_time.append(((t.datetime_complete - t0).total_seconds(), best))
            if built:
                by_measured.append((measured, best))
    return by_time, by_measured


def best_at(curve: list[tuple[int, float]] | list[list[float]], n: int) -> float | None:
    """The best-so-far after ``n`` measured candidates (None before the first verified plan)."""
    best = None
    for k, v in curve:
        if k > n:
            break
        best = v
    return best


def search_vs_random(guided: list[tuple[int, float]], rand: list[tuple[int, float]]) -> dict[str, Any]:
    """Guided search (TPE, mutations, cost model) against random sampling of the same space,
    both from the same reference and seed plans, given their best-so-far per candidates
    measured: the best each had after the same number of measured candidates (the smaller
    of the two counts), and at the end of the same wall-clock budget."""
    out: dict[str, Any] = {"autofuse_trial_curve": guided, "random_trial_curve": rand}
    if guided and rand:
        n = min(guided[-1][0], rand[-1][0])
        g, r = best_at(guided, n), best_at(rand, n)
        out["search_vs_random"] = {
            "equal_trials": n, "guided_ms": g, "random_ms": r,
            "random_over_guided": (r / g) if g and r else None,
            "guided_trials": guided[-1][0], "random_trials": rand[-1][0],
            "same_budget_random_over_guided": rand[-1][1] / guided[-1][1]}
    return out


def bench_space(name: str, target: Target, budget_s: float, out_dir: Path, *, tiny: bool = False, rounds: int = 5,
                repeats: int = 3, min_repeat_ms: float = 50, seed: int = 0, peaks: dict[str, float] | None = None,
                include: tuple[str, ...] = COLUMNS, progress: Callable[[str], None] = lambda s: None,
                compare_random: bool = False) -> dict[str, Any]:
    w = get_workload(name, tiny)
    _, expected = w.check_data()
    runnables, extra = _build_columns(w, target, budget_s, out_dir, progress, seed, include, compare_random)
    for r in runnables:  # correctness first: a wrong column is reported, never timed
        if r.column.error:
            continue
        try:
            out = r.output()
            out = np.asarray(out.numpy() if hasattr(out, "numpy") else out)
            r.column.correct, err = compare(out, expected, w.space.rtol, w.space.atol)
            if not r.column.correct:
                r.column.error = f"wrong result (relative error {err:.3g})"
        except Exception as e:
            r.column.correct, r.column.error = False, f"{type(e).__name__}: {e}"
    progress(f"{name}: timing {len(runnables)} columns, {rounds} interleaved rounds")
    for _ in range(rounds):
        for r in runnables:
            if r.column.correct:
                r.column.samples_ms.extend(r.timer(repeats, min_repeat_ms))
    work = work_of(w)
    result: dict[str, Any] = {"space": name, "tiny": tiny, "workload": w.hash, "budget_s": budget_s,
                              "columns": {r.column.name: r.column.as_dict() for r in runnables}, **work, **extra}
    if peaks:
        floor_ms = max(work["flops"] / (peaks["peak_gflops"] * 1e9), work["bytes"] / (peaks["bandwidth_gbs"] * 1e9)) * 1e3
        result["roofline_ms"] = floor_ms
    af = result["columns"].get("autofuse", {}).get("median_ms")
    if af:
        result["ratios_vs_autofuse"] = {k: (c["median_ms"] / af if c["median_ms"] else None)
                                        for k, c in result["columns"].items()}
        if peaks:
            result["autofuse_over_roofline"] = af / result["roofline_ms"]
        curve = extra.get("autofuse_curve") or []
        if curve:
            final = curve[-1][1]
            hit = next((t for t, v in curve if v <= final / 0.95), None)
            result["autofuse_95pct_at_s"] = hit
    return result


def _clear_scratch(out_dir: Path) -> None:
    """Each bench tunes from scratch: an earlier run's plans (bench.db) or MetaSchedule records
    (ms-*) would otherwise warm-start this one and its budget would not be the budget."""
    import shutil

    for f in out_dir.glob("bench.db*"):
        f.unlink()
    for d in out_dir.glob("ms-*"):
        if d.is_dir():
            shutil.rmtree(d)


class BenchAppendError(Exception):
    """``--append`` onto a report measured under other settings (budget, target, shapes)."""


def _previous_report(out_dir: Path, target: Target, budget_s: float, tiny: bool) -> dict[str, Any] | None:
    """The report ``--append`` adds to, checked to be comparable with this run."""
    path = out_dir / "bench.json"
    if not path.exists():
        return None
    try:
        prev = json.loads(path.read_text())
        prev_budget, prev_target = float(prev["budget_s"]), prev["target"]
        prev_tiny = any(r.get("tiny") for r in prev["spaces"])
    except (ValueError, KeyError, TypeError) as e:
        raise BenchAppendError(f"--append: {path} is not a bench report ({type(e).__name__}: {e})") from None
    if prev_budget != budget_s:
        raise BenchAppendError(f"--append: {path} was measured with a {prev_budget:.0f} s budget, this run has "
                               f"{budget_s:.0f} s; use the same --budget or another --output")
    if prev_target != target.spec or prev_tiny != tiny:
        raise BenchAppendError(f"--append: {path} was measured for another target or shapes; use another --output")
    return prev


def run_bench(spaces: list[str], target: Target, budget_s: float, out_dir: Path, *, tiny: bool = False,
              rounds: int = 5, repeats: int = 3, min_repeat_ms: float = 50, seed: int = 0,
              include: tuple[str, ...] = COLUMNS, progress: Callable[[str], None] = lambda s: None,
              compare_random: bool = False, append: bool = False) -> dict[str, Any]:
    """Bench ``spaces`` and write the report.  ``append``: keep the spaces of the report
    already in ``out_dir`` that this run does not measure (a long bench split over several
    sessions); each space keeps the date and machine peaks of the run that measured it."""
    import tvm

    out_dir.mkdir(parents=True, exist_ok=True)
    prev = _previous_report(out_dir, target, budget_s, tiny) if append else None
    _clear_scratch(out_dir)
    progress("measuring machine peaks (SGEMM, copy)")
    peaks = machine_peaks()
    date = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    results = []
    for s in spaces:
        r = bench_space(s, target, budget_s, out_dir, tiny=tiny, rounds=rounds, repeats=repeats,
                        min_repeat_ms=min_repeat_ms, seed=seed, peaks=peaks, include=include, progress=progress,
                        compare_random=compare_random)
        results.append({**r, "date": date})
    runs = [{"date": date, "spaces": list(spaces), "peaks": peaks}]
    if prev is not None:
        kept = [r for r in prev["spaces"] if r["space"] not in spaces]
        results = kept + results
        runs = [{**run, "spaces": [x for x in run["spaces"] if x not in spaces]} for run in _runs(prev)]
        runs = [run for run in runs if run["spaces"]] + [{"date": date, "spaces": list(spaces), "peaks": peaks}]
    report = {"date": date, "target": target.spec, "threads": num_threads(),
              "tvm_version": tvm.__version__, "peaks": peaks, "budget_s": budget_s, "rounds": rounds,
              "repeats": repeats, "min_repeat_ms": min_repeat_ms, "runs": runs, "spaces": results}
    geo = {}
    for col in COLUMNS:
        ratios = [r.get("ratios_vs_autofuse", {}).get(col) for r in results]
        ratios = [x for x in ratios if x]
        if ratios:
            geo[col] = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
    report["geomean_speedup_of_autofuse"] = geo
    path = out_dir / "bench.json"
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=".bench.", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(report, f, indent=1, default=float)
    os.replace(tmp, path)
    report["json"] = str(path)
    report["charts"] = plot_bench(report, out_dir)
    (out_dir / "bench.md").write_text(markdown_report(report))
    return report


def plot_bench(report: dict[str, Any], out_dir: Path) -> list[str]:
    """The report's charts: speedup of autofuse over each peer per space; best-so-far vs wall
    time (autofuse vs MetaSchedule); with ``--compare-random``, best-so-far vs trials."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    spaces = [Path(r["space"]).stem for r in report["spaces"]]  # a model by its file's name
    peers = [c for c in COLUMNS if c != "autofuse"
             and any((r.get("ratios_vs_autofuse") or {}).get(c) for r in report["spaces"])]
    if peers:  # none with --columns autofuse alone
        paths.append(_plot_speedups(report, spaces, peers, out_dir / "bench_speedup.png", plt))
    paths.append(_plot_search(report["spaces"], out_dir / "bench_search.png", plt))
    compared = [r for r in report["spaces"] if r.get("random_trial_curve") and r.get("autofuse_trial_curve")]
    if compared:
        paths.append(_plot_trials(compared, out_dir / "bench_trials.png", plt))
    return paths


def _plot_speedups(report: dict[str, Any], spaces: list[str], peers: list[str], path: Path, plt: Any) -> str:
    """Per space, one bar a peer: peer time / autofuse time, log scale."""
    fig, ax = plt.subplots(figsize=(max(7, 1.5 * len(spaces) + 2), 4.2))
    width = 0.8 / len(peers)
    for i, peer in enumerate(peers):
        vals = [(r.get("ratios_vs_autofuse") or {}).get(peer) or 0 for r in report["spaces"]]
        ax.bar([x + i * width for x in range(len(spaces))], vals, width, label=peer)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_yscale("log")
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(spaces))], spaces, rotation=20, ha="right")
    ax.set_ylabel("peer time / autofuse time (log)")
    ax.set_title(f"autofuse speedup over peers (>1: autofuse faster)\n{report['date']}, "
                 f"tuning budget {report['budget_s']:.0f} s", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def _plot_search(results: list[dict[str, Any]], path: Path, plt: Any) -> str:
    """Best-so-far against wall time: autofuse (and random search) vs MetaSchedule."""
    fig, axes = plt.subplots(1, len(results), figsize=(3.2 * len(results), 3), squeeze=False)
    for ax, r in zip(axes[0], results):
        model = "autofuse_model_job" in r
        for key, label in (("autofuse_curve", "autofuse (sum of region bests)" if model else "autofuse TPE (measured)"),
                           ("random_curve", "autofuse random (measured)"),
                           ("metaschedule_curve", "MetaSchedule (sum of task bests)")):
            curve = [(t, v) for t, v in r.get(key) or [] if v < 1e9]  # no failed-task sentinels
            if curve:
                ax.step([t for t, _ in curve], [v for _, v in curve], where="post", label=label)
        ax.set_title(Path(r["space"]).stem, fontsize=9)
        ax.set_xlabel("wall s")
        ax.set_yscale("log")
        if ax.lines:
            ax.legend(fontsize=6)
    return _save_panels(fig, axes, path, plt)


def _save_panels(fig: Any, axes: Any, path: Path, plt: Any) -> str:
    """A row of best-so-far panels, written as PNG."""
    axes[0][0].set_ylabel("best so far (ms)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def _plot_trials(results: list[dict[str, Any]], path: Path, plt: Any) -> str:
    """Best-so-far against candidates measured: guided search and random search of the same space."""
    fig, axes = plt.subplots(1, len(results), figsize=(3.2 * len(results), 3), squeeze=False)
    for ax, r in zip(axes[0], results):
        for key, label in (("autofuse_trial_curve", "autofuse (TPE + mutations + cost model)"),
                           ("random_trial_curve", "random search")):
            curve = r[key]
            ax.step([n for n, _ in curve], [v for _, v in curve], where="post", label=label)
        n = (r.get("search_vs_random") or {}).get("equal_trials")
        if n:
            ax.axvline(n, color="grey", lw=0.6, ls=":")
        ax.set_title(Path(r["space"]).stem, fontsize=9)
        ax.set_xlabel("candidates measured")
        ax.set_yscale("log")
        ax.legend(fontsize=6)
    return _save_panels(fig, axes, path, plt)


def cell(result: dict[str, Any], column: str, *, markdown: bool) -> str:
    """One table cell: median (spread) and the peer/autofuse ratio, or why the column failed."""
    col = result["columns"].get(column)
    if not col:
        return "n/a"
    if col["median_ms"] is None:
        why = (col["error"] or "failed")[:50]
        return f"failed: {why}" if markdown else f"[red]{why}[/]"
    text = f"{col['median_ms']:.3f} (±{col['spread_ms']:.3f})"
    ratio = (result.get("ratios_vs_autofuse") or {}).get(column)
    if ratio and column != "autofuse":
        text += f" **{ratio:.2f}x**" if markdown else f" ({ratio:.2f}×)"
    return text


def random_cell(cmp: dict[str, Any] | None) -> str:
    """``random ms / guided ms`` at equal trials and at the end of the same budget."""
    if not cmp or not cmp.get("random_over_guided"):
        return ""
    return (f"{cmp['random_over_guided']:.2f}x at {cmp['equal_trials']} measured; "
            f"{cmp['same_budget_random_over_guided']:.2f}x at the budget "
            f"({cmp['random_trials']} vs {cmp['guided_trials']} measured)")


def _runs(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs that measured the report's spaces (one, for a report from before ``--append``)."""
    return report.get("runs") or [{"date": report["date"], "spaces": [r["space"] for r in report["spaces"]],
                                   "peaks": report["peaks"]}]


def markdown_report(report: dict[str, Any], command: str = "") -> str:
    """The bench as a markdown table (what results/README.md shows)."""
    cols = [c for c in COLUMNS if any(c in r["columns"] for r in report["spaces"])]
    runs = _runs(report)
    when = runs[0]["date"] if len(runs) == 1 else f"in {len(runs)} runs (" + "; ".join(
        f"{run['date']}: {', '.join(run['spaces'])}" for run in runs) + ")"
    lines = [f"Measured {when} on this machine ({report['threads']} threads, TVM {report['tvm_version']}), "
             f"tuning budget {report['budget_s']:.0f} s per space for autofuse and MetaSchedule alike; "
             f"{report['rounds']} interleaved rounds x {report['repeats']} repeats, median (spread = max-min) in ms.",
             "Peaks measured by the same command: " + "; ".join(
                 f"{run['peaks']['peak_gflops']:.0f} GFLOP/s ({run['peaks'].get('peak_source', 'numpy')} SGEMM "
                 f"2048^3), {run['peaks']['bandwidth_gbs']:.1f} GB/s (copy)" + (f" ({run['date']})" if len(runs) > 1 else "")
                 for run in runs) + ".", ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    vs_random = any("search_vs_random" in r for r in report["spaces"])
    lines.append("| space | " + " | ".join(cols) + " | roofline | autofuse/roofline | trials | 95% of best at |"
                 + (" random search at equal trials |" if vs_random else ""))
    lines.append("|---" * (len(cols) + 5 + vs_random) + "|")
    for r in report["spaces"]:
        row = [r["space"]]
        row += [cell(r, c, markdown=True) for c in cols]
        row.append(f"{r['roofline_ms']:.3f}" if r.get("roofline_ms") else "")
        row.append(f"{r['autofuse_over_roofline']:.2f}x" if r.get("autofuse_over_roofline") else "")
        if "autofuse_model_job" in r:  # a whole model: trials over all its regions
            row.append(f"{r['autofuse_model_job'].get('trials', '')} (all regions)")
        else:
            job = r.get("autofuse_job") or {}
            trials = job.get("trials_this_job", "")
            row.append(f"{trials} ({job['measured']} built)" if job.get("measured") is not None and trials != "" else str(trials))
        at = r.get("autofuse_95pct_at_s")
        row.append(f"{at:.0f} s" if at is not None else "")
        if vs_random:
            row.append(random_cell(r.get("search_vs_random")))
        lines.append("| " + " | ".join(row) + " |")
    geo = report.get("geomean_speedup_of_autofuse", {})
    lines += ["", "Bold: peer time / autofuse time (>1 means autofuse is faster). Geometric mean over spaces: "
              + ", ".join(f"{k} {v:.2f}x" for k, v in geo.items() if k != "autofuse") + "."]
    if vs_random:
        lines += ["", "Random search at equal trials: random sampling of the same space from the same reference "
                  "and seed plans, tuned for the same budget after autofuse; its best after as many measured "
                  "candidates as the shorter of the two runs built, over autofuse's best after as many (>1: the "
                  "guided search is ahead), with that count; then the same ratio at the end of the budget, with "
                  "each run's measured candidates. Curves: `bench_trials.png`."]
    return "\n".join(lines) + "\n"
