"""Winograd against direct: build time and speed of a space's Winograd plan (the ``winograd``
knob on every convolution that can take it, default partition) next to a direct plan (a plan
JSON file, e.g. ``autofuse best conv_bn_relu --target llvm --db sqlite:///results/bench/bench.db
> best.json``), timed in interleaved rounds (NOTES 40).

    TVM_NUM_THREADS=2 python benchmarks/winograd_probe.py conv_bn_relu best.json [--tile 4] [--rounds 6] \
        [--knobs '{"wino_rows": 7, "wino_cols": 8}']

(Until session 24 this script probed topi's NCHW Winograd under the generic scheduler: 0.18-0.37x
of the direct plan's speed, NOTES 39; ``git show 5e9f13d:benchmarks/winograd_probe.py``.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from autofuse import winograd
from autofuse.build import anchor_op, build
from autofuse.graph import default_partition
from autofuse.measure import Session, TimingConfig, compare
from autofuse.plan import Plan
from autofuse.target import parse_target
from autofuse.workload import get_workload


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("space")
    ap.add_argument("direct_plan")
    ap.add_argument("--tile", type=int, default=4, choices=(2, 4))
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--knobs", default="{}", help="JSON knobs for every Winograd group (wino_rows, wino_cols)")
    args = ap.parse_args()
    target = parse_target("llvm")
    w = get_workload(args.space)
    g = w.graph(True)
    part = default_partition(g)
    knobs = {"winograd": args.tile, **json.loads(args.knobs)}
    schedules = [dict(knobs) if winograd.eligible(g, anchor_op(g, grp)) else {} for grp in part]
    plans = {"direct": Plan.from_json(open(args.direct_plan).read()),
             "winograd": w.partition_plan(part, True, "winograd", schedules)}
    sessions, inputs = {}, {}
    acts, expected = w.check_data()
    for label, plan in plans.items():
        start = time.perf_counter()
        ex = build(w.graph(plan.fold_params), plan, target)
        print(f"{label}: built in {time.perf_counter() - start:.2f} s")
        sessions[label] = Session(ex, target)
        inputs[label] = w.runtime_inputs(plan.fold_params, acts)
        ok, err = compare(sessions[label](sessions[label].to_device(inputs[label])), expected, w.space.rtol, w.space.atol)
        if not ok:
            raise SystemExit(f"{label}: wrong result (relative error {err:.3g})")
    cfg = TimingConfig(repeats=3, min_repeat_ms=50)
    times: dict[str, list[float]] = {label: [] for label in plans}
    for r in range(args.rounds):
        for label in list(plans)[:: 1 if r % 2 == 0 else -1]:
            times[label].append(statistics.median(sessions[label].time(inputs[label], cfg)))
    for label, t in times.items():
        print(f"{label:9s} {statistics.median(t):.3f} ms  {[round(x, 3) for x in t]}")
    d, wn = statistics.median(times["direct"]), statistics.median(times["winograd"])
    print(f"direct / winograd = {d / wn:.2f}x  (F({args.tile}x{args.tile}, 3x3), knobs {knobs})")


if __name__ == "__main__":
    main()
