"""``autofuse bench``: autofuse's best plan against its peers, measured side by side.

For each space, in one process, on the same inputs: every column is built (or tuned for the
same wall-clock budget), checked against the NumPy reference, then timed in interleaved
rounds so that machine noise hits all columns alike.  Reported: median per column, spread
(max-min over all samples), ratios to autofuse, and the roofline floor from this machine's
measured peak FLOP/s and bandwidth (and, back to back with autofuse's plan, the peak kernel
that bounds each space).

- ``columns``: how each column is built or tuned, checked and timed;
- ``roofline``: machine peaks and each space's FLOPs and bytes;
- ``curves``: best-so-far curves, time to 95% of the best, guided vs random search;
- ``run``: a bench run and its report; ``report`` and ``plots``: the report as text and charts.
"""

from autofuse.bench.columns import COLUMNS, Column
from autofuse.bench.curves import StudyHistory, best_at, reached_95pct_at, search_curves, search_vs_random
from autofuse.bench.plots import plot_bench
from autofuse.bench.report import (cell, markdown_report, paired_cell, paired_peers, peer_geomeans, random_cell,
                                   report_columns, roofline_cell)
from autofuse.bench.roofline import machine_peaks, roofline_ms, work_of
from autofuse.bench.run import BenchAppendError, bench_space, run_bench

__all__ = ["COLUMNS", "BenchAppendError", "Column", "StudyHistory", "bench_space", "best_at", "cell", "machine_peaks",
           "markdown_report", "paired_cell", "paired_peers", "peer_geomeans", "plot_bench", "random_cell", "roofline_cell",
           "reached_95pct_at", "report_columns", "roofline_ms", "run_bench", "search_curves", "search_vs_random",
           "work_of"]
