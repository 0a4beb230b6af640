"""The bench as text: table cells (terminal and markdown) and the markdown report that
results/README.md shows."""

from __future__ import annotations

from typing import Any

from autofuse.bench.columns import COLUMNS, PAIRED_PEERS, PAIRED_TIMINGS, PAIRS_PER_BUILD
from autofuse.bench.curves import random_kind
from autofuse.bench.roofline import COPY_FLOATS


def cell(result: dict[str, Any], column: str, *, markdown: bool) -> str:
    """One table cell: median (spread) and the peer/autofuse ratio, or why the column failed."""
    col = result["columns"].get(column)
    if not col:
        return "n/a"
    if col["median_ms"] is None:
        why = (col["error"] or "failed")[:50]
        return f"failed: {why}" if markdown else f"[red]{why}[/]"
    text = f"{col['median_ms']:.3f} (±{col['spread_ms']:.3f})"
    ratio = (result.get("ratios_vs_autofuse") or {}).get(column)
    if ratio and column != "autofuse":
        text += f" **{ratio:.2f}x**" if markdown else f" ({ratio:.2f}×)"
    return text


def random_cell(cmp: dict[str, Any] | None) -> str:
    """``random ms / guided ms`` at equal trials (side by side, and by each job's scores) and,
    by scores, at the end of the same budget; plain or seeded random search (reports without
    the mark were seeded)."""
    if not cmp or not cmp.get("random_over_guided"):
        return ""
    sbs = (cmp.get("side_by_side") or {}).get("random_over_guided")
    how = "back to back" if "paired" in (cmp.get("side_by_side") or {}) else "side by side in the rounds"
    return (f"{random_kind(cmp)}: " + (f"**{sbs:.2f}x** {how} at {cmp['equal_trials']} measured; scores: " if sbs else "scores: ")
            + f"{cmp['random_over_guided']:.2f}x at {cmp['equal_trials']} measured, "
            f"{cmp['same_budget_random_over_guided']:.2f}x at the budget "
            f"({cmp['random_trials']} vs {cmp['guided_trials']} measured)")


def early_cell(early: dict[str, Any] | None) -> str:
    """How close what a job of 30% of the budget returns came to the final plan, timed side
    by side.  Reports of earlier versions took the best-scored plan at that point instead
    (no ``early_final`` in their JSON), or compared the two plans' medians in the rounds
    rather than back to back (no ``paired``); their cells say so, and so does a cell whose
    3-minute final saw both of the host's speed levels."""
    if not early:
        return ""
    if not early.get("early_plan"):
        return f"no verified plan yet at {early['at_s']:.0f} s"
    if not early.get("final_over_early"):
        return early.get("error", "")
    same = " (the same plan)" if early["early_plan"] == early["final_plan"] else ""
    if "early_final" not in early:
        how = " (best score then)"
    elif "paired" in early or same:
        how = ""
    else:
        how = " (medians of the rounds)"
    if (early.get("early_final") or {}).get("slow_rounds"):
        how += ", its final in both speed levels"
    return f"{100 * early['final_over_early']:.0f}% of the final best at {early['at_s']:.0f} s{same}{how}"


def paired_cell(result: dict[str, Any], peer: str, *, markdown: bool = True) -> str:
    """The peer's time over autofuse's, timed back to back (the median of the pairs' ratios,
    and their quartiles); empty where the report has no such pair (a peer not run, or a
    report from before these pairs)."""
    return _pair_text((result.get("paired_vs_autofuse") or {}).get(peer) or {}, f"{peer}_over_autofuse", markdown)


def roofline_cell(result: dict[str, Any], *, markdown: bool = True) -> str:
    """autofuse's time over its roofline floor's, the floor's peak kernel timed back to back
    with the plan (``roofline_paired``); empty in reports from before these pairs."""
    return _pair_text(result.get("roofline_paired") or {}, "autofuse_over_roofline", markdown)


def _pair_text(pair: dict[str, Any], key: str, markdown: bool) -> str:
    ratio, q = pair.get(key), pair.get("paired")
    if pair.get("error"):
        return f"failed: {pair['error'][:50]}"
    if not ratio or not q:
        return ""
    return f"**{ratio:.2f}x** ({q['q1']:.2f}-{q['q3']:.2f})" if markdown else f"{ratio:.2f}× ({q['q1']:.2f}-{q['q3']:.2f})"


def paired_peers(report: dict[str, Any]) -> list[str]:
    """The peers some space of the report has timed back to back with autofuse."""
    return [p for p in PAIRED_PEERS if any(paired_cell(r, p) for r in report["spaces"])]


def report_columns(report: dict[str, Any]) -> list[str]:
    """The columns any space of the report has, in table order (an ``--append`` report may
    hold columns this run did not run)."""
    return [c for c in COLUMNS if any(c in r["columns"] for r in report["spaces"])]


def peer_geomeans(report: dict[str, Any]) -> dict[str, float]:
    """Autofuse's geomean speedup over each peer column; empty when autofuse ran alone
    (``--columns autofuse``), and then the table and the CLI say nothing about geomeans."""
    return {k: v for k, v in report.get("geomean_speedup_of_autofuse", {}).items() if k != "autofuse"}


def runs_of(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs that measured the report's spaces (one, for a report from before ``--append``)."""
    return report.get("runs") or [{"date": report["date"], "spaces": [r["space"] for r in report["spaces"]],
                                   "peaks": report["peaks"]}]


def below_roofline(row: dict[str, Any]) -> bool:
    """Whether autofuse ran faster than the space's roofline floor, in the rounds or back to
    back with the floor's kernel (the report says why)."""
    back_to_back = (row.get("roofline_paired") or {}).get("autofuse_over_roofline")
    return min(row.get("autofuse_over_roofline") or 1.0, back_to_back or 1.0) < 1.0


def cache_resident(report: dict[str, Any]) -> list[tuple[dict[str, Any], int]]:
    """The rows below their roofline whose bytes fit in the last-level cache of the machine
    that measured them, with that cache's size (runs from before it was recorded: none)."""
    cache_of = {space: run["peaks"].get("last_level_cache_bytes") for run in runs_of(report) for space in run["spaces"]}
    return [(r, llc) for r in report["spaces"]
            if below_roofline(r) and (llc := cache_of.get(r["space"])) and r.get("bytes") and r["bytes"] <= llc]


def renewed_spaces(report: dict[str, Any]) -> list[str]:
    """The spaces whose columns were built anew during their timings (``builds`` > 1)."""
    return [r["space"] for r in report["spaces"] if any(c.get("builds", 1) > 1 for c in r["columns"].values())]


def markdown_report(report: dict[str, Any], command: str = "") -> str:
    """The bench as a markdown table (what results/README.md shows)."""
    cols = report_columns(report)
    runs = runs_of(report)
    when = runs[0]["date"] if len(runs) == 1 else f"in {len(runs)} runs (" + "; ".join(
        f"{run['date']}: {', '.join(run['spaces'])}" for run in runs) + ")"
    lines = [f"Measured {when} on this machine ({report['threads']} threads, TVM {report['tvm_version']}), "
             f"tuning budget {report['budget_s']:.0f} s per space for autofuse and MetaSchedule alike; "
             f"{report['rounds']} interleaved rounds x {report['repeats']} repeats, median (spread = max-min) in ms.",
             "Peaks measured by the same command: " + "; ".join(
                 f"{run['peaks']['peak_gflops']:.0f} GFLOP/s ({run['peaks'].get('peak_source', 'numpy')} SGEMM "
                 f"2048^3), {run['peaks']['bandwidth_gbs']:.1f} GB/s (copy)" + (f" ({run['date']})" if len(runs) > 1 else "")
                 for run in runs) + ".", ""]
    if rebuilt := renewed_spaces(report):
        every = "" if len(rebuilt) == len(report["spaces"]) else f" (in {', '.join(rebuilt)})"
        lines += [f"Each TVM and onnxruntime column{every} was built anew for every round after the first and before "
                  f"every {PAIRS_PER_BUILD} back-to-back pairs, each build checked against the reference: where a "
                  "build's buffers land in memory can move its time for as long as it lives.", ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    vs_random = any("search_vs_random" in r for r in report["spaces"])
    lines.append("| space | " + " | ".join(cols) + " | roofline | autofuse/roofline | trials | 95% of best at (scores) "
                 "| at 30% of the budget, side by side |" + (" random search at equal trials |" if vs_random else ""))
    lines.append("|---" * (len(cols) + 6 + vs_random) + "|")
    for r in report["spaces"]:
        row = [r["space"]]
        row += [cell(r, c, markdown=True) for c in cols]
        row.append(f"{r['roofline_ms']:.3f}" if r.get("roofline_ms") else "")
        row.append(f"{r['autofuse_over_roofline']:.2f}x" if r.get("autofuse_over_roofline") else "")
        if "autofuse_model_job" in r:  # a whole model: trials over all its regions
            row.append(f"{r['autofuse_model_job'].get('trials', '')} (all regions)")
        else:
            job = r.get("autofuse_job") or {}
            trials = job.get("trials_this_job", "")
            row.append(f"{trials} ({job['measured']} built)" if job.get("measured") is not None and trials != "" else str(trials))
        at = r.get("autofuse_95pct_at_s")
        row.append(f"{at:.0f} s" if at is not None else "")
        row.append(early_cell(r.get("autofuse_early_best")))
        if vs_random:
            row.append(random_cell(r.get("search_vs_random")))
        lines.append("| " + " | ".join(row) + " |")
    paired = paired_peers(report)
    floors = any(roofline_cell(r) for r in report["spaces"])
    if paired or floors:
        lines += ["", f"Back to back with autofuse: peer time / autofuse time, the median over {PAIRED_TIMINGS} pairs of "
                  "timings taken right after each other (A B, then B A, ...), with the quartiles: the ratio the "
                  "rounds' medians above give, read without the host's speed levels (a tie at the roofline "
                  "can read a few percent either way in the rounds)."
                  + (" autofuse/roofline: autofuse's time over its floor's, the kernel that measured the peak "
                     "bounding the space (the copy for bytes, the SGEMM for FLOPs) timed beside the plan, its "
                     "time scaled to the space's bytes or FLOPs: the floor at the speed the host runs at "
                     "that moment, where the table above divides by the fastest run at the start." if floors else ""),
                  "", "| space | " + " | ".join(paired + ["autofuse/roofline"] * floors) + " |",
                  "|---" * (len(paired) + floors + 1) + "|"]
        lines += ["| " + " | ".join([r["space"], *(paired_cell(r, p) for p in paired),
                                     *([roofline_cell(r)] * floors)]) + " |" for r in report["spaces"]]
    if peers := peer_geomeans(report):
        lines += ["", "Bold: peer time / autofuse time (>1 means autofuse is faster). Geometric mean over spaces: "
                  + ", ".join(f"{k} {v:.2f}x" for k, v in peers.items()) + "."]
    if any(below_roofline(r) for r in report["spaces"]):
        resident = cache_resident(report)
        in_cache = ", ".join(f"{r['space']}'s {r['bytes'] / 1e6:.1f} MB" for r, _ in resident)
        caches = sorted({llc for _, llc in resident})
        lines += ["", "autofuse/roofline below 1x: the roofline counts the FLOPs of the graph as written (a "
                  "convolution computed directly); a plan that computes the same function with fewer "
                  "(a Winograd convolution, the `winograd` knob) can run below it. Its bandwidth is a "
                  f"{COPY_FLOATS * 4 >> 20} MiB copy's, from DRAM: a space whose bytes fit in the last-level cache stays there between "
                  "repeats and can run faster"
                  + (f" ({in_cache}, in this machine's {' / '.join(f'{c / 2**20:.0f}' for c in caches)} MiB)"
                     if in_cache else "")
                  + ", one a few times larger still keeps part of them there, and half of a copy's bytes are "
                  "writes, each of which reads its cache line first, where most spaces mostly read. And the "
                  "peaks are measured once, at the start of each run, on a shared host: a plan at the roofline "
                  "can read a few percent under it in the main table (the back-to-back one times the floor "
                  "beside the plan)."]
    lines += ["", "95% of best at (scores): when the job's best-so-far score first came within 5% of its final "
              "score. A score chains the side-by-side ratios that made each plan the best, noise included, so "
              "the next column checks it: the plan a job of 30% of the budget (3 of 10 minutes) would have "
              "returned (the job's final re-measurement, for a tenth of that time and longer until it has seen "
              "both of the host's speed levels, over the plans found by "
              f"then) against the final best: the median, over {PAIRED_TIMINGS} pairs of timings back to back, "
              "of final time over early time (>= 95%: the target is met). Back to back, because the machine's speed flips "
              "between two levels that hold for seconds to minutes, and a plan's median in the rounds can draw the slow one."]
    if vs_random:
        lines += ["", "Random search at equal trials: random sampling of the same space, tuned for the same budget "
                  "after autofuse, either plain (from the two reference plans, unfused and default) or seeded (from "
                  "autofuse's seed plans too, as every report before 2026-12-03 15:00 UTC), as each cell says. In bold, the two plans each search "
                  "had as its best after as many measured candidates as the shorter of the two runs built, timed "
                  "back to back like the 3-minute check (random over guided, >1: the guided search is ahead). Then the same ratio from "
                  "each job's own scores, and by scores at the end of the budget, with each run's measured "
                  "candidates. Each job's scores are on its own scale (anchored in its first minutes), so only "
                  "the side-by-side ratio compares the searches; the random-search column times random search's "
                  "final best in the same rounds as autofuse's. Curves: `bench_trials.png`."]
    return "\n".join(lines) + "\n"
