"""`autofuse bench` end to end on a tiny space with a few-second budget (timings not asserted)."""

import json
from pathlib import Path

from helpers import cli


def test_bench_tiny_all_columns_correct(tmp_path):
    out = tmp_path / "bench"
    r = cli("bench", "ew_chain", "--tiny", "--budget", "6s", "--rounds", "1", "--repeats", "1", "--min-repeat-ms", "1",
            "-o", str(out), "--json", timeout=600)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    (space,) = report["spaces"]
    cols = space["columns"]
    assert set(cols) == {"unfused", "tvm-default", "tvm-metaschedule", "onnxruntime", "numpy", "autofuse"}
    for name, col in cols.items():
        assert col["correct"] is True, (name, col)  # every column computes the same function
        assert col["median_ms"] > 0 and col["spread_ms"] >= 0
    assert space["roofline_ms"] > 0 and space["flops"] > 0 and space["bytes"] > 0
    assert report["peaks"]["peak_gflops"] > 0 and report["peaks"]["bandwidth_gbs"] > 0
    assert set(space["ratios_vs_autofuse"]) >= {"unfused", "onnxruntime"}
    assert json.loads(Path(report["json"]).read_text())["spaces"][0]["space"] == "ew_chain"
    for chart in report["charts"]:
        assert Path(chart).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_rejects_unknown_column_and_space():
    r = cli("bench", "ew_chain", "--tiny", "--columns", "autofuse,bogus")
    assert r.returncode == 2 and "bogus" in r.stderr and "Traceback" not in r.stderr
    r = cli("bench", "nope", "--tiny")
    assert r.returncode == 2 and "unknown space" in r.stderr
