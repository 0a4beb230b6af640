"""Build-and-measure of one candidate, in-process or in an isolated worker process.

A tuning job sends each candidate to a long-lived worker process (spawned, so it
starts clean of the parent's threads) over a pipe.  A candidate that segfaults,
hangs or runs out of memory kills only that worker: the job records why, starts
a fresh worker and goes on.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import statistics
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from autofuse.measure import Measurement, Session, TimingConfig, measure, steady_allocations
from autofuse.plan import Plan, PlanError
from autofuse.target import Target, parse_target
from autofuse.workload import Workload, get_workload

# Statuses a candidate can end in; only "ok" has a time that counts.
OK, WRONG, REJECTED, BUILD_ERROR, TIMEOUT, CRASHED, ERROR = "ok", "wrong", "rejected", "build_error", "timeout", "crashed", "error"
READY = "ready"  # a fresh worker has loaded the workload


def evaluate_plan(w: Workload, plan: Plan, target: Target, cfg: TimingConfig, *, corrupt: bool = False,
                  keep_build: bool = False, fresh_build: bool = False) -> dict[str, Any]:
    """Build, check and time ``plan`` here. Plan/schedule errors propagate to the caller.

    ``corrupt`` (fault injection only): after scheduling, the kernel that writes the
    output is made to write only part of it, so the correctness check must catch it.
    ``keep_build``: the built plan joins this process's few recent builds (a worker keeps
    them for :func:`compare_plans`, which times a new best against the incumbent).
    ``fresh_build``: link it anew even if built here before (a final's rounds: a build that
    landed badly in memory stays slow for as long as it lives, results/NOTES.md 62)."""
    from autofuse.build import compile_module, schedule_module

    w.check_plan(plan)
    t0 = time.perf_counter()
    if corrupt:
        ex = compile_module(_corrupt_output_kernel(schedule_module(w.graph(plan.fold_params), plan, target)), target,
                            plan.fast_math)
    else:
        ex = _built(w, plan, target, keep_build, fresh_build)
    build_s = time.perf_counter() - t0
    acts, expected = w.check_data()
    t1 = time.perf_counter()
    m = _check_and_time(w, plan, ex, target, acts, expected, cfg)
    out = m.as_dict()
    out.update(status=OK if m.correct else WRONG, build_s=build_s, run_s=time.perf_counter() - t1)
    return out


# Recently built plans of a worker process, newest last: the incumbent best and the latest
# candidates, so that timing a new best against the incumbent rebuilds neither, and the
# references of a job's final re-measurement, whose one build tells the host's speed levels.
_RECENT_BUILDS: OrderedDict[tuple[str, str, str], Any] = OrderedDict()
RECENT_BUILDS_KEPT = 8


def interleaved(n: int, rounds: int, until: float | None = None,
                clock: Callable[[], float] = time.perf_counter,
                more: Callable[[], bool] | None = None) -> Iterator[int]:
    """The order in which ``n`` plans are timed over ``rounds`` rounds: A B C, then C B A, ...
    Each plan is timed as often early as late in every pair of rounds, so a drift of the
    machine's speed during the rounds does not favour the plans timed first.  With
    ``until`` (a ``clock()`` time), whole rounds go on after ``rounds`` until then, and
    with ``more``, while ``more()`` (asked before each further round) says so."""
    for r in round_numbers(rounds, until, clock, more):
        yield from (range(n) if r % 2 == 0 else range(n - 1, -1, -1))


def round_numbers(rounds: int, until: float | None = None,
                  clock: Callable[[], float] = time.perf_counter,
                  more: Callable[[], bool] | None = None) -> Iterator[int]:
    """0, 1, 2, ...: ``rounds`` of them, then on while ``clock()`` is before ``until`` or
    ``more()`` says so (both asked before each further round)."""
    r = 0
    while r < rounds or (until is not None and clock() < until) or (more is not None and more()):
        yield r
        r += 1


def _built(w: Workload, plan: Plan, target: Target, keep: bool, fresh: bool = False) -> Any:
    """The plan's executable: one of the last ``RECENT_BUILDS_KEPT`` built here, unless
    ``fresh``; ``keep`` it for the next call."""
    from autofuse.build import build

    key = (w.hash, plan.hash, target.spec_json)
    if key in _RECENT_BUILDS and not fresh:
        _RECENT_BUILDS.move_to_end(key)
        return _RECENT_BUILDS[key]
    ex = build(w.graph(plan.fold_params), plan, target, reuse_kernels=True)
    if keep:
        _RECENT_BUILDS[key] = ex
        while len(_RECENT_BUILDS) > RECENT_BUILDS_KEPT:
            _RECENT_BUILDS.popitem(last=False)
    return ex


def _check_and_time(w: Workload, plan: Plan, ex: Any, target: Target, acts: Any, expected: Any,
                    cfg: TimingConfig) -> Measurement:
    """One verified measurement of a built plan in a fresh VM, scrubbed afterwards."""
    session = Session(ex, target)
    inputs = w.runtime_inputs(plan.fold_params, acts)
    try:
        return measure(session, inputs, expected, w.space.rtol, w.space.atol, cfg,
                       timing_inputs=_timing_inputs(w, plan.fold_params))
    finally:
        del session
        _scrub(ex, target, inputs)


def compare_plans(w: Workload, plans: list[Plan], target: Target, cfg: TimingConfig, rounds: int) -> dict[str, Any]:
    """Time ``plans`` interleaved, ``rounds`` times (A B, then B A, ...), each checked again.

    On a shared machine a memory-bound kernel's time drifts from minute to minute by more
    than good plans differ; timed side by side within a second or two, the plans share the
    drift, so the ratio of their medians says which is faster where one timing cannot.
    Each comparison builds its plans anew (their kernels are compiled already: 30-60 ms of
    linking).  Where a build's buffers land in memory moves its time by up to 1.4x for as
    long as it lives (one gemm_bn build in six, results/NOTES.md 62): an incumbent kept
    from comparison to comparison that landed badly loses to every candidate, and a win's
    replicate would meet the same two builds again."""
    for plan in plans:
        w.check_plan(plan)
    built = [_built(w, p, target, keep=True, fresh=True) for p in plans]
    acts, expected = w.check_data()
    samples: list[list[float]] = [[] for _ in plans]
    by_round: list[list[float]] = [[] for _ in plans]
    for i in interleaved(len(plans), rounds):
        m = _check_and_time(w, plans[i], built[i], target, acts, expected, cfg)
        if not m.correct:
            return {"status": WRONG, "correct": False, "error": f"plan {plans[i].hash}: {m.error}"}
        samples[i].extend(m.samples_ms)
        by_round[i].append(m.median_ms)
    return {"status": OK, "correct": True, "samples_ms": samples, "round_ms": by_round,
            "median_ms": [statistics.median(s) for s in samples]}


def _timing_inputs(w: Workload, fold: bool) -> list[Any]:
    """Activations for the timed runs, drawn with another seed than the check's (cached)."""
    cache = w.__dict__.setdefault("_af_timing_acts", {})
    if "acts" not in cache:
        cache["acts"] = w.activations(seed=2)
    return w.runtime_inputs(fold, cache["acts"])


def _scrub(executable: Any, target: Target, inputs: list[Any]) -> None:
    """After a candidate: a fresh VM runs it twice on NaN inputs, so the buffers it leaves
    in the process-wide pooled allocator hold poison rather than answers (a second line of
    defence next to timing on other data, see :func:`autofuse.measure.measure`).  The measuring VM
    is gone by now (it held its last outputs); two calls cover the two buffers a VM
    alternates between."""
    import numpy as np

    try:
        session = Session(executable, target)
        poison = session.to_device([np.full_like(a, np.nan) for a in inputs])
        for _ in range(2):
            session(poison)
    except Exception:  # noqa: BLE001 - best effort; the measurement already stands
        pass


def run_task(task: dict[str, Any]) -> dict[str, Any]:
    """One candidate from plain data (what crosses the process boundary); never raises."""
    from autofuse.build import BuildError
    from autofuse.schedule import ScheduleRejected

    t0 = time.perf_counter()
    try:
        corrupt = _maybe_inject_fault(task.get("inject"))
        w = _workload_of(task)
        plan = Plan.from_json(task["plan"])
        target = parse_target(task["target"])
        cfg = TimingConfig(**task.get("timing", {}))
        if "compare_with" in task:
            return compare_plans(w, [plan, Plan.from_json(task["compare_with"])], target, cfg, task["rounds"])
        fresh = bool(task.get("fresh_build", False))  # a final's contender: linked anew each round, not kept
        return evaluate_plan(w, plan, target, cfg, corrupt=corrupt, keep_build=not fresh, fresh_build=fresh)
    except (PlanError, ScheduleRejected) as e:
        return {"status": REJECTED, "correct": False, "error": str(e), "build_s": time.perf_counter() - t0}
    except BuildError as e:
        return {"status": BUILD_ERROR, "correct": False, "error": str(e), "build_s": time.perf_counter() - t0}
    except MemoryError:
        return {"status": ERROR, "correct": False, "error": "out of memory (worker memory limit)"}
    except Exception as e:
        last = traceback.format_exception_only(type(e), e)[-1].strip()
        return {"status": ERROR, "correct": False, "error": last[:500]}


def _workload_of(task: dict[str, Any]) -> Workload:
    if "model" in task:  # {"model": "/abs/model.onnx", "shapes": {...}, "region": hash?}
        import json as _json

        from autofuse.onnx_import import MODEL_PREFIX

        spec = {"path": task["model"], "shapes": task.get("shapes") or {}}
        if task.get("region"):
            spec["region"] = task["region"]
        return get_workload(MODEL_PREFIX + _json.dumps(spec, sort_keys=True, separators=(",", ":")))
    return get_workload(task["space"], task.get("tiny", False))


def _prepare(task: dict[str, Any]) -> dict[str, Any]:
    """A fresh worker's start: TVM imported and the task's workload built (for a model, the
    ONNX import), so that a candidate's time limit counts only the candidate."""
    try:
        import autofuse.build  # noqa: F401 - imports TVM

        _workload_of(task)
        return {"status": READY}
    except Exception as e:
        last = traceback.format_exception_only(type(e), e)[-1].strip()
        return {"status": ERROR, "correct": False, "error": f"worker could not load the workload: {last[:400]}"}


def _maybe_inject_fault(kind: str | None) -> bool:
    """Test hook: faults a candidate can cause, honoured only with AUTOFUSE_FAULT_INJECTION=1.

    Returns True for ``wrong``: the caller builds a really broken kernel (see
    :func:`_corrupt_output_kernel`) and the harness's correctness check has to catch it."""
    if not kind or os.environ.get("AUTOFUSE_FAULT_INJECTION") != "1":
        return False
    if kind == "wrong":
        return True
    if kind == "segfault":
        import ctypes

        ctypes.string_at(0)
    elif kind == "hang":
        time.sleep(3600)
    elif kind == "oom":
        hog = []
        while True:
            hog.append(bytearray(256 << 20))
    elif kind == "raise":
        raise RuntimeError("injected failure inside the build")
    elif kind == "exit":
        os._exit(3)
    return False


def _corrupt_output_kernel(mod: Any) -> Any:
    """Fault injection: the PrimFunc that writes ``main``'s output gets its outermost
    multi-iteration loop cut to half its extent, so it writes only part of its output."""
    import tvm
    from tvm import relax, s_tir, tirx

    call_tir = tvm.ir.Op.get("relax.call_tir")
    calls = [b.value for blk in mod["main"].body.blocks for b in blk.bindings
             if isinstance(b.value, relax.Call) and b.value.op.same_as(call_tir)]
    if not calls:
        raise RuntimeError("fault injection 'wrong': main calls no kernel")
    gv = calls[-1].args[0]
    func = mod[gv]

    def shrink(stmt: Any) -> Any:
        if isinstance(stmt, tirx.For):
            ext = stmt.extent
            if isinstance(ext, tirx.IntImm) and int(ext.value) >= 2:
                half = tirx.IntImm(str(ext.ty), int(ext.value) // 2)
                return tirx.For(stmt.loop_var, stmt.min, half, stmt.kind, stmt.body, stmt.thread_binding,
                                stmt.annotations, getattr(stmt, "step", None))
            body = shrink(stmt.body)
            return None if body is None else tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body,
                                                      stmt.thread_binding, stmt.annotations, getattr(stmt, "step", None))
        if isinstance(stmt, s_tir.SBlockRealize):
            blk = shrink(stmt.block)
            return None if blk is None else s_tir.SBlockRealize(stmt.iter_values, stmt.predicate, blk)
        if isinstance(stmt, s_tir.SBlock):
            body = shrink(stmt.body)
            return None if body is None else s_tir.SBlock(
                stmt.iter_vars, stmt.reads, stmt.writes, stmt.name_hint, body, stmt.init, stmt.alloc_buffers,
                stmt.match_buffers, stmt.annotations)
        if isinstance(stmt, tirx.SeqStmt):
            seq = list(stmt.seq)
            for i in reversed(range(len(seq))):  # the output is written last
                new = shrink(seq[i])
                if new is not None:
                    seq[i] = new
                    return tirx.SeqStmt(seq)
        return None

    body = shrink(func.body)
    if body is None:
        raise RuntimeError(f"fault injection 'wrong': no loop to cut in {gv.name_hint}")
    mod = mod.shallow_copy() if hasattr(mod, "shallow_copy") else mod
    mod[gv] = func.with_body(body)
    return mod


def _worker_main(conn: Any, mem_limit_mb: int | None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    steady_allocations()  # a long-lived worker would time its later builds slower (NOTES 62)
    if mem_limit_mb:
        import resource

        limit = mem_limit_mb << 20
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    while True:
        try:
            task = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        if task is None:
            return
        result = _prepare(task["prepare"]) if "prepare" in task else run_task(task)
        try:
            conn.send(result)
        except (BrokenPipeError, ConnectionResetError):
            return  # the job is gone (killed, or it gave up on this task): nobody to answer, no traceback


class IsolatedRunner:
    """Runs tasks in a worker process; restarts it after a crash or a timeout."""

    def __init__(self, timeout_s: float = 120.0, mem_limit_mb: int | None = None, startup_timeout_s: float = 600.0):
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.mem_limit_mb = mem_limit_mb
        self._ctx = mp.get_context("spawn")
        self._proc: Any = None
        self._conn: Any = None
        self.restarts = 0

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_worker_main, args=(child, self.mem_limit_mb), daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent

    def _kill(self) -> None:
        if self._proc is not None and self._proc.pid is not None:  # pid is None: start() itself failed
            if self._proc.is_alive():
                self._proc.kill()
            self._proc.join(5)
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None

    def run(self, task: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        """Build and measure one candidate in the worker, within ``timeout_s`` (default: the
        runner's); a fresh worker first loads the workload, which the limit does not count."""
        if self._proc is None or not self._proc.is_alive():
            if self._proc is not None:
                self.restarts += 1
                self._kill()
            self._start()
            ready = self._exchange({"prepare": {k: v for k, v in task.items() if k != "inject"}},
                                   self.startup_timeout_s, "worker start")
            if ready["status"] != READY:
                self._kill()
                return ready
        return self._exchange(task, timeout_s or self.timeout_s, "candidate")

    def _exchange(self, message: dict[str, Any], limit: float, what: str) -> dict[str, Any]:
        self._conn.send(message)
        try:
            if self._conn.poll(limit):
                return self._conn.recv()
            self._kill()
            return {"status": TIMEOUT, "correct": False, "error": f"{what} timed out after {limit:.0f} s (worker killed)"}
        except (EOFError, ConnectionResetError, BrokenPipeError):
            self._proc.join(5)
            code = self._proc.exitcode
            self._kill()
            why = f"signal {-code} ({signal.Signals(-code).name})" if code is not None and code < 0 else f"exit code {code}"
            return {"status": CRASHED, "correct": False, "error": f"worker crashed: {why}"}

    def close(self) -> None:
        if self._conn is not None and self._proc is not None and self._proc.is_alive():
            try:
                self._conn.send(None)
                self._proc.join(5)
            except (BrokenPipeError, OSError):
                pass
        self._kill()

    def __enter__(self) -> IsolatedRunner:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# How a study's candidate log turns what it has seen into limits (see CandidateLog).
LIMIT_AFTER = 5  # accepted candidates before the time limit adapts
LIMIT_FACTOR = 5.0  # time limit: this many times the 90th percentile of accepted candidates' seconds ...
LIMIT_FLOOR_S = 5.0  # ... but never less than this
CUTOFF_FACTOR = 5.0  # timing stops after one run for a candidate this many times slower than the best
RECENT_TIMINGS = 5  # side-by-side medians of the best whose median sets the comparison gate
CONFIRM_ROUNDS = 3  # interleaved rounds that decide whether a candidate timed below the best is faster:
CONFIRM_MARGIN = 0.02  # in every round, and by more than this share overall; else a tie, which keeps the incumbent
DISTURBED_FACTOR = 1.25  # a comparison where the incumbent runs this much above its last side-by-side time is disturbed
HAND_PICKED_GATE = 2.5  # a seed or stored best timed alone up to this many times the gate is compared too (see run)
STALE_AFTER = 40  # candidates timed alone in a row, none compared, before the gate counts as stale ...
STALE_GATE = 1.25  # ... and the next one timed alone up to this many times the gate is compared (see run)


def value_of(res: dict[str, Any]) -> float:
    """What a measured candidate scores in its study: its confirmed value when it was timed
    against the incumbent best (see :meth:`CandidateLog.confirm`), else its median."""
    return float(res.get("value_ms", res["median_ms"]))


def pruned_as_repeat(label: str, res: dict[str, Any]) -> bool:
    """Whether a trial is told to the sampler as pruned rather than with its plan's time: the
    sampler's own suggestion (label ``tuned``) of a plan the study measured before.  Told
    complete, each repeat of a fast plan joined TPE's best trials (at most 25) as another
    copy of it, which made TPE suggest it again: in a 10-minute layernorm_residual job 953 of
    1541 suggestions were plans measured before, and on a copy of that study every one of 40
    more asks was; told pruned (TPE counts a pruned trial among its worse ones), 0 of 40 were
    (NOTES 66).  Enqueued plans (seeds, references, mutations) keep their time: a report
    reads a reference plan's time from its trial."""
    return label == "tuned" and bool(res.get("repeat"))


@dataclass
class CandidateLog:
    """What one study knows about its candidates, so that a job spends its time on new,
    promising ones, and a lucky timing does not become its best.

    - every plan's first result: a plan suggested again (samplers do, and different
      parameters can give the same plan) is not built and measured again;
    - how long accepted candidates take: a candidate is stopped after ``LIMIT_FACTOR``
      times the 90th percentile of that (an LLVM compile that runs away), rather than
      after the job's configured limit, which stays the upper bound;
    - the best time: a candidate ``CUTOFF_FACTOR`` times slower is timed once, not
      repeated (it cannot become the best);
    - the best plan: a candidate timed below the best (a seed template: up to
      ``HAND_PICKED_GATE`` times above; after ``STALE_AFTER`` candidates with no comparison,
      ``STALE_GATE`` times) is timed again side by side with it before it takes its place
      (:meth:`confirm`).
    """

    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    seconds: list[float] = field(default_factory=list)
    best_ms: float | None = None
    best_hash: str | None = None
    best_plan: str | None = None  # the best plan's JSON, to time new candidates against
    best_compared: bool = False  # the best's value comes from timing it side by side (not one lone timing)
    best_timings: list[float] = field(default_factory=list)  # the best's last RECENT_TIMINGS side-by-side medians
    uncompared: int = 0  # candidates timed alone since the last comparison with the best

    @classmethod
    def from_trials(cls, trials: list[Any]) -> CandidateLog:
        """Rebuilt from a study's finished trials, so a resumed job does not repeat what it
        has measured, and goes on comparing against its best plan."""
        log = cls()
        for t in trials:
            log.add_trial(t)
        return log

    def add_trial(self, t: Any) -> None:
        """Record one finished trial from what :meth:`mark` wrote on it (its ``plan_hash``,
        ``status``, ``seconds``, ``plan`` and ``confirm`` attributes) and its value."""
        h, status = t.user_attrs.get("plan_hash"), t.user_attrs.get("status")
        if not h or not status or t.user_attrs.get("repeat"):
            return
        res: dict[str, Any] = {"status": status, "correct": status == OK, "error": t.user_attrs.get("error")}
        if status == OK:
            if t.value is None:
                return
            res["median_ms"] = float(t.value)
            res["confirm"] = t.user_attrs.get("confirm")
        self.record(h, res, t.user_attrs.get("seconds"), t.user_attrs.get("plan"))

    @staticmethod
    def mark(trial: Any, plan_hash: str, res: dict[str, Any]) -> None:
        """Write on ``trial`` what ``from_trials`` reads back: the plan, how it ended, its
        error, and either that it was a repeat or how long it took (and what timing it
        against the incumbent showed)."""
        trial.set_user_attr("plan_hash", plan_hash)
        trial.set_user_attr("status", res["status"])
        if res.get("error"):
            trial.set_user_attr("error", res["error"][:1000])
        if res.get("repeat"):
            trial.set_user_attr("repeat", True)
        else:
            trial.set_user_attr("seconds", round(res["seconds"], 3))
            if res.get("confirm"):
                trial.set_user_attr("confirm", res["confirm"])

    def known(self, plan_hash: str) -> dict[str, Any] | None:
        """The earlier result of this plan, marked as a repeat; None for a new plan."""
        res = self.results.get(plan_hash)
        return None if res is None else {**res, "repeat": True}

    def record(self, plan_hash: str, res: dict[str, Any], seconds: float | None, plan_json: str | None = None) -> None:
        self.results.setdefault(plan_hash, {k: v for k, v in res.items() if k != "samples_ms"})
        if res["status"] == OK and res.get("median_ms") is not None:
            if seconds is not None:
                self.seconds.append(float(seconds))
            timed = res.get("confirm") or {}
            self.uncompared = 0 if "incumbent_ms" in timed else self.uncompared + 1
            if self.best_ms is None or value_of(res) < self.best_ms:
                self.best_ms, self.best_hash, self.best_plan = value_of(res), plan_hash, plan_json
                self.best_compared = "candidate_ms" in timed
                self.best_timings = [timed["candidate_ms"]] if "candidate_ms" in timed else []
            elif timed.get("vs") == self.best_hash and "incumbent_ms" in timed:
                self.best_timings = (self.best_timings + [timed["incumbent_ms"]])[-RECENT_TIMINGS:]

    @property
    def best_recent_ms(self) -> float | None:
        """The best's median in its latest side-by-side timing (None before its first)."""
        return self.best_timings[-1] if self.best_timings else None

    def time_limit_s(self, cap_s: float) -> float:
        if len(self.seconds) < LIMIT_AFTER:
            return cap_s
        ordered = sorted(self.seconds)
        p90 = ordered[int(0.9 * (len(ordered) - 1))]
        return min(cap_s, max(LIMIT_FLOOR_S, LIMIT_FACTOR * p90))

    def cutoff_ms(self) -> float | None:
        return None if self.best_ms is None else CUTOFF_FACTOR * self.best_ms

    def best_timed_ms(self) -> float | None:
        """What the best plan runs at when timed: its latest side-by-side median, or its one
        lone timing while it has none."""
        return self.best_recent_ms if self.best_recent_ms is not None else self.best_ms

    def side_by_side_ms(self) -> float | None:
        """What the best plan runs at side by side: the higher of its latest side-by-side
        median and the median of its last few (None before its first comparison).  The
        latest alone can be one lucky timing: a conv_bn_relu job's best ran 1.49-1.53 ms side
        by side, then 1.43 once, and none of the 511 candidates of its last 8 minutes timed
        alone below that (NOTES 36)."""
        if not self.best_timings:
            return None
        return max(self.best_timings[-1], statistics.median(self.best_timings))

    def compare_below_ms(self) -> float | None:
        """A candidate timed alone below this is timed against the best: what the best runs
        at side by side (:meth:`side_by_side_ms`), or its one lone timing before its first
        comparison.  Not its score: a score is the product of the side-by-side gains that
        made it the best, and drifts from what the plan runs at.  One that fell below every
        timing stopped the comparisons (a mobilenet_block job's first comparison scored the
        default plan 0.156 ms while it ran 0.25 ms, and the job made no other comparison in
        its 10 minutes, NOTES 32); one that stood above them compared nearly every candidate
        (a gemm_bn job's score stood at 4.03 ms for a plan that ran 2.62 ms side by side, and
        298 of its 411 candidates were compared, none of them faster, NOTES 56).  A candidate
        that is not compared is scored on the score's scale instead (:meth:`run`)."""
        side = self.side_by_side_ms()
        return side if side is not None else self.best_ms

    def run(self, runner: IsolatedRunner, task: dict[str, Any], plan_hash: str, cap_s: float,
            hand_picked: bool = False) -> dict[str, Any]:
        """The plan's result: the earlier one if it was measured before, else built and
        measured now (within the adapted limits), with ``seconds`` it took; one timed below
        the best is confirmed against it first.  A ``hand_picked`` plan (a seed template or
        the stored best: a dozen per job, each a likely winner) is confirmed while it is timed
        below ``HAND_PICKED_GATE`` times that: on a busy machine a plan timed alone reads up to
        2x apart within seconds, and an mlp_gelu job whose fast_math seeds were timed alone 4%
        above the best never compared them, and found that 20% step by mutation after 8
        minutes (NOTES 38); a mobilenet_block job timed its `tall` seed alone at 0.350 ms, 1.9x
        the default plan's 0.181, where side by side it runs 7% faster (NOTES 41).
        The gate moves only when the best is timed beside a candidate, so when the machine
        slows after a quiet comparison, no candidate may time alone below it again: an
        attention job's gate stood at 0.269 ms from its 129th second, where the best ran
        0.26-0.46 ms side by side, and it compared none of the 530 candidates of its last 8
        minutes (NOTES 59).  So after ``STALE_AFTER`` candidates with no comparison, one timed
        alone below ``STALE_GATE`` times the gate is compared, and the best's time beside it
        moves the gate to what the machine runs now."""
        injected = bool(task.get("inject"))  # a test's fault: run it, and learn nothing from it
        known = None if injected else self.known(plan_hash)
        if known is not None:
            return known
        cutoff = self.cutoff_ms()
        timed_task = task if cutoff is None else {**task, "timing": {**task.get("timing", {}), "cutoff_ms": cutoff}}
        t0 = time.perf_counter()
        res = runner.run(timed_task, timeout_s=self.time_limit_s(cap_s))
        res["seconds"] = time.perf_counter() - t0
        if injected:
            return res
        below = self.compare_below_ms()
        if below is not None:
            below *= max(HAND_PICKED_GATE if hand_picked else 1.0, STALE_GATE if self.uncompared >= STALE_AFTER else 1.0)
        if (res["status"] == OK and below is not None and self.best_plan is not None
                and plan_hash != self.best_hash and res["median_ms"] < below):
            self.confirm(runner, task, res, cap_s)
        elif res["status"] == OK:
            self._scale_to_score(res)
        self.record(plan_hash, res, res["seconds"], task.get("plan"))
        return res

    def _scale_to_score(self, res: dict[str, Any]) -> None:
        """Score a candidate timed alone at or above the best's side-by-side time, and so not
        compared, on the scale of the best's score: ``value_ms = score * median /
        side-by-side time``, at least the score.  Compared candidates are scored on that
        scale (:meth:`confirm`); one scored by its lone median where the score stood above
        what the best runs at would read faster than the best, and become it, untested."""
        side = self.side_by_side_ms()
        if side is None or self.best_ms is None or res["median_ms"] < side:
            return  # no side-by-side time yet, or it could not be compared: its own median counts
        res["value_ms"] = self.best_ms * res["median_ms"] / side
        res["scaled"] = {"best_side_by_side_ms": side, "best_ms": self.best_ms}

    def confirm(self, runner: IsolatedRunner, task: dict[str, Any], res: dict[str, Any], cap_s: float) -> None:
        """Time a candidate that beat the best once against the best plan, interleaved for
        ``CONFIRM_ROUNDS`` rounds, and score it on the incumbent's scale:
        ``value_ms = base * candidate median / incumbent median`` (both from those
        rounds).  So it becomes the best only if it is faster in the same minutes, by what
        it is faster then; a candidate timed in a quiet moment of a busy machine does not.
        ``base`` is the best's value.  While that value is one lone timing (the first plans
        of a job are timed in a fresh worker, often slow), the first comparison lowers it to
        the incumbent's median in these rounds if that is lower: the scale starts from a
        side-by-side timing, whether the candidate then wins or ties (a tie scored on the
        lone timing kept a random-search job at its first plan's slow 2.46 ms, NOTES 22).
        It counts as faster only if it is faster in every round and by more than
        ``CONFIRM_MARGIN`` overall; anything else is a tie, scored ``base``.  A job makes
        dozens of these comparisons, and a memory-bound kernel's time varies by 10-20% from
        one fresh VM (new buffers) to the next: on the medians alone, tied candidates won
        often enough on that noise that the best's score drifted down by a third in 10
        minutes with nothing faster found (NOTES 21).
        A win is replicated: the comparison runs once more, and only a second win makes the
        candidate the best, scored by the smaller of its two gains.  Among hundreds of
        candidates tied with the best, some pass one comparison by luck, and their scores
        compounded: a gemm_bn job's score fell from 1.34 to 0.85 ms over ten wins of 3-9% each
        while every plan it compared ran 1.31-1.48 ms side by side (NOTES 53).  The first
        comparison chose the candidate for its ratio, so it is biased low; the replicate's is
        not biased, but noisy: an attention job's replicate met a slow incumbent and read a
        0.90 step as 0.82, and its score ended 21% below its plan's time (NOTES 53).
        A comparison in which the incumbent runs more than ``DISTURBED_FACTOR`` times its
        latest side-by-side median (:meth:`best_timed_ms`: its lone timing before the first
        comparison) is disturbed, and is run once more.  If the second one is
        disturbed too, the candidate counts as faster only if it also beats that earlier
        time: an attention job confirmed a slower plan as 1.5x faster against an
        incumbent that ran at 1.7x its time of 40 s before, and its score then stood for
        the rest of the job (NOTES 31).  The incumbent's median in that second comparison
        becomes its latest, so a machine that stays slower costs one decision, not all.
        If the comparison itself fails, the candidate keeps its own median; if the
        replicate fails, the first win is a tie."""
        assert self.best_ms is not None and self.best_plan is not None
        limit = 2 * self.time_limit_s(cap_s)  # at most two builds (both are usually kept), then the rounds
        recent = self.best_timed_ms()
        first = self._compare(runner, task, limit, recent)
        if "error" in first:
            res["confirm"] = {"vs": self.best_hash, "error": first["error"]}
            return
        if not self.best_compared:  # the best's value is one lone timing: the scale starts from this one
            self.best_ms, self.best_compared = min(self.best_ms, first["incumbent_ms"]), True
        decided = first
        if first["faster"]:  # the replicate decides
            again = self._compare(runner, task, limit, recent)
            decided = {**first, "faster": False, "replicate_error": again["error"]} if "error" in again else again
            decided["first"] = {k: v for k, v in first.items() if k not in ("rounds", "faster", "ratio")}
        ratio = decided.pop("ratio")
        if decided["faster"]:  # (a replicated win) by the smaller of its two gains
            ratio = max(ratio, first["ratio"])
        tie = max(1.0, decided["candidate_ms"] / decided["incumbent_ms"])
        res["value_ms"] = self.best_ms * (ratio if decided["faster"] else tie)
        res["confirm"] = {"vs": self.best_hash, **decided}

    def _compare(self, runner: IsolatedRunner, task: dict[str, Any], limit: float, recent: float | None) -> dict[str, Any]:
        """One side-by-side comparison of the candidate with the best (run once more if the
        best ran far above ``recent``, see :meth:`confirm`): its ``candidate_ms``,
        ``incumbent_ms``, ``rounds``, whether the candidate is ``faster``, and the ``ratio``
        that scores it if so; or an ``error``."""
        for attempts in (1, 2):
            cmp = runner.run({**task, "compare_with": self.best_plan, "rounds": CONFIRM_ROUNDS}, timeout_s=limit)
            if cmp["status"] != OK:
                return {"error": f"{cmp['status']}: {cmp.get('error', '')}"[:300]}
            cand, inc = cmp["median_ms"]
            disturbed = recent is not None and inc > DISTURBED_FACTOR * recent
            if not disturbed:
                break
        judged_against = recent if disturbed else inc
        every_round = all(c < i for c, i in zip(*cmp["round_ms"]))
        out = {"candidate_ms": cand, "incumbent_ms": inc, "rounds": CONFIRM_ROUNDS,
               "faster": every_round and cand < (1.0 - CONFIRM_MARGIN) * judged_against, "ratio": cand / judged_against}
        if attempts > 1:
            out.update(attempts=attempts, disturbed=disturbed, recent_ms=recent)
        return out
