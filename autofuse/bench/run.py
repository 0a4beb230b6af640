"""A bench run: every space's columns built, checked against the reference, timed in
interleaved rounds; the report written as JSON, markdown and charts (``--append`` adds
spaces to an earlier report measured under the same settings)."""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from autofuse.bench.columns import (COLUMNS, PAIRED_PEERS, PAIRED_TIMINGS, PAIRS_PER_BUILD, Column, PlanPair, _Runnable,
                                    bench_db, build_columns)
from autofuse.bench.curves import random_kind, reached_95pct_at
from autofuse.bench.plots import plot_bench
from autofuse.bench.report import markdown_report, runs_of
from autofuse.bench.roofline import machine_peaks, peak_kernel, roofline_ms, roofline_term, work_of
from autofuse.measure import compare
from autofuse.target import Target, num_threads
from autofuse.workload import get_workload


def bench_space(name: str, target: Target, budget_s: float, out_dir: Path, *, tiny: bool = False, rounds: int = 5,
                repeats: int = 3, min_repeat_ms: float = 50, seed: int = 0, peaks: dict[str, float] | None = None,
                include: tuple[str, ...] = COLUMNS, progress: Callable[[str], None] = lambda s: None,
                compare_random: str | None = None) -> dict[str, Any]:
    """One space's row of the report: its columns built or tuned, checked, timed in
    ``rounds`` interleaved rounds of ``repeats``; ratios, roofline and search curves."""
    w = get_workload(name, tiny)
    _, expected = w.check_data()
    columns, pairs, extra = build_columns(w, target, budget_s, out_dir, progress, seed, include, compare_random)
    plans = [r for r in dict.fromkeys(r for p in pairs for r in p.runs) if r not in columns]  # of the search checks
    runnables = columns + plans

    def check(r: _Runnable) -> None:
        """Correctness first, of every build: a wrong column is reported, never timed again."""
        try:
            out = r.output()
            out = np.asarray(out.numpy() if hasattr(out, "numpy") else out)
            r.column.correct, err = compare(out, expected, w.space.rtol, w.space.atol)
            if not r.column.correct:
                r.column.error = f"wrong result (relative error {err:.3g})"
        except Exception as e:
            r.column.correct, r.column.error = False, f"{type(e).__name__}: {e}"
        if r.column.error and r.column.builds > 1:
            r.column.error = f"build {r.column.builds}: {r.column.error}"

    for r in runnables:
        if not r.column.error:
            check(r)
    work = work_of(w)
    floor = _floor_pair(work, peaks, columns) if peaks else None
    if floor is not None:  # timed in the rounds too: the pair reports both medians
        runnables.append(floor.runs[0])
    checks = f" and {len(plans)} plans of the search checks" if plans else ""
    progress(f"{name}: timing {len(columns)} columns{checks}, a warm-up round, then {rounds} interleaved rounds, "
             "each column built anew for each round")
    for r in runnables:
        # discarded: the first timing after the tuning jobs ran up to 3x slower than the rest
        # (gemm_bn's first repeat 4.13 ms, the next 14 at 1.39-1.47 ms; NOTES 51)
        if r.column.correct:
            r.time(1, min_repeat_ms)
    for k in range(rounds):
        # each round starts one runnable further on, so that none always runs right after the
        # same one: plans timed right after the NumPy column ran up to 27% slower than after
        # a TVM plan (OpenBLAS threads spinning after a call, likely; NOTES 31)
        start = k % len(runnables) if runnables else 0
        for r in runnables[start:] + runnables[:start]:
            if k:  # the first round times the warm-up's build
                r.renew(check)
            if r.column.correct:
                r.column.samples_ms.extend(r.time(repeats, min_repeat_ms))
    paired_peers = _peer_pairs(columns)
    pairs += list(paired_peers.values()) + ([floor] if floor else [])
    if pairs:
        progress(f"{name}: timing {len(pairs)} pairs of plans back to back (search checks, autofuse against "
                 f"its peers and its roofline floor), {PAIRED_TIMINGS} timings each, both built anew every "
                 f"{PAIRS_PER_BUILD}")
    for p in pairs:
        p.time_paired(PAIRED_TIMINGS, min_repeat_ms, check)
        p.finish()
    result: dict[str, Any] = {"space": name, "tiny": tiny, "workload": w.hash, "budget_s": budget_s,
                              "columns": {r.column.name: r.column.as_dict() for r in columns}, **work, **extra}
    if paired_peers:
        result["paired_vs_autofuse"] = {peer: p.into for peer, p in paired_peers.items()}
    if peaks:
        result["roofline_ms"] = roofline_ms(work, peaks)
    if floor is not None:
        result["roofline_paired"] = floor.into
    af = result["columns"].get("autofuse", {}).get("median_ms")
    if af:
        result["ratios_vs_autofuse"] = {k: (c["median_ms"] / af if c["median_ms"] else None)
                                        for k, c in result["columns"].items()}
        if peaks:
            result["autofuse_over_roofline"] = af / result["roofline_ms"]
        if extra.get("autofuse_curve"):
            result["autofuse_95pct_at_s"] = reached_95pct_at(extra["autofuse_curve"])
    return result


def _peer_pairs(columns: list[_Runnable]) -> dict[str, PlanPair]:
    """peer name -> the pair (autofuse, peer) to time back to back, for each of
    ``PAIRED_PEERS`` that ran beside autofuse; ``finish`` fills its ``into`` with
    ``<peer>_over_autofuse`` (the median of the pairs' ratios) and their quartiles."""
    by_name = {r.column.name: r for r in columns}
    autofuse = by_name.get("autofuse")
    if autofuse is None:
        return {}
    return {peer: PlanPair(("autofuse", peer), (autofuse, by_name[peer]), {}) for peer in PAIRED_PEERS if peer in by_name}


def _floor_pair(work: dict[str, float], peaks: dict[str, float], columns: list[_Runnable]) -> PlanPair | None:
    """The pair (roofline, autofuse): the kernel that measured the peak setting this space's
    floor (the copy, or the SGEMM), its time scaled to the space's bytes or FLOPs, timed back
    to back with autofuse's plan.  The peaks are each kernel's fastest run at the start of
    the bench, while a plan's median can draw the host's slow level in its rounds (ew_chain
    read 1.26x of a floor it ran 0.61x of when timed beside the copy, NOTES 47); timed in
    pairs, plan and floor share a level.  ``finish`` writes ``autofuse_over_roofline``."""
    autofuse = next((r for r in columns if r.column.name == "autofuse" and r.column.correct), None)
    if autofuse is None:
        return None
    term = roofline_term(work, peaks)
    kernel = peak_kernel(term)
    if kernel is None:
        return None
    scale = work[term] / kernel.work

    def timer(repeats: int, min_ms: float) -> list[float]:
        return [s * 1e3 * scale for s in kernel.run_s(repeats, min_ms)]

    into: dict[str, Any] = {"term": term, "kernel": kernel.name}
    floor = _Runnable(Column("roofline", correct=True, note=kernel.name), timer, lambda: None)
    return PlanPair(("roofline", "autofuse"), (floor, autofuse), into)


def _clear_scratch(out_dir: Path, spaces: list[str]) -> None:
    """Each bench tunes from scratch: an earlier run's plans of these spaces (bench-SPACE.db,
    bench.db before) or MetaSchedule records (ms-SPACE) would otherwise warm-start this one
    and its budget would not be the budget.  Other spaces' are kept (``--append``)."""
    import shutil

    for f in out_dir.glob("bench.db*"):
        f.unlink()
    for space in spaces:
        db = bench_db(out_dir, space)
        for f in db.parent.glob(db.name + "*"):
            f.unlink()
        if (out_dir / f"ms-{space}").is_dir():
            shutil.rmtree(out_dir / f"ms-{space}")


class BenchAppendError(Exception):
    """``--append`` onto a report measured under other settings (budget, target, shapes)."""


def _previous_report(out_dir: Path, target: Target, budget_s: float, tiny: bool) -> dict[str, Any] | None:
    """The report ``--append`` adds to, checked to be comparable with this run."""
    path = out_dir / "bench.json"
    if not path.exists():
        return None
    try:
        prev = json.loads(path.read_text())
        prev_budget, prev_target = float(prev["budget_s"]), prev["target"]
        prev_tiny = any(r.get("tiny") for r in prev["spaces"])
    except (ValueError, KeyError, TypeError) as e:
        raise BenchAppendError(f"--append: {path} is not a bench report ({type(e).__name__}: {e})") from None
    if prev_budget != budget_s:
        raise BenchAppendError(f"--append: {path} was measured with a {prev_budget:.0f} s budget, this run has "
                               f"{budget_s:.0f} s; use the same --budget or another --output")
    if prev_target != target.spec or prev_tiny != tiny:
        raise BenchAppendError(f"--append: {path} was measured for another target or shapes; use another --output")
    return prev


def geomeans(results: list[dict[str, Any]]) -> dict[str, float]:
    """Each column's geometric mean of peer time / autofuse time over the spaces that have it.
    Plain and seeded random search answer different questions, so a report holding rows of
    both (``--append``) gets one random-search geomean per kind, "random-search (plain)" and
    "random-search (seeded)"."""
    def kind(r: dict[str, Any]) -> str:
        return random_kind(r.get("search_vs_random"))

    geo = {}
    for col in COLUMNS:
        rows = [r for r in results if r.get("ratios_vs_autofuse", {}).get(col)]
        groups = {col: rows}
        if col == "random-search" and len({kind(r) for r in rows}) > 1:
            groups = {f"{col} ({k})": [r for r in rows if kind(r) == k] for k in ("plain", "seeded")}
        for name, group in groups.items():
            if group:
                geo[name] = math.exp(sum(math.log(r["ratios_vs_autofuse"][col]) for r in group) / len(group))
    return geo


def run_bench(spaces: list[str], target: Target, budget_s: float, out_dir: Path, *, tiny: bool = False,
              rounds: int = 5, repeats: int = 3, min_repeat_ms: float = 50, seed: int = 0,
              include: tuple[str, ...] = COLUMNS, progress: Callable[[str], None] = lambda s: None,
              compare_random: str | None = None, append: bool = False) -> dict[str, Any]:
    """Bench ``spaces`` and write the report.  ``append``: keep the spaces of the report
    already in ``out_dir`` that this run does not measure (a long bench split over several
    sessions); each space keeps the date and machine peaks of the run that measured it."""
    import tvm

    out_dir.mkdir(parents=True, exist_ok=True)
    prev = _previous_report(out_dir, target, budget_s, tiny) if append else None
    _clear_scratch(out_dir, spaces)
    progress("measuring machine peaks (SGEMM, copy)")
    peaks = machine_peaks()
    date = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    results = []
    for s in spaces:
        r = bench_space(s, target, budget_s, out_dir, tiny=tiny, rounds=rounds, repeats=repeats,
                        min_repeat_ms=min_repeat_ms, seed=seed, peaks=peaks, include=include, progress=progress,
                        compare_random=compare_random)
        results.append({**r, "date": date})
    runs = [{"date": date, "spaces": list(spaces), "peaks": peaks}]
    if prev is not None:
        kept = [r for r in prev["spaces"] if r["space"] not in spaces]
        results = kept + results
        runs = [{**run, "spaces": [x for x in run["spaces"] if x not in spaces]} for run in runs_of(prev)]
        runs = [run for run in runs if run["spaces"]] + [{"date": date, "spaces": list(spaces), "peaks": peaks}]
    report = {"date": date, "target": target.spec, "threads": num_threads(),
              "tvm_version": tvm.__version__, "peaks": peaks, "budget_s": budget_s, "rounds": rounds,
              "repeats": repeats, "min_repeat_ms": min_repeat_ms, "runs": runs, "spaces": results}
    report["geomean_speedup_of_autofuse"] = geomeans(results)
    path = out_dir / "bench.json"
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=".bench.", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(report, f, indent=1, default=float)
    os.replace(tmp, path)
    report["json"] = str(path)
    report["charts"] = plot_bench(report, out_dir)
    (out_dir / "bench.md").write_text(markdown_report(report))
    return report
