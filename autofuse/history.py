"""Tuning history plots: best-so-far latency vs trial number and vs wall-clock time.

Input is :meth:`autofuse.db.PlanDB.measurements` rows; only ``kind == "trial"``
rows are plotted (``final`` re-measurements are not trials).  One line per
study; trials that failed or gave a wrong result are grey ``x`` marks along the
top edge of each panel.  Rendering uses matplotlib's Agg canvas directly (no
global backend switch, no display needed), and the PNG is written atomically.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = ["StudyHistory", "history_series", "plot_history"]


@dataclass
class StudyHistory:
    """One study's trials in order: best-so-far curve and failed trials."""

    study: str
    trial: list[int]  # x: trial number of each correct trial
    elapsed_s: list[float]  # x: seconds since the study's first trial
    best_ms: list[float]  # y: best so far (a trial's score where known, else its median)
    failed_trial: list[int]
    failed_elapsed_s: list[float]
    trials: int

    @property
    def best(self) -> float | None:
        return self.best_ms[-1] if self.best_ms else None


def _field(row: Any, name: str) -> Any:
    return row[name] if isinstance(row, dict) else getattr(row, name)


def _parse_time(text: str) -> float:
    return datetime.fromisoformat(str(text)).timestamp()


def history_series(rows: Iterable[Any], scores: dict[str, dict[int, float]] | None = None) -> list[StudyHistory]:
    """Group trial measurements by study (rows: ``MeasurementRow`` or dicts with its fields).

    ``scores``: study -> trial number -> the trial's score in its study (Optuna's value).  A
    row's own median is one lone timing, which on a busy machine can be lucky; a job scores
    a candidate timed below the best by timing it side by side with the best, and the
    best-so-far curve follows those scores where they are known."""
    scores = scores or {}
    by_study: dict[str, list[Any]] = {}
    for r in rows:
        if _field(r, "kind") != "trial":
            continue
        by_study.setdefault(_field(r, "study") or "(no study)", []).append(r)
    out = []
    for study in sorted(by_study):
        recs = by_study[study]
        stamps = [_parse_time(_field(r, "created_at")) for r in recs]
        t0 = min(stamps)
        # Trial order: trial_number when recorded, else insertion (time) order.
        order = sorted(
            range(len(recs)),
            key=lambda i: (_field(recs[i], "trial_number") is None, _field(recs[i], "trial_number") or 0, stamps[i]),
        )
        h = StudyHistory(study, [], [], [], [], [], len(recs))
        best: float | None = None
        scored = scores.get(study, {})
        for k, i in enumerate(order):
            r = recs[i]
            tn = _field(r, "trial_number")
            x = int(tn) if tn is not None else k
            med = _field(r, "median_ms")
            if not _field(r, "correct") or med is None:
                h.failed_trial.append(x)
                h.failed_elapsed_s.append(stamps[i] - t0)
                continue
            value = float(scored.get(int(tn), med) if tn is not None else med)
            best = value if best is None else min(best, value)
            h.trial.append(x)
            h.elapsed_s.append(stamps[i] - t0)
            h.best_ms.append(best)
        out.append(h)
    return out


def plot_history(rows: Sequence[Any], path: str | os.PathLike, title: str = "",
                 scores: dict[str, dict[int, float]] | None = None) -> Path:
    """Write a two-panel PNG (best-so-far ms vs trial number, and vs time); returns its path.

    Raises ``ValueError`` when ``rows`` hold no trial measurements."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    series = history_series(rows, scores)
    if not series:
        raise ValueError("no trial measurements to plot")

    fig = Figure(figsize=(11, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    ax_n, ax_t = fig.subplots(1, 2)
    all_best = [v for h in series for v in h.best_ms]
    for h in series:
        label = f"{h.study} (best {h.best:.4g} ms)" if h.best is not None else f"{h.study} (no correct trial)"
        if h.best_ms:
            (line,) = ax_n.step(h.trial, h.best_ms, where="post", marker="o", markersize=2.5, label=label)
            ax_t.step(h.elapsed_s, h.best_ms, where="post", marker="o", markersize=2.5, color=line.get_color(),
                      label=label)
        else:
            ax_n.plot([], [], label=label)
    any_failed = any(h.failed_trial for h in series)
    if any_failed:
        failed_n = [x for h in series for x in h.failed_trial]
        failed_t = [x for h in series for x in h.failed_elapsed_s]
        for ax, xs in ((ax_n, failed_n), (ax_t, failed_t)):
            # x marks along the top edge: y in axes coordinates, x in data coordinates
            ax.scatter(xs, [0.97] * len(xs), marker="x", s=14, color="0.6", linewidths=0.8,
                       transform=ax.get_xaxis_transform(), label="failed / wrong", zorder=3)
    if all_best:
        lo, hi = min(all_best), max(all_best)
        pad = (hi - lo) * 0.08 or hi * 0.05 or 1.0
        for ax in (ax_n, ax_t):
            ax.set_ylim(max(0.0, lo - pad), hi + pad * 2)
    ax_n.set_xlabel("trial")
    ax_t.set_xlabel("wall-clock time since the study's first trial (s)")
    for ax in (ax_n, ax_t):
        ax.set_ylabel("best latency so far (ms)")
        ax.grid(True, alpha=0.3)
    ax_n.legend(fontsize=8, loc="upper right")
    total = sum(h.trials for h in series)
    fig.suptitle(f"{title}  ({total} trials)" if title else f"{total} trials")
    fig.tight_layout()

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".png", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format="png")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
