"""`autofuse bench` end to end on a tiny space with a few-second budget (timings not asserted)."""

import json
from pathlib import Path

import pytest

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
    r = cli("bench", "ew_chain", "--tiny", "--columns", "numpy", "--compare-random")  # random search runs beside autofuse
    assert r.returncode == 2 and "autofuse column" in r.stderr and "Traceback" not in r.stderr


def test_metaschedule_estimate_waits_for_every_task_and_skips_failed_records(tmp_path):
    """The MetaSchedule curve is a whole-graph estimate only once every task has a working
    record; a failed candidate (recorded as 1e10 s) never counts."""
    import json

    from autofuse.metaschedule import _estimate_ms

    (tmp_path / "database_workload.json").write_text("[0]\n[1]\n")
    rec = tmp_path / "database_tuning_record.json"
    rec.write_text(json.dumps([0, [None, [0.002, 0.004]]]) + "\n" + json.dumps([1, [None, [1e10]]]) + "\n")
    assert _estimate_ms(tmp_path) is None
    rec.write_text(rec.read_text() + json.dumps([1, [None, [0.001]]]) + "\n")
    assert _estimate_ms(tmp_path) == pytest.approx(4.0)


def test_metaschedule_may_pack_the_weights_as_autofuse_may():
    """The peer gets TVM's weight prepacking (as ``cpu_weight_prepack`` in TVM's tuning
    pipeline): the GEMM kernel MetaSchedule tunes marks its constant weight layout-free, so
    MetaSchedule's RewriteLayout may repack it, as autofuse's pack_weight does."""
    import tvm

    from autofuse.metaschedule import fused_module
    from autofuse.workload import get_workload

    w = get_workload("gemm_bn", tiny=True)
    kernels = [f for _, f in fused_module(w.graph(True).mod).functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    free = list(kernels[0].attrs["layout_free_buffers"])  # kernel params: x, the weight, bias and BN constants, out
    assert len(kernels) == 1 and 1 in free and 0 not in free


def test_bench_append_adds_spaces_to_the_report_and_refuses_another_budget(tmp_path):
    """A long bench split over runs: the second run's space joins the first's in one report
    (table, geomeans), each with its run's date; another budget is refused and changes nothing."""
    out = tmp_path / "bench"
    common = ("--tiny", "--columns", "numpy,autofuse", "--rounds", "1", "--repeats", "1", "--min-repeat-ms", "1",
              "-o", str(out), "--json")
    r = cli("bench", "ew_chain", "--budget", "3s", *common, timeout=600)
    assert r.returncode == 0, r.stderr
    r = cli("bench", "layernorm_residual", "--budget", "3s", "--append", *common, timeout=600)
    assert r.returncode == 0, r.stderr
    report = json.loads((out / "bench.json").read_text())
    assert [s["space"] for s in report["spaces"]] == ["ew_chain", "layernorm_residual"]
    assert [run["spaces"] for run in report["runs"]] == [["ew_chain"], ["layernorm_residual"]]
    assert all(s["date"] for s in report["spaces"]) and "numpy" in report["geomean_speedup_of_autofuse"]
    md = (out / "bench.md").read_text()
    assert "in 2 runs" in md and "| ew_chain |" in md and "| layernorm_residual |" in md
    before = (out / "bench.json").read_text()
    r = cli("bench", "ew_chain", "--budget", "4s", "--append", *common, timeout=600)
    assert r.returncode == 2 and "3 s budget" in r.stderr and "Traceback" not in r.stderr
    assert (out / "bench.json").read_text() == before


def test_bench_reports_progress_while_each_tuner_runs(tmp_path, monkeypatch):
    """A 10-minute tuning phase is not silent: both tuners say how far into the budget they
    are and what they have found (here every poll/trial, instead of once a minute)."""
    from autofuse import bench
    from autofuse.bench import columns
    from autofuse.target import parse_target

    monkeypatch.setattr(columns, "PROGRESS_EVERY_S", 0.0)
    lines: list[str] = []
    bench.run_bench(["ew_chain"], parse_target("llvm"), 4.0, tmp_path / "b", tiny=True, rounds=1, repeats=1,
                    min_repeat_ms=1, include=("numpy", "autofuse", "tvm-metaschedule"), progress=lines.append)
    ours = [l for l in lines if l.startswith("ew_chain: autofuse: ")]
    assert ours and "of 0:04" in ours[0] and "trials" in ours[-1], lines
    assert any(" best " in l and l.endswith(" ms") for l in ours), ours
    theirs = [l for l in lines if l.startswith("ew_chain: tvm-metaschedule: ")]
    assert theirs and all("records" in l for l in theirs), lines


def test_bench_compare_random_reports_both_searches_at_equal_trials(tmp_path):
    """`--compare-random`: random search of the same space gets the same budget; the report
    compares the two bests after as many measured candidates as the shorter run built, charts
    both curves, and times random search's best plan in the same rounds as autofuse's."""
    from autofuse.bench import best_at

    out = tmp_path / "bench"
    r = cli("bench", "ew_chain", "--tiny", "--budget", "5s", "--rounds", "1", "--repeats", "1", "--min-repeat-ms", "1",
            "--columns", "autofuse", "--compare-random", "-o", str(out), "--json", timeout=600)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    (space,) = report["spaces"]
    guided, rand, cmp = space["autofuse_trial_curve"], space["random_trial_curve"], space["search_vs_random"]
    for curve in (guided, rand):
        assert curve and all(a[0] < b[0] and a[1] >= b[1] for a, b in zip(curve, curve[1:]))  # best only improves
    assert cmp["guided_trials"] == space["autofuse_job"]["measured"]  # repeats and pre-screened plans not counted
    assert cmp["random_trials"] == space["random_job"]["measured"]
    n = cmp["equal_trials"]
    assert n == min(guided[-1][0], rand[-1][0]) == min(cmp["guided_trials"], cmp["random_trials"])
    assert cmp["guided_ms"] == best_at(guided, n) and cmp["random_ms"] == best_at(rand, n)
    assert cmp["random_over_guided"] == pytest.approx(cmp["random_ms"] / cmp["guided_ms"])
    assert cmp["same_budget_random_over_guided"] == pytest.approx(rand[-1][1] / guided[-1][1])
    sbs = cmp["side_by_side"]  # the two bests at equal trials, timed in the same rounds
    assert sbs["random_over_guided"] > 0 and "error" not in sbs, sbs
    if sbs["guided_plan"] != sbs["random_plan"]:
        assert sbs["random_over_guided"] == pytest.approx(sbs["random_ms"] / sbs["guided_ms"])
    assert f"{sbs['random_over_guided']:.2f}x** side by side at {n} measured" in (out / "bench.md").read_text()
    early = space["autofuse_early_best"]  # the best at 30% of the budget against the final one, side by side
    assert early["at_s"] == pytest.approx(1.5)
    if early["early_plan"] is None:  # a tiny 5 s budget may have no verified plan 1.5 s in
        assert "no verified plan yet at 2 s" in (out / "bench.md").read_text()
    else:
        assert early["final_plan"] in space["columns"]["autofuse"]["note"]
        assert early["final_over_early"] > 0 and "error" not in early, early
        assert f"{100 * early['final_over_early']:.0f}% of the final best at 2 s" in (out / "bench.md").read_text()
    assert space["random_job"]["study"].endswith("-random")
    col = space["columns"]["random-search"]
    assert col["correct"] and col["samples"] == space["columns"]["autofuse"]["samples"] == 1, col
    assert space["random_job"]["best"]["plan_hash"] in col["note"]
    assert space["ratios_vs_autofuse"]["random-search"] == pytest.approx(
        col["median_ms"] / space["columns"]["autofuse"]["median_ms"])
    assert "random-search" in report["geomean_speedup_of_autofuse"]
    assert str(out / "bench_trials.png") in report["charts"]
    assert (out / "bench_trials.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "bench.md").read_text()
    assert "random search at equal trials" in md and f"at {n} measured" in md


def test_best_at_reads_a_best_so_far_curve():
    from autofuse.bench import best_at

    curve = [(3, 9.0), (5, 7.0), (9, 4.0)]
    assert best_at(curve, 2) is None and best_at(curve, 3) == 9.0 and best_at(curve, 8) == 7.0 and best_at(curve, 99) == 4.0


def test_time_to_95_percent_of_the_final_best():
    from autofuse.bench import reached_95pct_at

    curve = [(1.0, 10.0), (4.0, 5.3), (7.0, 5.2), (300.0, 5.0)]
    assert reached_95pct_at(curve) == 7.0  # 5.2 <= 5.0 / 0.95; 5.3 is not
    assert reached_95pct_at([]) is None


def test_the_tvm_sgemm_peak_computes_the_product():
    """The roofline's peak FLOP/s may come from a TVM SGEMM on pre-packed weights (the BLAS
    libraries present may not use the CPU's full vector width); it is checked against NumPy
    and counts as 0 FLOP/s when wrong."""
    from autofuse.bench.roofline import _tvm_sgemm_flops

    assert _tvm_sgemm_flops(64) > 0


def test_two_plans_are_compared_side_by_side_and_one_plan_is_not_timed():
    """What the bench's search checks rest on: two plans checked and timed in the same rounds
    (the ratio is of those medians), a plan against itself is 1.0 without timing, and a
    missing plan (no verified plan yet) gives no comparison."""
    from autofuse.bench.columns import _side_by_side
    from autofuse.target import parse_target
    from autofuse.workload import get_workload

    w = get_workload("ew_chain", tiny=True)
    default, unfused = (w.reference_plan(p).to_json() for p in ("default", "unfused"))
    r = _side_by_side(w, parse_target("llvm"), unfused, default, ("early", "final"), rounds=2)
    assert r["early_plan"] == w.reference_plan("unfused").hash and r["final_plan"] == w.reference_plan("default").hash
    assert r["final_over_early"] == pytest.approx(r["final_ms"] / r["early_ms"]) and r["final_ms"] > 0
    same = _side_by_side(w, parse_target("llvm"), default, default, ("guided", "random"))
    assert same == {"guided_plan": w.reference_plan("default").hash, "random_plan": w.reference_plan("default").hash,
                    "random_over_guided": 1.0}
    assert _side_by_side(w, parse_target("llvm"), None, default, ("early", "final")) is None
