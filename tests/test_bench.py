"""`autofuse bench` end to end on a tiny space with a few-second budget (timings not asserted)."""

import json
import statistics
import time
from pathlib import Path

import optuna
import pytest

from helpers import cli


def test_bench_tiny_all_columns_correct(tmp_path):
    out = tmp_path / "bench"
    from autofuse.bench.columns import PAIRED_TIMINGS, PAIRS_PER_BUILD

    r = cli("bench", "ew_chain", "--tiny", "--budget", "6s", "--rounds", "2", "--repeats", "1", "--min-repeat-ms", "1",
            "-o", str(out), "--json", timeout=600)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    (space,) = report["spaces"]
    cols = space["columns"]
    assert set(cols) == {"unfused", "tvm-default", "tvm-metaschedule", "onnxruntime", "numpy", "autofuse"}
    for name, col in cols.items():
        assert col["correct"] is True, (name, col)  # every column computes the same function, every build of it
        assert col["median_ms"] > 0 and col["spread_ms"] >= 0
    # each build anew for the second round, and the peers of the back-to-back pairs every few pairs
    blocks = PAIRED_TIMINGS // PAIRS_PER_BUILD
    assert {k: c["builds"] for k, c in cols.items() if k != "autofuse"} == {
        "unfused": 2, "tvm-default": 2, "numpy": 1, "tvm-metaschedule": 2 + blocks, "onnxruntime": 2 + blocks}
    assert cols["autofuse"]["builds"] >= 2 + 3 * blocks  # paired with both peers and its roofline floor
    assert space["roofline_ms"] > 0 and space["flops"] > 0 and space["bytes"] > 0
    assert space["roofline_paired"]["autofuse_over_roofline"] > 0  # the floor's kernel timed beside the plan
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
    r = cli("bench", "ew_chain", "--tiny", "--columns", "numpy", "--random-seeded")  # implies --compare-random
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
    for s in report["spaces"]:  # each row's plans stay in its own database, the first run's too
        best = json.loads(cli("best", s["space"], "--tiny", "--target", "llvm", "--db",
                              str(out / f"bench-{s['space']}.db"), "--json", timeout=120).stdout)
        assert best["plan_hash"] == s["columns"]["autofuse"]["note"].split()[1], best
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
    assert ours and "of 0:04" in ours[0] and "trials" in ours[-2], lines
    assert any(" best " in l and l.endswith(" ms") for l in ours), ours
    assert ours[-1].startswith("ew_chain: autofuse: final re-measurement, "), ours  # then the job's final
    theirs = [l for l in lines if l.startswith("ew_chain: tvm-metaschedule: ")]
    assert theirs and all("records" in l for l in theirs), lines


def test_bench_compare_random_reports_both_searches_at_equal_trials(tmp_path):
    """`--compare-random`: random search of the same space gets the same budget; the report
    compares the two bests after as many measured candidates as the shorter run built, charts
    both curves, and times random search's best plan in the same rounds as autofuse's."""
    from autofuse.bench import best_at
    from autofuse.bench.run import PAIRED_TIMINGS

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
    sbs = cmp["side_by_side"]  # the two bests at equal trials, timed in the columns' rounds and back to back
    assert sbs["random_over_guided"] > 0 and "error" not in sbs, sbs
    if sbs["guided_plan"] != sbs["random_plan"]:
        assert sbs["rounds_random_over_guided"] == pytest.approx(sbs["random_ms"] / sbs["guided_ms"])
        assert sbs["samples"] == space["columns"]["autofuse"]["samples"]
        assert sbs["paired"]["pairs"] == PAIRED_TIMINGS
        assert sbs["paired"]["q1"] <= sbs["random_over_guided"] <= sbs["paired"]["q3"]
        assert f"{sbs['random_over_guided']:.2f}x** back to back at {n} measured" in (out / "bench.md").read_text()
    else:
        assert sbs["random_over_guided"] == 1.0 and "paired" not in sbs
    early = space["autofuse_early_best"]  # what a job of 30% of the budget would have returned, against the final one
    assert early["at_s"] == pytest.approx(1.5)
    if early["early_plan"] is None:  # a tiny 5 s budget may have no verified plan 1.5 s in
        assert "no verified plan yet at 2 s" in (out / "bench.md").read_text()
        assert early["best_score_plan"] is None
    else:  # chosen by that job's final re-measurement, from its candidates
        assert early["early_plan"] == min(early["early_final"]["rank_ms"], key=early["early_final"]["rank_ms"].get)
        assert early["best_score_plan"] in early["early_final"]["candidates"]
        assert early["final_plan"] in space["columns"]["autofuse"]["note"]
        assert early["final_over_early"] > 0 and "error" not in early, early
        if early["early_plan"] != early["final_plan"]:
            assert early["samples"] == space["columns"]["autofuse"]["samples"]
        assert f"{100 * early['final_over_early']:.0f}% of the final best at 2 s" in (out / "bench.md").read_text()
    assert space["random_job"]["study"].endswith("-random")
    assert space["random_job"]["seeded"] is False and cmp["random_seeded"] is False  # plain: no seed templates
    random_study = optuna.load_study(study_name=space["random_job"]["study"], storage=f"sqlite:///{out / 'bench-ew_chain.db'}")
    assert {t.user_attrs.get("label") for t in random_study.trials} <= {"unfused", "default", None}
    col = space["columns"]["random-search"]
    assert col["correct"] and col["samples"] == space["columns"]["autofuse"]["samples"] == 1, col
    assert space["random_job"]["best"]["plan_hash"] in col["note"]
    autofuse_plan = space["columns"]["autofuse"]["note"].split()[1]
    if sbs["random_plan"] == space["random_job"]["best"]["plan_hash"] not in (sbs["guided_plan"], autofuse_plan):
        assert sbs["random_ms"] == col["median_ms"]  # one plan: built and timed once, for the check and the column
    assert space["ratios_vs_autofuse"]["random-search"] == pytest.approx(
        col["median_ms"] / space["columns"]["autofuse"]["median_ms"])
    assert "random-search" in report["geomean_speedup_of_autofuse"]
    assert str(out / "bench_trials.png") in report["charts"]
    assert (out / "bench_trials.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "bench.md").read_text()
    assert "random search at equal trials" in md and f"at {n} measured" in md and "plain: " in md


def test_best_at_reads_a_best_so_far_curve():
    from autofuse.bench import best_at

    curve = [(3, 9.0), (5, 7.0), (9, 4.0)]
    assert best_at(curve, 2) is None and best_at(curve, 3) == 9.0 and best_at(curve, 8) == 7.0 and best_at(curve, 99) == 4.0


def test_study_history_counts_measured_candidates_and_finds_the_best_at_a_moment(tmp_path):
    """The best-so-far of a study, read once: repeats and pre-screened plans (no "seconds")
    move the clock but are not measured candidates; failed trials are measured but never best."""
    import datetime

    import optuna
    import sqlalchemy

    from autofuse.bench import StudyHistory

    url = f"sqlite:///{tmp_path / 'h.db'}"
    study = optuna.create_study(study_name="s", storage=url)
    t0 = datetime.datetime(2026, 1, 1)
    dist = optuna.distributions.FloatDistribution(0, 1)

    def add(at_s: float, value: float | None, plan: str, built: bool) -> None:
        attrs = {"plan": plan, **({"seconds": 0.1} if built else {})}
        state = optuna.trial.TrialState.COMPLETE if value is not None else optuna.trial.TrialState.FAIL
        study.add_trial(optuna.trial.create_trial(
            state=state, value=value, params={"x": 0.5}, distributions={"x": dist}, user_attrs=attrs))
        times.append((study.get_trials(deepcopy=False)[-1]._trial_id, at_s))  # dates set below

    times: list[tuple[int, float]] = []
    add(0.0, None, "failed", True)      # measured, not a plan
    add(1.0, 9.0, "a", True)
    add(2.0, 9.0, "a", False)           # a repeat
    add(3.0, 4.0, "b", True)
    add(50.0, 1.0, "c", False)          # not built either (a reused score), and the best

    eng = sqlalchemy.create_engine(url)
    with eng.begin() as c:
        for tid, at_s in times:
            start = t0 + datetime.timedelta(seconds=at_s)
            c.execute(sqlalchemy.text("update trials set datetime_start=:s, datetime_complete=:e where trial_id=:i"),
                      {"s": start, "e": start + datetime.timedelta(seconds=0.5), "i": tid})
    h = StudyHistory(url, "s")
    by_time, by_measured = h.curves()
    assert by_time == [(1.5, 9.0), (2.5, 9.0), (3.5, 4.0), (50.5, 1.0)]
    assert by_measured == [(2, 9.0), (3, 4.0)]
    assert h.best_plan_after(n=1) is None and h.best_plan_after(n=2) == "a" and h.best_plan_after(n=99) == "c"
    assert h.best_plan_after(seconds=1.0) is None and h.best_plan_after(seconds=3.4) == "a"
    assert h.best_plan_after(seconds=10) == "b"


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

    assert _tvm_sgemm_flops(64, 0.0) > 0


def test_the_peak_sgemms_register_tile_fits_the_vector_registers():
    from autofuse.bench.roofline import sgemm_register_tile
    from autofuse.target import VectorUnit

    assert sgemm_register_tile(VectorUnit(16, 32)) == (8, 32)  # AVX-512: as tuned on Zen 4/5
    assert sgemm_register_tile(VectorUnit(8, 16)) == (4, 16)  # AVX2: 8 of its 16 registers
    assert sgemm_register_tile(None) == (8, 32)


def test_a_peak_is_the_fastest_run_over_its_whole_timing_window():
    """The machine's speed flips every second or so: a peak timed for a moment can be its slow
    level, so the peak kernels are run again until their window ends, keeping the fastest."""
    from autofuse.bench.roofline import best_run_s

    runs = iter([[0.2, 0.3], [0.25], [0.1, 0.4], [0.05]])
    ticks = iter([0.0, 1.0, 2.0, 3.5, 9.0])  # the window is 3 s: the run ending at 3.5 s is the last
    assert best_run_s(lambda: next(runs), 3.0, clock=lambda: next(ticks)) == 0.1
    assert best_run_s(lambda: [0.7, 0.6], 0.0) == 0.6  # no window: one call


def _fake_runnable(name: str, samples: list[float], plan_hash: str | None = None, **col):
    from autofuse.bench.columns import Column, _Runnable

    return _Runnable(Column(name, samples_ms=samples, **col), lambda *_: [], lambda: None, plan_hash=plan_hash)


def test_a_plan_pair_is_the_ratio_of_its_two_plans_medians_and_one_plan_is_not_compared():
    """What the bench's search checks rest on: the ratio of two plans' medians, how many
    timings each had, a plan against itself is 1.0, and a wrong plan gives its error."""
    from autofuse.bench.columns import PlanPair

    a, b = _fake_runnable("plan aa", [2.0, 4.0, 3.0], "aa", correct=True), _fake_runnable("plan bb", [1.0, 1.5, 2.0], "bb", correct=True)
    into = {"at_s": 180.0}
    PlanPair(("early", "final"), (a, b), into).finish()
    assert into == {"at_s": 180.0, "early_plan": "aa", "final_plan": "bb", "early_ms": 3.0, "final_ms": 1.5,
                    "final_over_early": 0.5, "samples": 3}
    same: dict = {}
    PlanPair(("guided", "random"), (a, a), same).finish()
    assert same == {"guided_plan": "aa", "random_plan": "aa", "random_over_guided": 1.0}
    wrong = _fake_runnable("plan cc", [], "cc", correct=False, error="wrong result (relative error 1)")
    bad: dict = {}
    PlanPair(("guided", "random"), (a, wrong), bad).finish()
    assert bad == {"guided_plan": "aa", "random_plan": "cc", "error": "plan cc: wrong result (relative error 1)"}


def test_a_kernel_of_another_runtime_is_timed_after_the_last_ones_threads_go_quiet(monkeypatch):
    """TVM's pool worker spins after a kernel (onnxruntime timed then ran up to 2.3x slower): a
    runnable of another runtime waits for quiet threads first; one of the same runtime
    (two TVM plans back to back) does not."""
    from autofuse.bench import columns

    calls: list[str] = []
    monkeypatch.setattr(columns, "wait_for_quiet_threads", lambda *a, **k: calls.append("quiet") or 0.0)
    monkeypatch.setattr(columns._Runnable, "last_runtime", None)

    def runnable(name: str, runtime: str):
        r = _fake_runnable(name, [], None, correct=True)
        r.runtime, r.timer = runtime, lambda repeats, _ms: calls.append(name) or [1.0] * repeats
        return r

    af, ms, ort = runnable("autofuse", "tvm"), runnable("tvm-metaschedule", "tvm"), runnable("onnxruntime", "onnxruntime")
    columns.PlanPair(("autofuse", "tvm-metaschedule"), (af, ms), {}).time_paired(2, 1.0)
    assert calls == ["autofuse", "tvm-metaschedule", "tvm-metaschedule", "autofuse"]
    calls.clear()
    columns.PlanPair(("autofuse", "onnxruntime"), (af, ort), {}).time_paired(4, 1.0)
    assert calls == ["autofuse", "quiet", "onnxruntime", "onnxruntime", "quiet", "autofuse",
                     "autofuse", "quiet", "onnxruntime", "onnxruntime", "quiet", "autofuse"]


def test_waiting_for_quiet_threads_lasts_while_a_thread_burns_the_cpu():
    """The wait ends once no thread of the process uses the CPU, and gives up at its limit."""
    import threading

    from autofuse.bench.columns import wait_for_quiet_threads

    def burner(done) -> threading.Thread:
        def burn() -> None:
            while not done():
                pass

        t = threading.Thread(target=burn)
        t.start()
        return t

    stop = threading.Event()
    t = burner(stop.is_set)
    try:
        assert wait_for_quiet_threads(max_s=0.3) >= 0.3  # never quiet: it gives up
    finally:
        stop.set()
        t.join()
    assert wait_for_quiet_threads(max_s=5.0) < 2.0  # nothing burns: the first look or so
    end = time.perf_counter() + 0.3
    t = burner(lambda: time.perf_counter() >= end)
    waited = wait_for_quiet_threads(max_s=5.0)
    t.join()
    assert 0.2 <= waited < 2.0  # a thread busy for 0.3 s, then done


def test_the_plans_of_the_search_checks_are_checked_and_timed_in_the_columns_rounds(monkeypatch, tmp_path):
    """The early-vs-final and guided-vs-random plans are timed in the same interleaved rounds
    as the columns (not apart, in another minute), checked first, and kept out of the table;
    no runnable comes right after the same one in every round."""
    from autofuse.bench import run as bench_run
    from autofuse.bench.columns import PlanPair
    from autofuse.workload import get_workload

    _, expected = get_workload("ew_chain", tiny=True).check_data()
    calls: list[str] = []

    def runnable(name: str, plan_hash: str | None, output=lambda: expected):
        r = _fake_runnable(name, [], plan_hash)
        r.output = output
        r.timer = lambda repeats, _ms: calls.append(name) or [1.0 + len(calls)] * repeats
        return r

    final, early, other = runnable("autofuse", "ff"), runnable("plan ee", "ee"), runnable("plan oo", "oo", lambda: expected + 1)
    numpy_col = runnable("numpy", None)
    pairs = [PlanPair(("early", "final"), (early, final), {}), PlanPair(("guided", "random"), (final, other), {})]
    monkeypatch.setattr(bench_run, "build_columns", lambda *a, **k: ([final, numpy_col], pairs, {}))
    result = bench_run.bench_space("ew_chain", None, 1.0, tmp_path, tiny=True, rounds=2, repeats=3, include=())
    # the wrong plan is never timed; a discarded warm-up round, then each round starts one further on
    warm_up = ["autofuse", "numpy", "plan ee"]
    assert calls[:9] == warm_up + ["autofuse", "numpy", "plan ee", "numpy", "plan ee", "autofuse"]
    # the warm-up's timings (calls 1-3) are in no column; the timer returns 1 + its call's number
    assert set(result["columns"]) == {"autofuse", "numpy"}
    assert result["columns"]["autofuse"]["samples_ms"] == [5.0] * 3 + [10.0] * 3  # calls 4 and 9, as they ran
    assert result["columns"]["numpy"]["samples_ms"] == [6.0] * 3 + [8.0] * 3
    assert pairs[0].into["early_plan"] == "ee" and pairs[0].into["samples"] == 6
    rounds_ratio = final.column.median_ms / early.column.median_ms
    assert pairs[0].into["rounds_final_over_early"] == pytest.approx(rounds_ratio)
    # then the early and final plans back to back, in alternating order; the wrong plan not at all
    assert calls[9:] == ["plan ee", "autofuse", "autofuse", "plan ee"] * (bench_run.PAIRED_TIMINGS // 2)
    # pair i is calls 10 + 2i and 11 + 2i, early first in even pairs
    ratios = [(12 + 2 * i) / (11 + 2 * i) if i % 2 == 0 else (11 + 2 * i) / (12 + 2 * i)
              for i in range(bench_run.PAIRED_TIMINGS)]
    assert pairs[0].into["final_over_early"] == pytest.approx(statistics.median(ratios))
    assert pairs[0].into["paired"]["pairs"] == bench_run.PAIRED_TIMINGS
    assert pairs[1].into["error"].startswith("plan oo: wrong result") and "paired" not in pairs[1].into


def test_autofuse_is_timed_back_to_back_with_metaschedule_and_onnxruntime(monkeypatch, tmp_path):
    """The peers the targets name are also timed back to back with autofuse (a tie at the
    roofline can read a few percent either way in the rounds); the ratio is the peer's time
    over autofuse's, pair by pair, and the report shows it with its quartiles.  A peer with a
    wrong result is never timed, and its pair says why; a column that is no such peer gets
    no pair."""
    from autofuse.bench import run as bench_run
    from autofuse.bench.report import markdown_report
    from autofuse.workload import get_workload

    _, expected = get_workload("ew_chain", tiny=True).check_data()

    def runnable(name: str, ms: float, output=lambda: expected):
        r = _fake_runnable(name, [], None)
        r.output, r.timer = output, lambda repeats, _ms: [ms] * repeats
        return r

    cols = [runnable("autofuse", 1.0), runnable("tvm-metaschedule", 1.03), runnable("onnxruntime", 2.0, lambda: expected + 1),
            runnable("numpy", 9.0)]
    monkeypatch.setattr(bench_run, "build_columns", lambda *a, **k: (cols, [], {}))
    result = bench_run.bench_space("ew_chain", None, 1.0, tmp_path, tiny=True, rounds=1, repeats=1, include=())
    paired = result["paired_vs_autofuse"]
    assert set(paired) == {"tvm-metaschedule", "onnxruntime"}
    ms = paired["tvm-metaschedule"]
    assert ms["tvm-metaschedule_over_autofuse"] == pytest.approx(1.03) and ms["paired"]["pairs"] == bench_run.PAIRED_TIMINGS
    assert paired["onnxruntime"]["error"].startswith("onnxruntime: wrong result") and "paired" not in paired["onnxruntime"]
    peaks = {"peak_gflops": 150.0, "bandwidth_gbs": 30.0, "peak_source": "numpy"}
    report = {"date": "2026-12-05", "threads": 2, "tvm_version": "0.27", "budget_s": 600, "rounds": 1, "repeats": 1,
              "peaks": peaks, "spaces": [result], "geomean_speedup_of_autofuse": {"autofuse": 1.0}}
    md = markdown_report(report)
    assert "| space | tvm-metaschedule | onnxruntime |" in md
    assert "| ew_chain | **1.03x** (1.03-1.03) | failed: onnxruntime: wrong result" in md
    del result["paired_vs_autofuse"]  # a report from before these pairs: no such table
    assert "Back to back with autofuse" not in markdown_report(report)


def _rebuilt_runnable(name: str, calls: list[str], outputs):
    """A fake column whose every build is logged in ``calls`` ("build NAME") as is every
    timing (NAME), its n-th build computing ``outputs(n)``."""
    r = _fake_runnable(name, [])
    builds = [0]

    def load():
        builds[0] += 1
        calls.append(f"build {name}")
        out = outputs(builds[0])
        return (lambda repeats, _ms: calls.append(name) or [1.0] * repeats), (lambda: out)

    r.timer, r.output = load()
    r.rebuild = load
    calls.clear()  # the first build is the column's as build_columns hands it over
    return r


def test_each_column_is_built_anew_for_each_round_and_every_few_pairs(monkeypatch, tmp_path):
    """Where a build's buffers land moves its time for as long as it lives (NOTES 62): every
    column that has a build is built anew right before its timing in each round after the
    first (the warm-up and first round share one), and both plans of a back-to-back pair
    before every PAIRS_PER_BUILD pairs, each new build checked; a column without a build
    (NumPy) is timed as it is.  The report counts each column's builds and says so."""
    from autofuse.bench import run as bench_run
    from autofuse.bench.columns import PAIRS_PER_BUILD
    from autofuse.bench.report import markdown_report
    from autofuse.workload import get_workload

    _, expected = get_workload("ew_chain", tiny=True).check_data()
    calls: list[str] = []
    af = _rebuilt_runnable("autofuse", calls, lambda n: expected)
    ms = _rebuilt_runnable("tvm-metaschedule", calls, lambda n: expected)
    numpy_col = _fake_runnable("numpy", [])
    numpy_col.output, numpy_col.timer = lambda: expected, lambda repeats, _ms: calls.append("numpy") or [9.0] * repeats
    monkeypatch.setattr(bench_run, "build_columns", lambda *a, **k: ([af, ms, numpy_col], [], {}))
    result = bench_run.bench_space("ew_chain", None, 1.0, tmp_path, tiny=True, rounds=3, repeats=1, include=())
    rounds = ["autofuse", "tvm-metaschedule", "numpy",  # the warm-up round
              "autofuse", "tvm-metaschedule", "numpy",  # round 1: the warm-up's builds
              "build tvm-metaschedule", "tvm-metaschedule", "numpy", "build autofuse", "autofuse",
              "numpy", "build autofuse", "autofuse", "build tvm-metaschedule", "tvm-metaschedule"]
    assert calls[:len(rounds)] == rounds
    block = ["build autofuse", "build tvm-metaschedule"] + ["autofuse", "tvm-metaschedule", "tvm-metaschedule", "autofuse"] * (PAIRS_PER_BUILD // 2)
    assert calls[len(rounds):] == block * (bench_run.PAIRED_TIMINGS // PAIRS_PER_BUILD)
    builds = 1 + 2 + bench_run.PAIRED_TIMINGS // PAIRS_PER_BUILD
    assert {k: c["builds"] for k, c in result["columns"].items()} == {"autofuse": builds, "tvm-metaschedule": builds, "numpy": 1}
    assert result["paired_vs_autofuse"]["tvm-metaschedule"]["paired"]["pairs"] == bench_run.PAIRED_TIMINGS
    report = {"date": "2026-12-07", "threads": 2, "tvm_version": "0.27", "budget_s": 600, "rounds": 3, "repeats": 1,
              "peaks": {"peak_gflops": 1.0, "bandwidth_gbs": 1.0}, "spaces": [result], "geomean_speedup_of_autofuse": {}}
    assert f"built anew for every round after the first and before every {PAIRS_PER_BUILD} back-to-back pairs" in markdown_report(report)
    for c in result["columns"].values():  # a report from before: no such line
        c.pop("builds")
    assert "built anew" not in markdown_report(report)


def test_a_new_build_that_computes_a_wrong_result_is_never_timed(monkeypatch, tmp_path):
    """Each build is checked before its time counts: a column whose second build is wrong
    keeps the timings of its first, says which build went wrong, and its back-to-back pair
    reports the error instead of a ratio."""
    from autofuse.bench import run as bench_run
    from autofuse.workload import get_workload

    _, expected = get_workload("ew_chain", tiny=True).check_data()
    calls: list[str] = []
    af = _rebuilt_runnable("autofuse", calls, lambda n: expected)
    ort = _rebuilt_runnable("onnxruntime", calls, lambda n: expected if n == 1 else expected + 1)
    monkeypatch.setattr(bench_run, "build_columns", lambda *a, **k: ([af, ort], [], {}))
    result = bench_run.bench_space("ew_chain", None, 1.0, tmp_path, tiny=True, rounds=3, repeats=2, include=())
    col = result["columns"]["onnxruntime"]
    assert col["correct"] is False and col["error"].startswith("build 2: wrong result") and col["builds"] == 2
    assert col["samples_ms"] == [1.0, 1.0]  # the first round's, of the first build
    assert calls.count("onnxruntime") == 2  # the warm-up and the first round: never after the wrong build
    assert result["columns"]["autofuse"]["samples_ms"] == [1.0] * 6
    assert result["paired_vs_autofuse"]["onnxruntime"]["error"].startswith("onnxruntime: build 2: wrong result")


def test_autofuse_is_timed_back_to_back_with_its_roofline_floor(monkeypatch, tmp_path):
    """The peaks are each kernel's fastest run at the start of the bench, while a plan's
    median can draw the host's slow level: the kernel that bounds the space (the copy for a
    memory-bound one) is timed again beside autofuse's plan, its time scaled to the space's
    bytes, and the report gives autofuse's time over it, pair by pair, with the quartiles."""
    from autofuse.bench import roofline
    from autofuse.bench import run as bench_run
    from autofuse.bench.report import markdown_report
    from autofuse.workload import get_workload

    _, expected = get_workload("ew_chain", tiny=True).check_data()
    af = _fake_runnable("autofuse", [])
    af.output, af.timer = lambda: expected, lambda repeats, _ms: [1.5] * repeats
    monkeypatch.setattr(bench_run, "build_columns", lambda *a, **k: ([af], [], {}))
    built = []

    def fake_kernel(term):
        built.append(term)  # a copy of 1e6 bytes in 1 ms (seconds per run): 1e9 B/s at this moment
        return roofline.PeakKernel(term, 1e6, "a copy", lambda repeats, _ms: [1e-3] * repeats)

    monkeypatch.setattr(bench_run, "peak_kernel", fake_kernel)
    peaks = {"peak_gflops": 1e6, "bandwidth_gbs": 2.0, "peak_source": "numpy"}  # the start's fastest copy: 2e9 B/s
    result = bench_run.bench_space("ew_chain", None, 1.0, tmp_path, tiny=True, rounds=1, repeats=1, include=(), peaks=peaks)
    assert built == ["bytes"]  # ew_chain is memory-bound: its floor is the copy's
    floor_ms = result["bytes"] / 1e6  # its bytes at the copy's speed beside the plan
    assert result["roofline_ms"] == pytest.approx(result["bytes"] / 2e9 * 1e3)  # the start's peak: half that
    pair = result["roofline_paired"]
    assert pair["term"] == "bytes" and pair["kernel"] == "a copy" and pair["roofline_ms"] == pytest.approx(floor_ms)
    assert pair["autofuse_over_roofline"] == pytest.approx(1.5 / floor_ms)
    assert pair["paired"]["pairs"] == bench_run.PAIRED_TIMINGS
    report = {"date": "2026-12-05", "threads": 2, "tvm_version": "0.27", "budget_s": 600, "rounds": 1, "repeats": 1,
              "peaks": peaks, "spaces": [result], "geomean_speedup_of_autofuse": {"autofuse": 1.0}}
    md = markdown_report(report)
    assert "| space | autofuse/roofline |" in md
    assert f"| ew_chain | **{1.5 / floor_ms:.2f}x** ({1.5 / floor_ms:.2f}-{1.5 / floor_ms:.2f}) |" in md
    # a compute-bound space gets the SGEMM; no peaks (or no correct autofuse plan): no floor pair
    assert roofline.roofline_term({"flops": 1e9, "bytes": 1e3}, peaks) == "flops"
    assert "roofline_paired" not in bench_run.bench_space("ew_chain", None, 1.0, tmp_path, tiny=True, rounds=1,
                                                          repeats=1, include=())
    af.output = lambda: expected + 1
    assert "roofline_paired" not in bench_run.bench_space("ew_chain", None, 1.0, tmp_path, tiny=True, rounds=1,
                                                          repeats=1, include=(), peaks=peaks)


def test_the_peak_kernels_time_what_they_compute():
    """The kernels whose fastest runs set the peaks: the copy moves 8 bytes per float (read +
    written), the SGEMM 2 n^3 FLOPs, and both time in seconds per run."""
    from autofuse.bench.roofline import copy_kernel, sgemm_kernel

    copy = copy_kernel(1 << 16, 2)
    assert copy.term == "bytes" and copy.work == 8 * (1 << 16) and "copy" in copy.name
    sgemm = sgemm_kernel(64)
    assert sgemm is not None and sgemm.term == "flops" and sgemm.work == 2 * 64**3
    for k in (copy, sgemm):
        runs = k.run_s(3, 1)
        assert len(runs) == 3 and all(0 < t < 1 for t in runs)


def test_plans_timed_back_to_back_compare_through_a_machine_whose_speed_flips():
    """Two plans of the same speed on a machine that runs everything 2x slower in every other
    stretch of calls: their medians over blocks of repeats (as in the rounds) can differ by
    far more than the noise within a level; timed back to back, their ratio is 1."""
    from autofuse.bench.columns import PlanPair

    calls = [0]

    def timer(repeats, _ms):
        out = []
        for _ in range(repeats):
            calls[0] += 1
            out.append(2.0 if (calls[0] // 7) % 2 else 1.0)  # the level flips every 7 calls
        return out

    a, b = _fake_runnable("plan aa", [], "aa"), _fake_runnable("plan bb", [], "bb")
    for r in (a, b):
        r.column.correct, r.timer = True, timer
    a.column.samples_ms += timer(3, 1) + timer(3, 1)  # as two rounds would: a draws the fast level, b the slow
    b.column.samples_ms += timer(3, 1) + timer(3, 1)
    into: dict = {}
    pair = PlanPair(("early", "final"), (a, b), into)
    pair.time_paired(24, 1)
    pair.finish()
    assert into["rounds_final_over_early"] != pytest.approx(1.0)
    assert into["final_over_early"] == 1.0 and into["paired"]["q1"] <= 1.0 <= into["paired"]["q3"]


def test_the_early_cell_says_which_plan_the_3_minute_check_timed():
    """Rows of this version time what a 3-minute job would have returned; rows of reports
    made before it timed the best-scored plan at 3 minutes, and their cells say so."""
    from autofuse.bench.report import early_cell

    row = {"at_s": 180.0, "early_plan": "aa", "final_plan": "bb", "final_over_early": 0.8, "early_final": {},
           "paired": {"pairs": 24, "q1": 0.7, "q3": 0.9}}
    assert early_cell(row) == "80% of the final best at 180 s"
    assert early_cell({**row, "final_plan": "aa", "final_over_early": 1.0}) == \
        "100% of the final best at 180 s (the same plan)"
    rounds = {k: v for k, v in row.items() if k != "paired"}
    assert early_cell(rounds) == "80% of the final best at 180 s (medians of the rounds)"
    older = {k: v for k, v in rounds.items() if k != "early_final"}
    assert early_cell(older) == "80% of the final best at 180 s (best score then)"
    both = {**row, "early_final": {"rounds": 24, "slow_rounds": 21}}
    assert early_cell(both) == "80% of the final best at 180 s, its final in both speed levels"


def test_bench_summary_marks_plain_and_seeded_random_search():
    """benchmarks/bench_summary.py, the read the closing notes quote: one line per space, the
    random-search check marked plain or seeded (reports without the mark were seeded)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_summary", Path(__file__).resolve().parents[1] / "benchmarks" / "bench_summary.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def row(space: str, vs_random: dict | None) -> dict:
        return {"space": space, "date": "2026-12-03 15:00:00 UTC", "columns": {"autofuse": {"median_ms": 1.0, "spread_ms": 0.1}},
                "ratios_vs_autofuse": {"tvm-metaschedule": 2.0, "onnxruntime": 4.0}, "autofuse_over_roofline": 1.5,
                "search_vs_random": vs_random}

    lines = module.summary({"spaces": [row("old", {"side_by_side": {"random_over_guided": 1.02}}),
                                       row("plain", {"side_by_side": {"random_over_guided": 1.5}, "random_seeded": False}),
                                       row("none", None)]})
    assert lines[0].endswith("random 1.020 (seeded)") and lines[1].endswith("random 1.500 (plain)")
    assert lines[2].endswith("random -")
    assert lines[3:] == ["geomean tvm-metaschedule: 2.00x over 3", "geomean onnxruntime: 4.00x over 3"]


def test_geomeans_keep_plain_and_seeded_random_search_apart():
    """A report with rows of both kinds of random search (``--append``) gets one random-search
    geomean per kind; with one kind, one geomean under the column's name."""
    from autofuse.bench.run import geomeans

    def row(random_ratio: float | None, seeded: bool | None) -> dict:
        vs_random = None if seeded is None else {"random_seeded": seeded}
        ratios = {"tvm-metaschedule": 2.0, **({"random-search": random_ratio} if random_ratio else {})}
        return {"ratios_vs_autofuse": ratios, "search_vs_random": vs_random}

    mixed = geomeans([row(1.0, True), row(4.0, False), row(1.0, False), row(None, None)])
    assert mixed == {"tvm-metaschedule": pytest.approx(2.0), "random-search (plain)": pytest.approx(2.0),
                     "random-search (seeded)": pytest.approx(1.0)}
    plain = geomeans([row(4.0, False), row(1.0, False)])
    assert plain == {"tvm-metaschedule": pytest.approx(2.0), "random-search": pytest.approx(2.0)}
    old = geomeans([{"ratios_vs_autofuse": {"random-search": 3.0}}])  # no mark: seeded, the only kind
    assert old == {"random-search": pytest.approx(3.0)}


def test_a_report_of_autofuse_alone_has_no_empty_geomean_line():
    """`--columns autofuse` measures no peer: the table says nothing about geomeans then
    (it printed "Geometric mean over spaces: ." before)."""
    from autofuse.bench.report import markdown_report

    peaks = {"peak_gflops": 150.0, "bandwidth_gbs": 30.0, "peak_source": "numpy"}
    space = {"space": "ew_chain", "columns": {"autofuse": {"name": "autofuse", "correct": True, "median_ms": 2.0,
                                                           "spread_ms": 0.1, "samples": 3, "note": "plan abc"}},
             "roofline_ms": 1.8, "autofuse_over_roofline": 1.11, "autofuse_job": {"trials_this_job": 5, "measured": 4}}
    report = {"date": "2026-12-03", "threads": 2, "tvm_version": "0.27", "budget_s": 600, "rounds": 5, "repeats": 3,
              "peaks": peaks, "spaces": [space], "geomean_speedup_of_autofuse": {"autofuse": 1.0}}
    md = markdown_report(report)
    assert "| ew_chain | 2.000" in md and "Geometric mean" not in md
    report["spaces"][0]["columns"]["numpy"] = {"name": "numpy", "correct": True, "median_ms": 8.0, "spread_ms": 1.0,
                                               "samples": 3}
    report["geomean_speedup_of_autofuse"]["numpy"] = 4.0
    assert "Geometric mean over spaces: numpy 4.00x." in markdown_report(report)


def test_a_plan_faster_than_the_roofline_is_explained_under_the_table():
    """A Winograd convolution computes fewer FLOPs than the graph as written: its plan can run
    below the roofline, and the report says why instead of leaving a ratio below 1 unexplained."""
    from autofuse.bench.report import markdown_report

    peaks = {"peak_gflops": 150.0, "bandwidth_gbs": 30.0, "peak_source": "numpy"}
    space = {"space": "conv_bn_relu", "columns": {"autofuse": {"name": "autofuse", "correct": True, "median_ms": 1.0,
                                                               "spread_ms": 0.1, "samples": 3}},
             "roofline_ms": 1.5, "autofuse_over_roofline": 0.67, "autofuse_job": {"trials_this_job": 5, "measured": 4}}
    report = {"date": "2026-12-04", "threads": 2, "tvm_version": "0.27", "budget_s": 600, "rounds": 5, "repeats": 3,
              "peaks": peaks, "spaces": [space], "geomean_speedup_of_autofuse": {"autofuse": 1.0}}
    assert "roofline below 1x" in markdown_report(report)
    assert "conv_bn_relu's" not in markdown_report(report)  # no cache size recorded: no space named
    space["bytes"] = 4.7e6  # fits in the 32 MiB last-level cache recorded by its run: named as such
    report["runs"] = [{"date": "2026-12-04", "spaces": ["conv_bn_relu"],
                       "peaks": {**peaks, "last_level_cache_bytes": 32 << 20}}]
    assert "(conv_bn_relu's 4.7 MB, in this machine's 32 MiB)" in markdown_report(report)
    space["bytes"] = 40e6  # larger than the cache: read from DRAM, not named
    assert "conv_bn_relu's" not in markdown_report(report)
    space["autofuse_over_roofline"] = 1.2
    assert "roofline below 1x" not in markdown_report(report)


def test_the_last_level_cache_is_read_from_sysfs(tmp_path):
    """The largest of the CPU's caches (Linux writes sizes as '48K', '32768K'); None when the
    directory says nothing, as on a machine without sysfs."""
    from autofuse.bench.roofline import last_level_cache_bytes

    assert last_level_cache_bytes(tmp_path) is None
    for i, size in enumerate(["48K", "1024K", "32768K", "bogus"]):
        (tmp_path / f"index{i}").mkdir()
        (tmp_path / f"index{i}" / "size").write_text(size + "\n")
    assert last_level_cache_bytes(tmp_path) == 32 << 20
