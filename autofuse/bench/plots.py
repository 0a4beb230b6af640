"""The bench's charts (PNG, matplotlib): speedup over each peer per space; best-so-far vs
wall time (autofuse, random search, MetaSchedule); best-so-far vs candidates measured."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autofuse.bench.columns import COLUMNS


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
    ax.set_title(f"autofuse speedup over peers (>1: autofuse faster)\n{report['date']}, "
                 f"tuning budget {report['budget_s']:.0f} s", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def _plot_search(results: list[dict[str, Any]], path: Path, plt: Any) -> str:
    """Best-so-far against wall time: autofuse (and random search) vs MetaSchedule."""
    fig, axes = plt.subplots(1, len(results), figsize=(3.2 * len(results), 3), squeeze=False)
    for ax, r in zip(axes[0], results):
        model = "autofuse_model_job" in r
        for key, label in (("autofuse_curve", "autofuse (sum of region bests)" if model else "autofuse TPE (measured)"),
                           ("random_curve", "autofuse random (measured)"),
                           ("metaschedule_curve", "MetaSchedule (sum of task bests)")):
            curve = [(t, v) for t, v in r.get(key) or [] if v < 1e9]  # no failed-task sentinels
            if curve:
                ax.step([t for t, _ in curve], [v for _, v in curve], where="post", label=label)
        ax.set_title(Path(r["space"]).stem, fontsize=9)
        ax.set_xlabel("wall s")
        ax.set_yscale("log")
        if ax.lines:
            ax.legend(fontsize=6)
    return _save_panels(fig, axes, path, plt)


def _save_panels(fig: Any, axes: Any, path: Path, plt: Any) -> str:
    """A row of best-so-far panels, written as PNG."""
    axes[0][0].set_ylabel("best so far (ms)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def _plot_trials(results: list[dict[str, Any]], path: Path, plt: Any) -> str:
    """Best-so-far against candidates measured: guided search and random search of the same space."""
    fig, axes = plt.subplots(1, len(results), figsize=(3.2 * len(results), 3), squeeze=False)
    for ax, r in zip(axes[0], results):
        for key, label in (("autofuse_trial_curve", "autofuse (TPE + mutations + cost model)"),
                           ("random_trial_curve", "random search")):
            curve = r[key]
            ax.step([n for n, _ in curve], [v for _, v in curve], where="post", label=label)
        n = (r.get("search_vs_random") or {}).get("equal_trials")
        if n:
            ax.axvline(n, color="grey", lw=0.6, ls=":")
        ax.set_title(Path(r["space"]).stem, fontsize=9)
        ax.set_xlabel("candidates measured")
        ax.set_yscale("log")
        ax.legend(fontsize=6)
    return _save_panels(fig, axes, path, plt)
