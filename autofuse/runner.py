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
from typing import Any

from autofuse.measure import Session, TimingConfig, measure
from autofuse.plan import Plan, PlanError
from autofuse.target import Target, parse_target
from autofuse.workload import Workload, get_workload

# Statuses a candidate can end in; only "ok" has a time that counts.
OK, WRONG, REJECTED, BUILD_ERROR, TIMEOUT, CRASHED, ERROR = "ok", "wrong", "rejected", "build_error", "timeout", "crashed", "error"


def evaluate_plan(w: Workload, plan: Plan, target: Target, cfg: TimingConfig, *, corrupt: bool = False) -> dict[str, Any]:
    """Build, check and time ``plan`` here. Plan/schedule errors propagate to the caller.

    ``corrupt`` (fault injection only): after scheduling, the kernel that writes the
    output is made to write only part of it, so the correctness check must catch it."""
    from autofuse.build import build, compile_module, schedule_module

    w.check_plan(plan)
    t0 = time.perf_counter()
    if corrupt:
        ex = compile_module(_corrupt_output_kernel(schedule_module(w.graph(plan.fold_params), plan, target)), target)
    else:
        ex = build(w.graph(plan.fold_params), plan, target)
    build_s = time.perf_counter() - t0
    acts, expected = w.check_data()
    session = Session(ex, target)
    inputs = w.runtime_inputs(plan.fold_params, acts)
    t1 = time.perf_counter()
    try:
        m = measure(session, inputs, expected, w.space.rtol, w.space.atol, cfg,
                    timing_inputs=_timing_inputs(w, plan.fold_params))
    finally:
        del session
        _scrub(ex, target, inputs)
    out = m.as_dict()
    out.update(status=OK if m.correct else WRONG, build_s=build_s, run_s=time.perf_counter() - t1)
    return out


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
        if "model" in task:  # {"model": "/abs/model.onnx", "shapes": {...}, "region": hash?}
            import json as _json

            from autofuse.onnx_import import MODEL_PREFIX

            spec = {"path": task["model"], "shapes": task.get("shapes") or {}}
            if task.get("region"):
                spec["region"] = task["region"]
            w = get_workload(MODEL_PREFIX + _json.dumps(spec, sort_keys=True, separators=(",", ":")))
        else:
            w = get_workload(task["space"], task.get("tiny", False))
        plan = Plan.from_json(task["plan"])
        target = parse_target(task["target"])
        cfg = TimingConfig(**task.get("timing", {}))
        return evaluate_plan(w, plan, target, cfg, corrupt=corrupt)
    except (PlanError, ScheduleRejected) as e:
        return {"status": REJECTED, "correct": False, "error": str(e), "build_s": time.perf_counter() - t0}
    except BuildError as e:
        return {"status": BUILD_ERROR, "correct": False, "error": str(e), "build_s": time.perf_counter() - t0}
    except MemoryError:
        return {"status": ERROR, "correct": False, "error": "out of memory (worker memory limit)"}
    except Exception as e:
        last = traceback.format_exception_only(type(e), e)[-1].strip()
        return {"status": ERROR, "correct": False, "error": last[:500]}


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
        if self._proc is not None and self._proc.pid is not None:  # pid is None: start() itself failed
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
