"""One line per space of a bench report, with what the issue's targets read, then the geomeans:
python benchmarks/bench_summary.py results/bench_10m_znver5/bench.json

Per space: when it ran, autofuse's median and spread (ms), each peer's time over autofuse's
(MetaSchedule, onnxruntime), autofuse over the roofline floor, the best plan at 30% of the
budget timed side by side with the final best (final over early, >= 0.95 meets the 3-minute
target), and random search at equal trials timed side by side (random over guided; "seeded"
when random search measured autofuse's seed templates first, "plain" when it did not)."""

import json
import math
import sys


def _r(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def summary(report: dict) -> list[str]:
    lines = []
    spaces = report["spaces"]
    for r in spaces:
        af, q = r["columns"]["autofuse"], r["ratios_vs_autofuse"]
        early = (r.get("autofuse_early_best") or {}).get("final_over_early")
        vs_random = r.get("search_vs_random") or {}
        rand = (vs_random.get("side_by_side") or {}).get("random_over_guided")
        rand_text = "-" if rand is None else f"{rand:.3f} ({'seeded' if vs_random.get('random_seeded', True) else 'plain'})"
        lines.append(f"{r['space']:<20} {r['date'][:16]}  autofuse {af['median_ms']:.3f} (±{af['spread_ms']:.3f}) ms  "
                     f"MS {_r(q.get('tvm-metaschedule'))}x  ORT {_r(q.get('onnxruntime'))}x  "
                     f"af/roofline {_r(r.get('autofuse_over_roofline'))}  early {_r(early, 3)}  random {rand_text}")
    for peer in ("tvm-metaschedule", "onnxruntime"):
        ratios = [r["ratios_vs_autofuse"][peer] for r in spaces if r["ratios_vs_autofuse"].get(peer)]
        if ratios:
            lines.append(f"geomean {peer}: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}x over {len(ratios)}")
    return lines


if __name__ == "__main__":
    print("\n".join(summary(json.load(open(sys.argv[1])))))
