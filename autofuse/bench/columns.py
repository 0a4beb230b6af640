"""The bench's columns: each way of computing a space (autofuse's best plan, its peers, the
NumPy reference), built or tuned, then wrapped as a ``Runnable`` that checks and times it.

Tuning columns (autofuse, MetaSchedule, random search) get the same wall-clock budget and
say every minute how far they are (``Ticker``).  A peer that cannot run is reported as a
failed column, never fatal.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, ClassVar

import numpy as np

from autofuse.bench.curves import StudyHistory, search_vs_random
from autofuse.db import PlanDB
from autofuse.measure import Session, TimingConfig
from autofuse.plan import Plan
from autofuse.runner import interleaved
from autofuse.target import Target, num_threads
from autofuse.workload import Workload

COLUMNS = ("unfused", "tvm-default", "tvm-metaschedule", "onnxruntime", "numpy", "random-search", "autofuse")
# random-search: the best plan of a random-sampling job of the same space and budget (``--compare-random``),
# timed in the same rounds as autofuse's, so the two jobs' bests are compared in the same minutes.
# That job is "plain" (the two reference plans, then samples of the space: the textbook baseline)
# or "seeded" (autofuse's seed templates first, as the guided job measures them: what the sampler
# and mutations add on their own).  Reports without the mark were seeded.
RANDOM_BASELINES = ("plain", "seeded")


@dataclass
class Column:
    name: str
    correct: bool | None = None
    error: str | None = None
    samples_ms: list[float] = field(default_factory=list)
    note: str = ""
    builds: int = 1  # how many times the column was built anew for its timings (``_Runnable.renew``)

    @property
    def median_ms(self) -> float | None:
        return statistics.median(self.samples_ms) if self.samples_ms else None

    @property
    def spread_ms(self) -> float | None:
        return (max(self.samples_ms) - min(self.samples_ms)) if self.samples_ms else None

    def as_dict(self) -> dict[str, Any]:
        """The column as the report stores it; its timings too, in the order they ran, so that
        a wide spread (max - min) can be read as one stalled repeat or a spread-out many."""
        return {"name": self.name, "correct": self.correct, "error": self.error, "median_ms": self.median_ms,
                "spread_ms": self.spread_ms, "samples": len(self.samples_ms), "note": self.note,
                "builds": self.builds, "samples_ms": [round(t, 6) for t in self.samples_ms]}


def time_python(fn: Callable[[], Any], min_ms: float, repeats: int) -> list[float]:
    """ms per call of a Python callable (onnxruntime, NumPy): a warm-up call, then ``repeats``
    timings, each of as many calls as last ``min_ms``."""
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


QUIET_POLL_S = 0.02  # how often ``wait_for_quiet_threads`` looks at the process's CPU time
QUIET_CPU_SHARE = 0.1  # below this share of one core, no thread of the process is spinning
QUIET_MAX_S = 2.0  # it gives up after this long (a thread busy for good: nothing to wait for)


def wait_for_quiet_threads(poll_s: float = QUIET_POLL_S, max_s: float = QUIET_MAX_S) -> float:
    """Sleep until this process's threads stop using the CPU; the seconds it waited.  After a
    parallel kernel, TVM's pool worker spins (300000 yields, about 45 ms of a full core here)
    waiting for the next one, and OpenBLAS's threads do the same: a kernel of another runtime
    timed then shares the cores with them.  onnxruntime's first 50 ms repeat right after a TVM
    kernel ran up to 2.3x slower (the median of six) than after itself or after this wait;
    the effect comes and goes from run to run (NOTES 53)."""
    start = time.perf_counter()
    while True:
        if cores_busy_while_sleeping(poll_s) < QUIET_CPU_SHARE or time.perf_counter() - start >= max_s:
            return time.perf_counter() - start


def cores_busy_while_sleeping(seconds: float) -> float:
    """How many cores this process's other threads used while the calling thread slept
    ``seconds`` (CPU time over wall time)."""
    cpu, wall = time.process_time(), time.perf_counter()
    time.sleep(seconds)
    return (time.process_time() - cpu) / (time.perf_counter() - wall)


Timer = Callable[[int, float], list[float]]  # (repeats, min ms per repeat) -> ms per run of each repeat
Loaded = tuple[Timer, Callable[[], Any]]  # a build ready to run: its timer, and what computes its output


class _Runnable:
    """One column (or one plan of a search check), ready to check and time.  ``runtime`` is
    what runs it (TVM, onnxruntime, NumPy): ``time`` lets the threads of the runtime timed
    just before go quiet first when it is another one.  ``rebuild`` (where there is a build)
    makes and loads a new one: ``renew`` swaps it in."""

    last_runtime: ClassVar[str | None] = None  # the runtime this process timed last

    def __init__(self, column: Column, timer: Timer, output: Callable[[], Any], plan_hash: str | None = None,
                 runtime: str = "tvm", rebuild: Callable[[], Loaded] | None = None):
        self.column, self.timer, self.output, self.plan_hash, self.runtime = column, timer, output, plan_hash, runtime
        self.rebuild = rebuild

    def renew(self, check: Callable[[_Runnable], None]) -> None:
        """Time a new build from now on, ``check``ed first (it marks a wrong one).  Where a
        build's buffers and constants land in memory moves its time by up to 1.4x for as long
        as it lives (results/NOTES.md 62): timed with one build, a column that landed badly
        would read slow in every round and every pair; built anew for each round and each
        few pairs, a bad landing is one block of timings that the median sees through."""
        if self.rebuild is None or not self.column.correct:
            return
        try:
            self.timer, self.output = self.rebuild()
        except Exception as e:
            self.column.correct = False
            self.column.error = f"build {self.column.builds + 1} failed: {_error_line(e)}"
            return
        self.column.builds += 1
        check(self)

    def time(self, repeats: int, min_ms: float) -> list[float]:
        """ms per run of each of ``repeats`` timings (``timer``), after the spinning threads of
        another runtime timed just before have stopped (``wait_for_quiet_threads``)."""
        if _Runnable.last_runtime not in (None, self.runtime):
            wait_for_quiet_threads()
        _Runnable.last_runtime = self.runtime
        return self.timer(repeats, min_ms)


def _error_line(e: Exception) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[-1][:200]}"


def _vm_runnable(name: str, make: Callable[[], Any], w: Workload, fold: bool, target: Target, note: str = "",
                 first: Any = None) -> _Runnable:
    """A column run by a Relax VM: ``make`` builds its executable (``first``: the build to
    start with, where one is at hand), and again for each ``renew``."""
    acts, _ = w.check_data()
    inputs = w.runtime_inputs(fold, acts)

    def load(ex: Any) -> Loaded:
        session = Session(ex, target)
        args = session.to_device(inputs)

        def timer(repeats: int, min_ms: float) -> list[float]:
            return session.time(inputs, TimingConfig(repeats=repeats, min_repeat_ms=int(min_ms), warmup=1))

        return timer, lambda: session(args)

    timer, output = load(make() if first is None else first)
    return _Runnable(Column(name, note=note), timer, output, rebuild=lambda: load(make()))


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


class _JobTicker:
    """A tuning job's progress in the bench: the ticker's line during the search, and one
    line when the job's final re-measurement starts."""

    def __init__(self, ticker: _Ticker):
        self.ticker = ticker

    def __enter__(self) -> Callable[[Any], None]:
        return self.ticker.study_update

    def __exit__(self, *exc: Any) -> None:
        return None

    def final_started(self, seconds: float, wait_s: float) -> None:
        self.ticker.progress(f"{self.ticker.label}: final re-measurement, {seconds:.0f} s, up to {wait_s:.0f} s "
                             "until it has seen both speed levels")


def _job_ticker(ticker: _Ticker) -> Callable[..., Any]:
    """``run_job``'s progress factory."""
    return lambda _cfg, _before: _JobTicker(ticker)


EARLY_SHARE = 0.3  # the "95% of the 10-minute best within the first 3 minutes"
PAIRED_TIMINGS = 24  # back-to-back timings of each pair of plans (``PlanPair.time_paired``)
PAIRS_PER_BUILD = 4  # pairs timed with one build of each of the two before both are built anew
# Peers the targets name, also timed back to back with autofuse: where the two are a
# few percent apart (a tie at the roofline), the rounds' medians can draw different speed
# levels of this host for the two columns, and pairs taken back to back mostly share one.
PAIRED_PEERS = ("tvm-metaschedule", "onnxruntime")


@dataclass
class PlanPair:
    """Two plans of the tuning jobs whose ratio the report gives: what a job of 30% of the
    budget would have returned against the final best, and guided against random search at
    equal trials.  Plans of two jobs, or of two moments of one job, compare only side by
    side: a job's scores are anchored in its own first minutes, and a best plan's score is
    the product of the side-by-side ratios that made it the best, noise included.  Both
    plans are checked and timed in the bench's own rounds, interleaved with the columns:
    timed apart, right after a job ended, the same plans ran up to 1.9x slower than in the
    rounds (NOTES 30).  ``finish`` writes
    ``{<a>_plan, <b>_plan, <a>_ms, <b>_ms, <b>_over_<a>, samples}`` into ``into``."""

    names: tuple[str, str]
    runs: tuple[_Runnable, _Runnable]  # the same object twice: one plan, ratio 1.0
    into: dict[str, Any]
    ratios: list[float] = field(default_factory=list)  # b's time over a's, one per pair of timings

    def time_paired(self, pairs: int, min_ms: float, check: Callable[[_Runnable], None] | None = None) -> None:
        """Time the two plans right after each other ``pairs`` times (A B, then B A, ...), one
        repeat each, and keep each pair's ratio.  The machine's speed for memory-bound
        kernels here flips between two levels every second or so (ew_chain's default plan:
        1.1 or 2.0 ms, in runs a few seconds apart; NOTES 35), and the columns' rounds time
        each plan for a whole repeat block, several columns apart: a plan can draw the slow
        level in most of its rounds.  Two timings taken back to back mostly share a level,
        so their ratio does not carry it.  With ``check``, both are built anew (and checked)
        before every ``PAIRS_PER_BUILD`` pairs (``_Runnable.renew``)."""
        a, b = self.runs
        if a is b or not (a.column.correct and b.column.correct):
            return
        ms: tuple[list[float], list[float]] = ([], [])
        for k, i in enumerate(interleaved(2, pairs)):  # each round is one pair: A B, then B A, ...
            if check is not None and k % (2 * PAIRS_PER_BUILD) == 0:
                for r in self.runs:
                    r.renew(check)
                if not (a.column.correct and b.column.correct):
                    break  # a new build went wrong: the pair reports it
            ms[i].append(statistics.median(self.runs[i].time(1, min_ms)))
        self.ratios.extend(tb / ta for ta, tb in zip(*ms))

    def finish(self) -> None:
        """The ratio is the median of the paired ratios (``time_paired``) where there are
        some; ``rounds_<b>_over_<a>`` keeps the ratio of the two plans' medians in the rounds."""
        (ka, kb), (a, b) = self.names, self.runs
        out: dict[str, Any] = {f"{ka}_plan": a.plan_hash, f"{kb}_plan": b.plan_hash}
        bad = next((r for r in self.runs if not r.column.correct or not r.column.samples_ms), None)
        if a is b:
            out[f"{kb}_over_{ka}"] = 1.0
        elif bad is not None:
            what = f"plan {bad.plan_hash}" if bad.plan_hash else bad.column.name  # a peer's column has no plan
            out["error"] = f"{what}: {bad.column.error or 'not timed'}"
        else:
            ms_a, ms_b = a.column.median_ms, b.column.median_ms
            out.update({f"{ka}_ms": ms_a, f"{kb}_ms": ms_b, f"{kb}_over_{ka}": ms_b / ms_a,
                        "samples": len(a.column.samples_ms)})
            if self.ratios:
                q1, _, q3 = statistics.quantiles(self.ratios, n=4) if len(self.ratios) > 1 else self.ratios * 3
                out.update({f"rounds_{kb}_over_{ka}": ms_b / ms_a, f"{kb}_over_{ka}": statistics.median(self.ratios),
                            "paired": {"pairs": len(self.ratios), "q1": q1, "q3": q3}})
        self.into.update(out)


def bench_db(out_dir: Path, space: str) -> Path:
    """The plan database a bench tunes ``space`` into: one per space, so that the plans behind
    every row of a report (``--append`` included) stay there to be read and rebuilt."""
    return out_dir / f"bench-{space}.db"


def build_columns(w: Workload, target: Target, budget_s: float, out_dir: Path, progress: Callable[[str], None],
                  seed: int, include: tuple[str, ...], compare_random: str | None = None,
                  ) -> tuple[list[_Runnable], list[PlanPair], dict[str, Any]]:
    """The ``include``d columns of ``w``, ready to check and time; the plan pairs of the search
    checks, to time in the same rounds; and what the tuners reported (search curves, job
    summaries, the random-search comparison).  ``compare_random`` (one of
    ``RANDOM_BASELINES``) and the random-search column go together (either asks for both,
    plain by default; they need the autofuse column, whose job the random search runs after)."""
    import tvm
    from tvm import relax

    from autofuse import metaschedule
    from autofuse.build import build
    from autofuse.peers import has_onnx, onnx_model, onnxruntime_session
    from autofuse.relax_module import bind_params, space_to_relax

    compare_random = compare_random or ("plain" if "random-search" in include else None)
    if compare_random not in (None, *RANDOM_BASELINES):
        raise ValueError(f"compare_random: {compare_random!r} is none of {RANDOM_BASELINES}")
    if compare_random and "random-search" not in include:
        include = (*include, "random-search")
    acts, expected = w.check_data()
    cols: list[_Runnable] = []
    pairs: list[PlanPair] = []
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
            r = _Runnable(Column(name, correct=False, error=_error_line(e)), lambda *_: [], lambda: None)
        if r is not None:
            cols.append(r)

    guarded("unfused", lambda: _vm_runnable(
        "unfused", lambda: build(w.graph(True), w.reference_plan("unfused"), target, reuse_kernels=True), w, True, target))

    def tvm_default() -> _Runnable:
        mod = bind_params(space_to_relax(w.space), w.params)

        def load() -> Loaded:
            ex = tvm.compile(mod, target.tvm(), relax_pipeline=relax.get_default_pipeline(target.tvm()))
            vm = relax.VirtualMachine(ex, tvm.cpu())
            args = [tvm.runtime.tensor(acts[t.name]) for t in w.space.activations]
            vm.save_function("main", "main_timed", *args)

            def timer(repeats: int, min_ms: float) -> list[float]:
                r = vm.time_evaluator("main_timed", tvm.cpu(), number=1, repeat=repeats, min_repeat_ms=int(min_ms))()
                return [x * 1e3 for x in r.results]

            return timer, lambda: vm["main"](*args).numpy()

        return _Runnable(Column("tvm-default", note="FuseOps, no schedule"), *load(), rebuild=load)

    guarded("tvm-default", tvm_default)

    db_url = f"sqlite:///{bench_db(out_dir, w.space.name)}"
    candidate_timeout = min(120.0, max(20.0, budget_s / 6))  # one slow compile can't eat the budget

    def plan_note(plan: Plan, label: str, note: str) -> str:
        return f"plan {plan.hash} ({label}), {len(plan.groups)} kernels, {note}"

    built: dict[str, Any] = {}  # plan hash -> first executable: a plan two columns time is built once

    def plan_runnable(name: str, plan_json: str, label: str, note: str) -> _Runnable:
        plan = Plan.from_json(plan_json)

        def make() -> Any:  # a new build links the kernels this process compiled for the first
            return build(w.graph(plan.fold_params), plan, target, reuse_kernels=True)

        if plan.hash not in built:
            built[plan.hash] = make()
        r = _vm_runnable(name, make, w, plan.fold_params, target, note=plan_note(plan, label, note),
                         first=built[plan.hash])
        r.plan_hash = plan.hash
        return r

    by_plan: dict[str, _Runnable] = {}  # the plans of the search checks, each built once

    def pair(names: tuple[str, str], a_json: str, b_json: str, into: dict[str, Any], *known: _Runnable) -> None:
        """Time two plans in the bench's rounds (``known``: columns that already time a plan)."""
        for r in known:
            by_plan.setdefault(r.plan_hash, r)
        runs = []
        for plan_json in (a_json, b_json):
            h = Plan.from_json(plan_json).hash
            if h not in by_plan:
                try:
                    by_plan[h] = plan_runnable(f"plan {h}", plan_json, "search check", "")
                except Exception as e:  # reported in the pair, never fatal
                    by_plan[h] = _Runnable(Column(f"plan {h}", correct=False, error=_error_line(e)),
                                           lambda *_: [], lambda: None, plan_hash=h)
            runs.append(by_plan[h])
        pairs.append(PlanPair(names, (runs[0], runs[1]), into))

    def stored_best() -> tuple[str, str]:
        """(plan JSON, label) of the best verified plan the tuning stored."""
        with PlanDB(db_url, create=False, readonly=True) as db:
            best = db.best_plan(w.hash, target.spec)
        if best is None:
            raise RuntimeError("autofuse found no verified plan in the budget")
        return best.plan_json, best.label

    def best_plan_runnable(note: str) -> _Runnable:
        """autofuse's column: the best verified plan the tuning stored, built here."""
        return plan_runnable("autofuse", *stored_best(), note)

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
        from autofuse.job import JobConfig, choice_of_shorter_job, run_job

        if model_path:
            return autofuse_model_col()
        cfg = JobConfig(space=w.space.name, target=target.spec_json, tiny=w.tiny, trials=None, timeout_s=budget_s,
                        db_url=db_url, study=f"bench-{w.space.name}-{int(time.time())}", seed=seed,
                        candidate_timeout_s=candidate_timeout, progress=False, log_dir=str(out_dir))
        result = run_job(cfg, progress_factory=_job_ticker(_Ticker(progress, f"{w.space.name}: autofuse", budget_s)))
        extra["autofuse_job"] = result.as_dict()
        guided = StudyHistory(db_url, result.study)
        extra["autofuse_curve"], guided_by_measured = guided.curves()
        final_json, label = stored_best()  # before random search adds plans
        runnable = plan_runnable("autofuse", final_json, label, f"{result.trials_this_job} trials")
        # What a 3-minute job would have returned (its final over the plans the first 3 of 10
        # minutes found) against the final best, side by side in the bench's rounds.
        early_s = EARLY_SHARE * budget_s
        by_score = guided.best_plan_after(seconds=early_s)
        early_json, chose = choice_of_shorter_job(cfg, guided.complete_before(early_s), early_s)
        extra["autofuse_early_best"] = {"at_s": early_s, "early_plan": None, "final_over_early": None,  # none yet
                                        "best_score_plan": Plan.from_json(by_score).hash if by_score else None,
                                        "early_final": chose}
        if early_json:
            pair(("early", "final"), early_json, final_json, extra["autofuse_early_best"], runnable)
        if compare_random:  # the same budget with random sampling: is the guided search earning its keep?
            seeded = compare_random == "seeded"
            rcfg = JobConfig(**{**cfg.__dict__, "study": cfg.study + "-random", "sampler": "random", "top_k": 1, "warm_start": False,
                                "seed_templates": seeded, "final_rounds": 1})
            rres = run_job(rcfg, progress_factory=_job_ticker(_Ticker(progress, f"{w.space.name}: random search", budget_s)))
            rand = StudyHistory(db_url, rres.study)
            extra["random_curve"], random_by_measured = rand.curves()
            extra["random_job"] = {"trials": rres.trials_this_job, "measured": rres.measured, "best": rres.best,
                                   "study": rres.study, "seeded": seeded}
            extra.update(search_vs_random(guided_by_measured, random_by_measured))
            if "search_vs_random" in extra:
                extra["search_vs_random"]["random_seeded"] = seeded
                n = extra["search_vs_random"]["equal_trials"]
                a, b = guided.best_plan_after(n), rand.best_plan_after(n)
                extra["search_vs_random"]["side_by_side"] = {} if a and b else None
                if a and b:
                    pair(("guided", "random"), a, b, extra["search_vs_random"]["side_by_side"], runnable)
        return runnable

    def random_col() -> _Runnable:
        """Random search's best plan, as its job (run in ``autofuse_col``) reported it."""
        job = extra.get("random_job") or {}
        best = job.get("best") or {}
        plan_json = None
        if best.get("plan_hash"):
            with PlanDB(db_url, create=False, readonly=True) as db:
                plan_json = db.plan_json(w.hash, best["plan_hash"])
        if plan_json is None:
            raise RuntimeError("random search found no verified plan in the budget")
        note = f"{job['trials']} trials, random sampling"
        checked = by_plan.get(best["plan_hash"])
        if checked is not None and checked not in cols:
            # only the guided-vs-random check has built this plan (random's best at equal
            # trials is often its final best): it becomes the column, built and timed once
            checked.column = replace(checked.column, name="random-search",
                                     note=plan_note(Plan.from_json(plan_json), best.get("label", "tuned"), note))
            return checked
        return plan_runnable("random-search", plan_json, best.get("label", "tuned"), note)

    def metaschedule_col() -> _Runnable:
        work = out_dir / f"ms-{w.space.name}"
        ticker = _Ticker(progress, f"{w.space.name}: tvm-metaschedule", budget_s)
        curve, info = metaschedule.tune(spec, w.tiny, target, budget_s, work, seed=seed, on_poll=lambda n, est: ticker(
            f"{n} records, " + ("not every kernel tuned yet" if est is None else f"sum of kernel bests {est:.4f} ms")))
        extra["metaschedule_curve"] = curve
        extra["metaschedule"] = info
        mod, tuned, total = metaschedule.apply_best(w.graph(True).mod, target, work)
        return _vm_runnable("tvm-metaschedule", lambda: tvm.compile(mod, target.tvm()), w, True, target,
                            note=f"{info['records']} records, {tuned}/{total} kernels tuned")

    guarded("tvm-metaschedule", metaschedule_col)
    guarded("autofuse", autofuse_col)
    guarded("random-search", random_col)

    def ort_col() -> _Runnable | None:
        if model_path:  # the model file itself, with the weights the workload uses
            import onnx

            ref = w.space.reference
            model = onnx.load_from_string(ref.model_bytes)
            feed = {o: np.asarray(acts[r], dtype=np.float32) for r, o in ref.relax_to_onnx.items()}
        elif has_onnx(w.space.name):
            model = onnx_model(w.space, w.params, expected.shape)
            feed = {k: v for k, v in acts.items()}
        else:
            return None

        def load() -> Loaded:  # a new session: onnxruntime's own build of the graph
            sess = onnxruntime_session(model, num_threads())
            return lambda r, m: time_python(lambda: sess.run(None, feed), m, r), lambda: sess.run(None, feed)[0]

        return _Runnable(Column("onnxruntime", note=f"{num_threads()} threads, ORT_ENABLE_ALL"), *load(),
                         runtime="onnxruntime", rebuild=load)

    guarded("onnxruntime", ort_col)
    ref_inputs = {**acts, **w.params}
    if model_path:  # a model's reference is onnxruntime itself: no NumPy column
        return cols, pairs, extra
    guarded("numpy", lambda: _Runnable(Column("numpy", note="the reference (float64 where it casts)"),
                                       lambda r, m: time_python(lambda: w.space.reference(**ref_inputs), m, r),
                                       lambda: w.space.reference(**ref_inputs), runtime="numpy"))
    return cols, pairs, extra
