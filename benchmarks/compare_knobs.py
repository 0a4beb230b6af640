"""Default plan vs the same plan with knob overrides on its convolution or GEMM groups, interleaved.

    .venv/bin/python benchmarks/compare_knobs.py conv_bn_relu \
        '{"rows": {"outer_first": 2, "parallel": 1, "producer_at": 0}}'
    .venv/bin/python benchmarks/compare_knobs.py mlp_gelu --kind gemm '{"cols": {"outer_first": 1}}'
    .venv/bin/python benchmarks/compare_knobs.py conv_bn_relu --base results/plans/conv_bn_relu_s13_best.json \
        '{"pack": {"pack_weight": true}, "pack+channels": {"pack_weight": true, "vector_axis": 1}}'

Prints, per variant, the median of 10 repeats in each of 3 rounds (ms); every variant is
checked against the reference first.  ``--kind`` picks the groups the overrides apply to:
``conv`` (anchor with 4+ spatial loops and a reduction), ``gemm`` (2-3 spatial loops and a
reduction) or ``all``.  With ``--old-default``, the variant "old-default" is the
convolution schedule autofuse used before rows-first (results/NOTES.md section 9).
With ``--fast-math``, every variant is also measured with the plan's ``fast_math`` on
(results/NOTES.md section 14).  With ``--base PLAN.json``, the variants start from that
plan (its partition and schedules, the overrides merged into the chosen groups'), and
"default" names the plan itself.
"""

from __future__ import annotations

import argparse
import json

from autofuse.build import group_anchor, partition_of
from autofuse.measure import TimingConfig
from autofuse.plan import Plan
from autofuse.runner import evaluate_plan
from autofuse.target import parse_target
from autofuse.workload import get_workload

OLD_DEFAULT = {"outer_first": 0, "parallel": 2, "producer_at": 2}  # channels outermost


def _chosen(nest, kind: str) -> bool:
    if kind == "all":
        return True
    if not nest.reduce:
        return False
    return len(nest.spatial) >= 4 if kind == "conv" else 2 <= len(nest.spatial) <= 3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("space")
    ap.add_argument("variants", nargs="?", default="{}", help="JSON: name -> knob overrides for the chosen groups")
    ap.add_argument("--kind", choices=("conv", "gemm", "all"), default="conv")
    ap.add_argument("--old-default", action="store_true")
    ap.add_argument("--fast-math", action="store_true", help="also each variant with fast_math on")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--base", help="a plan file to start from instead of the default plan")
    args = ap.parse_intermixed_args()
    variants = {"default": {}, **json.loads(args.variants)}
    if args.old_default:
        variants["old-default"] = OLD_DEFAULT
    w = get_workload(args.space)
    g = w.graph(True)
    base = Plan.from_json(open(args.base).read()) if args.base else w.resolve_plan("default")
    groups = partition_of(g, base)
    given = {tuple(sorted(g.index()[o] for o in grp)): sch for grp, sch in zip(base.groups, base.schedules)}
    plans = {}
    for name, overrides in variants.items():
        schedules = []
        for group in groups:
            _, nest = group_anchor(g, group)
            schedules.append({**given[group], **(overrides if _chosen(nest, args.kind) else {})})
        d = json.loads(base.to_json())
        d["groups"] = [{"ops": [g.ops[i].name for i in group], "schedule": s} for group, s in zip(groups, schedules)]
        plans[name] = Plan.from_json(json.dumps(d))
        if args.fast_math:
            plans[f"{name}+fast"] = Plan.from_json(json.dumps({**d, "fast_math": True}))
    target = parse_target("llvm")
    cfg = TimingConfig(repeats=10, min_repeat_ms=50, warmup=2)
    times: dict[str, list[float]] = {n: [] for n in plans}
    for _ in range(args.rounds):
        for name, plan in plans.items():
            res = evaluate_plan(w, plan, target, cfg)
            if not res["correct"]:
                raise SystemExit(f"{name}: {res.get('error') or 'wrong result'}")
            times[name].append(res["median_ms"])
    for name, ts in times.items():
        print(f"{args.space:18s} {name:12s} " + " ".join(f"{t:.3f}" for t in ts))


if __name__ == "__main__":
    main()
