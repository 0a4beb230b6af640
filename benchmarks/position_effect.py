"""Does a plan time slower right after the bench's NumPy (or onnxruntime) column than right
after another TVM plan?  (NOTES 31: why the bench's rounds rotate their order.)

    python benchmarks/position_effect.py SPACE BENCH_DB PLAN_E PLAN_F ROUNDS

BENCH_DB: a bench's plan database file (``results/<dir>/bench.db``, or a copy); PLAN_E,
PLAN_F: hashes of plans of SPACE stored there (the bench's JSON names them).  Per round:
the NumPy reference timed as the bench times it, then E; F, then E; onnxruntime, then E;
F, then F; NumPy, then F.  Each timing is 3 repeats of at least 50 ms, as in the bench;
printed: median, min and max per position."""

import statistics
import sys

from autofuse.bench.columns import _vm_runnable, time_python
from autofuse.build import build
from autofuse.db import PlanDB
from autofuse.peers import onnx_model, onnxruntime_session
from autofuse.plan import Plan
from autofuse.target import num_threads, parse_target
from autofuse.workload import get_workload


def main(space: str, db_path: str, plan_e: str, plan_f: str, rounds: int) -> None:
    w, target = get_workload(space), parse_target("llvm")

    def plan(plan_hash: str) -> Plan:
        with PlanDB(f"sqlite:///{db_path}", create=False, readonly=True) as db:
            plan_json = db.plan_json(w.hash, plan_hash)
        if plan_json is None:
            sys.exit(f"no plan {plan_hash} of {space} in {db_path}")
        return Plan.from_json(plan_json)

    acts, expected = w.check_data()
    e, f = [_vm_runnable(name, lambda p=p: build(w.graph(p.fold_params), p, target), w, p.fold_params, target)
            for name, p in (("E", plan(plan_e)), ("F", plan(plan_f)))]
    ref_inputs = {**acts, **w.params}
    sess = onnxruntime_session(onnx_model(w.space, w.params, expected.shape), num_threads())

    def numpy_col() -> None:
        time_python(lambda: w.space.reference(**ref_inputs), 50, 3)

    def ort_col() -> None:
        time_python(lambda: sess.run(None, dict(acts)), 50, 3)

    res: dict[str, list[float]] = {k: [] for k in ("E after numpy", "E after F", "E after ort", "F after F",
                                                   "F after numpy")}
    for _ in range(rounds):
        numpy_col(); res["E after numpy"] += e.timer(3, 50)
        f.timer(3, 50); res["E after F"] += e.timer(3, 50)
        ort_col(); res["E after ort"] += e.timer(3, 50)
        f.timer(3, 50); res["F after F"] += f.timer(3, 50)
        numpy_col(); res["F after numpy"] += f.timer(3, 50)
    for k, v in res.items():
        print(f"{k:14s} median {statistics.median(v):.4f} ms  min {min(v):.4f}  max {max(v):.4f}  n={len(v)}")


if __name__ == "__main__":
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    main(*sys.argv[1:5], int(sys.argv[5]))
