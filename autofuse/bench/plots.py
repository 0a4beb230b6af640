"""The bench's charts (PNG, matplotlib): speedup over each peer per space; best-so-far vs
wall time (autofuse, random search, MetaSchedule); best-so-far vs candidates measured."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from autofuse.bench.columns import COLUMNS
from autofuse.bench.report import runs_of


def plot_bench(report: dict[str, Any], out_dir: Path) -> list[str]:
    """The report's charts: speedup of autofuse over each peer per space; best-so-far vs wall
    time (autofuse vs MetaSchedule); with ``--compare-random``, best-so-far vs trials."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    spaces = [Path(r["space"]).stem for r in report["spaces"]]  # a model by its file's name
    peers = [c for c in COLUMNS if c != "autofuse"
             and any((r.get("ratios_vs_autofuse") or {}).get(c) for r in report["spaces"])]
    if peers:  # none with --columns autofuse alone
        paths.append(_plot_speedups(report, spaces, peers, out_dir / "bench_speedup.png", plt))
    paths.append(_plot_search(report["spaces"], out_dir / "bench_search.png", plt))
    compared = [r for r in report["spaces"] if r.get("random_trial_curve") and r.get("autofuse_trial_curve")]
    if compared:
        paths.append(_plot_trials(compared, out_dir / "bench_trials.png", plt))
    return paths


def _plot_speedups(report: dict[str, Any], spaces: list[str], peers: list[str], path: Path, plt: Any) -> str:
    """Per space, one bar a peer: peer time / autofuse time, log scale."""
    fig, ax = plt.subplots(figsize=(max(7, 1.5 * len(spaces) + 2), 4.2))
    width = 0.8 / len(peers)
    for i, peer in enumerate(peers):
        vals = [(r.get("ratios_vs_autofuse") or {}).get(peer) or 0 for r in report["spaces"]]
        ax.bar([x + i * width for x in range(len(spaces))], vals, width, label=peer)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_yscale("log")
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(spaces))], spaces, rotation=20, ha="right")
    ax.set_ylabel("peer time / autofuse time (log)")
    runs = runs_of(report)  # an --append report: each space was measured in its own run
    when = report["date"] if len(runs) == 1 else f"{len(runs)} runs, {runs[0]['date']} to {runs[-1]['date']}"
    ax.set_title(f"autofuse speedup over peers (>1: autofuse faster)\n{when}, "
                 f"tuning budget {report['budget_s']:.0f} s", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, path, plt)


def _plot_search(results: list[dict[str, Any]], path: Path, plt: Any) -> str:
    """Best-so-far against wall time: autofuse (and random search) vs MetaSchedule."""
    def curves(r: dict[str, Any]) -> list[tuple[str, list]]:
        model = "autofuse_model_job" in r
        labels = (("autofuse_curve", "autofuse (sum of region bests)" if model else "autofuse TPE (measured)"),
                  ("random_curve", "autofuse random (measured)"),
                  ("metaschedule_curve", "MetaSchedule (sum of task bests)"))
        return [(label, [(t, v) for t, v in r.get(key) or [] if v < 1e9])  # no failed-task sentinels
                for key, label in labels]

    return _plot_panels(results, curves, "wall s", path, plt)


def _plot_trials(results: list[dict[str, Any]], path: Path, plt: Any) -> str:
    """Best-so-far against candidates measured: guided search and random search of the same space."""
    def curves(r: dict[str, Any]) -> list[tuple[str, list]]:
        return [("autofuse (TPE + mutations + cost model)", r["autofuse_trial_curve"]),
                ("random search", r["random_trial_curve"])]

    return _plot_panels(results, curves, "candidates measured", path, plt,
                        mark=lambda r: (r.get("search_vs_random") or {}).get("equal_trials"))


def _plot_panels(results: list[dict[str, Any]], curves: Callable[[dict[str, Any]], list[tuple[str, list]]],
                 xlabel: str, path: Path, plt: Any, mark: Callable[[dict[str, Any]], Any] = lambda r: None) -> str:
    """One best-so-far panel per space, log scale: each (label, curve) of ``curves(space)`` as
    a step line, and a dotted vertical line at ``mark(space)`` where it is set."""
    fig, axes = plt.subplots(1, len(results), figsize=(3.2 * len(results), 3), squeeze=False)
    for ax, r in zip(axes[0], results):
        for label, curve in curves(r):
            if curve:
                ax.step([x for x, _ in curve], [v for _, v in curve], where="post", label=label)
        if mark(r):
            ax.axvline(mark(r), color="grey", lw=0.6, ls=":")
        ax.set_title(Path(r["space"]).stem, fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_yscale("log")
        if ax.lines:
            ax.legend(fontsize=6)
    axes[0][0].set_ylabel("best so far (ms)")
    return _save(fig, path, plt)


def _save(fig: Any, path: Path, plt: Any) -> str:
    """Lay out and write a chart as PNG."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
