"""Secondary blocks vectorized at most 64 lanes at a time (now) vs whole rows (before), interleaved.

    TVM_NUM_THREADS=2 .venv/bin/python benchmarks/ab_vector_lanes.py \
        [--db sqlite:///results/bench_10m/bench.db --study bench-mlp_gelu-1796135423 --space mlp_gelu]

Measures every plan whose schedule the cap changes, both ways, in the same process: each
space's default plan and seed plans, and (with --db) the fastest plans of a tuning study.
Prints per plan the median over 3 rounds of each variant's median of 5 repeats, with the
range (results/NOTES.md section 18).
"""

from __future__ import annotations

import argparse
import statistics

import optuna
import tvm

from autofuse import schedule
from autofuse.build import schedule_module
from autofuse.measure import TimingConfig
from autofuse.plan import Plan
from autofuse.runner import evaluate_plan
from autofuse.search import PlanSpace
from autofuse.space import space_names
from autofuse.target import parse_target
from autofuse.workload import get_workload

LLVM = parse_target("llvm")
CAPPED, UNCAPPED = schedule.MAX_VECTOR_LANES, 10**9


def _script(w, plan: Plan, lanes: int) -> str:
    schedule.MAX_VECTOR_LANES = lanes
    mod = schedule_module(w.graph(plan.fold_params), plan, LLVM)
    return "\n".join(f.script() for _, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc))


def _seed_plans(space: str):
    w = get_workload(space)
    ps = PlanSpace(w)
    yield w, w.reference_plan("default")
    for params, _label in ps.seed_trials():
        study = optuna.create_study()
        study.enqueue_trial(params)
        yield w, ps.suggest(study.ask())[0]


def _study_plans(db: str, study: str, space: str, top: int):
    w = get_workload(space)
    trials = optuna.load_study(study_name=study, storage=db).get_trials(deepcopy=False)
    ok = sorted((t for t in trials if t.user_attrs.get("status") == "ok"), key=lambda t: t.value)
    seen = set()
    for t in ok:
        if t.user_attrs["plan_hash"] not in seen and len(seen) < top:
            seen.add(t.user_attrs["plan_hash"])
            yield w, Plan.from_json(t.user_attrs["plan"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db")
    ap.add_argument("--study")
    ap.add_argument("--space")
    ap.add_argument("--top", type=int, default=20, help="fastest distinct plans of the study to look at")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    cfg = TimingConfig(repeats=5, min_repeat_ms=50, warmup=2)
    candidates = [p for s in space_names() for p in _seed_plans(s)]
    if args.db:
        candidates += list(_study_plans(args.db, args.study, args.space, args.top))
    for w, plan in candidates:
        if _script(w, plan, UNCAPPED) == _script(w, plan, CAPPED):
            continue
        times: dict[int, list[float]] = {UNCAPPED: [], CAPPED: []}
        for _ in range(args.rounds):
            for lanes, acc in times.items():
                schedule.MAX_VECTOR_LANES = lanes
                res = evaluate_plan(w, plan, LLVM, cfg)
                if res["status"] != "ok":
                    raise SystemExit(f"{w.space.name} {plan.hash}: {res['status']} {res.get('error')}")
                acc.append(res["median_ms"])
        old, new = statistics.median(times[UNCAPPED]), statistics.median(times[CAPPED])
        print(f"{w.space.name:20s} {plan.hash} whole rows {old:.4f} ms ({min(times[UNCAPPED]):.4f}-"
              f"{max(times[UNCAPPED]):.4f})  capped {new:.4f} ms ({min(times[CAPPED]):.4f}-{max(times[CAPPED]):.4f})"
              f"  ratio {old / new:.3f}", flush=True)
    schedule.MAX_VECTOR_LANES = CAPPED


if __name__ == "__main__":
    main()
