"""Regenerate the markdown table of a bench run: python benchmarks/bench_markdown.py results/bench/bench.json [COMMAND]."""

import json
import sys

from autofuse.bench import markdown_report

if __name__ == "__main__":
    report = json.load(open(sys.argv[1]))
    print(markdown_report(report, " ".join(sys.argv[2:])))
