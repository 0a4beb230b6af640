"""Do plans hold their speed?  Time stored plans over many rounds, each in a fresh worker:
python benchmarks/plan_stability.py DB_URL SPACE PLAN... [--rounds 14] [--variant NAME=PLAN:GROUP:knob=v,knob=v]

PLAN is a plan hash (or a unique prefix) stored in DB_URL for SPACE.  A variant is a stored
plan with some schedule knobs of one group changed (to find which knob makes a plan
unstable).  Every round starts a fresh worker and times each plan twice, interleaved (A B C,
then C B A), with the final re-measurement's timing; every run is checked against NumPy.
Prints one line per round, then per plan the median, 75th percentile and max of its runs'
medians: a plan whose 75th percentile is far above its median is fast in some minutes and
slow in others (NOTES 33)."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict

from sqlalchemy import select

from autofuse.db import PlanDB, af_plans
from autofuse.job import JobConfig, runs_p75
from autofuse.runner import OK, IsolatedRunner, interleaved
from autofuse.workload import get_workload


def stored_plan(db: PlanDB, prefix: str) -> tuple[str, str]:
    """(full hash, plan JSON) of the one stored plan whose hash starts with ``prefix``."""
    with db.engine.connect() as c:
        rows = c.execute(select(af_plans.c.plan_hash, af_plans.c.plan_json)
                         .where(af_plans.c.plan_hash.startswith(prefix)).distinct()).all()
    if len({h for h, _ in rows}) != 1:
        raise SystemExit(f"plan {prefix!r}: {len(rows)} stored plans match, need exactly one")
    return rows[0][0], rows[0][1]


def variant(plan_json: str, spec: str) -> str:
    """``GROUP:knob=v,knob=v`` applied to a plan's JSON (values parsed as JSON)."""
    group, _, knobs = spec.partition(":")
    plan = json.loads(plan_json)
    for kv in knobs.split(","):
        key, _, value = kv.partition("=")
        plan["groups"][int(group)]["schedule"][key] = json.loads(value)
    return json.dumps(plan, sort_keys=True, separators=(",", ":"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db_url")
    ap.add_argument("space")
    ap.add_argument("plans", nargs="+")
    ap.add_argument("--rounds", type=int, default=14)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--variant", action="append", default=[], help="NAME=PLAN:GROUP:knob=v,knob=v")
    args = ap.parse_args()

    plans: dict[str, str] = {}
    with PlanDB(args.db_url, create=False, readonly=True) as db:
        for prefix in args.plans:
            h, plan_json = stored_plan(db, prefix)
            plans[h[:8]] = plan_json
        for v in args.variant:
            name, _, spec = v.partition("=")
            base, _, rest = spec.partition(":")
            plans[name] = variant(stored_plan(db, base)[1], rest)
    get_workload(args.space, args.tiny)  # an unknown space fails here, before any worker starts
    cfg = JobConfig(space=args.space, tiny=args.tiny)
    task = {"space": args.space, "tiny": args.tiny, "target": cfg.target_obj().spec_json,
            "timing": asdict(cfg.final_timing)}
    names = list(plans)
    runs: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        with IsolatedRunner(120) as runner:  # a fresh worker every round
            for i in interleaved(len(names), 2):
                res = runner.run({**task, "plan": plans[names[i]]})
                if res["status"] != OK:
                    raise SystemExit(f"plan {names[i]}: {res['status']}: {res.get('error', '')}")
                runs[names[i]].append(statistics.median(res["samples_ms"]))
        print(time.strftime("%H:%M:%S"), f"round {r}", "  ".join(
            f"{n} {' '.join(f'{x:.3f}' for x in runs[n][-2:])}" for n in names), flush=True)
    for n in names:
        s = runs[n]
        print(f"{n:>12}  median {statistics.median(s):.4f}  p75 {runs_p75(s):.4f}  max {max(s):.4f} ms"
              f"  ({len(s)} runs)")


if __name__ == "__main__":
    main()
