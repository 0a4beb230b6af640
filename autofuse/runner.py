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
import time
import traceback
from dataclasses import asdict
from typing import Any

from autofuse.measure import Session, TimingConfig, measure
from autofuse.plan import Plan, PlanError
from autofuse.target import Target, parse_target
from autofuse.workload import Workload, get_workload

# Statuses a candidate can end in; only "ok" has a time that counts.
OK, WRONG, REJECTED, BUILD_ERROR, TIMEOUT, CRASHED, ERROR = "ok", "wrong", "rejected", "build_error", "timeout", "crashed", "error"


def evaluate_plan(w: Workload, plan: Plan, target: Target, cfg: TimingConfig) -> dict[str, Any]:
    """Build, check and time ``plan`` here. Plan/schedule errors propagate to the caller."""
    from autofuse.build import build

    w.check_plan(plan)
    t0 = time.perf_counter()
    ex = build(w.graph(plan.fold_params), plan, target)
    build_s = time.perf_counter() - t0
    acts, expected = w.check_data()
    session = Session(ex, target)
    t1 = time.perf_counter()
    m = measure(session, w.runtime_inputs(plan.fold_params, acts), expected, w.space.rtol, w.space.atol, cfg)
    out = m.as_dict()
    out.update(status=OK if m.correct else WRONG, build_s=build_s, run_s=time.perf_counter() - t1)
    return out


def run_task(task: dict[str, Any]) -> dict[str, Any]:
    """One candidate from plain data (what crosses the process boundary); never raises."""
    from autofuse.build import BuildError
    from autofuse.schedule import ScheduleRejected

    t0 = time.perf_counter()
    try:
        _maybe_inject_fault(task.get("inject"))
        w = get_workload(task["space"], task.get("tiny", False))
        plan = Plan.from_json(task["plan"])
        target = parse_target(task["target"])
        cfg = TimingConfig(**task.get("timing", {}))
        return evaluate_plan(w, plan, target, cfg)
    except (PlanError, ScheduleRejected) as e:
        return {"status": REJECTED, "correct": False, "error": str(e), "build_s": time.perf_counter() - t0}
    except BuildError as e:
        return {"status": BUILD_ERROR, "correct": False, "error": str(e), "build_s": time.perf_counter() - t0}
    except MemoryError:
        return {"status": ERROR, "correct": False, "error": "out of memory (worker memory limit)"}
    except Exception as e:
        last = traceback.format_exception_only(type(e), e)[-1].strip()
        return {"status": ERROR, "correct": False, "error": last[:500]}


def _maybe_inject_fault(kind: str | None) -> None:
    """Test hook: faults a candidate can cause, honoured only with AUTOFUSE_FAULT_INJECTION=1."""
    if not kind or os.environ.get("AUTOFUSE_FAULT_INJECTION") != "1":
        return
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


def _worker_main(conn: Any, mem_limit_mb: int | None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
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
        conn.send(run_task(task))


class IsolatedRunner:
    """Runs tasks in a worker process; restarts it after a crash or a timeout."""

    def __init__(self, timeout_s: float = 120.0, mem_limit_mb: int | None = None):
        self.timeout_s = timeout_s
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
        if self._proc is not None:
            if self._proc.is_alive():
                self._proc.kill()
            self._proc.join(5)
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None

    def run(self, task: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        if self._proc is None or not self._proc.is_alive():
            if self._proc is not None:
                self.restarts += 1
                self._kill()
            self._start()
        limit = timeout_s or self.timeout_s
        self._conn.send(task)
        try:
            if self._conn.poll(limit):
                return self._conn.recv()
            self._kill()
            return {"status": TIMEOUT, "correct": False, "error": f"candidate timed out after {limit:.0f} s (worker killed)"}
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
