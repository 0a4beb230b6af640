"""How a job spends its time on candidates: repeats skipped, slow timings cut short,
run-away candidates stopped by a limit learned from the others."""

import sqlite3
import time

import optuna
import pytest

from autofuse.runner import (CONFIRM_ROUNDS, DISTURBED_FACTOR, HAND_PICKED_GATE, OK, RECENT_TIMINGS, STALE_AFTER, STALE_GATE, TIMEOUT,
                             CandidateLog, IsolatedRunner, run_task,
                             value_of)
from autofuse.target import parse_target
from autofuse.workload import get_workload


class FakeRunner:
    """Stands in for IsolatedRunner: returns canned results and records what it was given."""

    def __init__(self, results):
        self.results = list(results)
        self.calls = []

    def run(self, task, timeout_s=None):
        self.calls.append((task, timeout_s))
        return dict(self.results.pop(0))


def _cmp(candidate_ms, incumbent_ms, rounds=None):
    """A worker's answer to a side-by-side comparison: medians overall and per round."""
    per_round = rounds or ([candidate_ms] * 3, [incumbent_ms] * 3)
    return {"status": OK, "median_ms": [candidate_ms, incumbent_ms], "round_ms": list(per_round)}


def _won(candidate_ms, incumbent_ms):
    """A win side by side and its replicate, the same again (``CandidateLog.confirm``)."""
    return [_cmp(candidate_ms, incumbent_ms), _cmp(candidate_ms, incumbent_ms)]


def _task(**extra):
    return {"space": "ew_chain", "plan": "{}", "timing": {"repeats": 3}, **extra}


def test_a_plan_seen_before_is_answered_from_the_log_without_running():
    runner = FakeRunner([{"status": OK, "median_ms": 2.0}, {"status": TIMEOUT, "error": "candidate timed out"}])
    log = CandidateLog()
    first = log.run(runner, _task(), "aaaa", 20.0)
    again = log.run(runner, _task(), "aaaa", 20.0)
    assert first["median_ms"] == again["median_ms"] == 2.0 and not first.get("repeat") and again["repeat"]
    log.run(runner, _task(), "bbbb", 20.0)
    assert log.run(runner, _task(), "bbbb", 20.0)["status"] == TIMEOUT  # a failure is not retried either
    assert len(runner.calls) == 2


def test_an_injected_fault_always_runs_and_teaches_the_log_nothing():
    runner = FakeRunner([{"status": "crashed", "error": "worker crashed"}, {"status": OK, "median_ms": 1.0}])
    log = CandidateLog()
    assert log.run(runner, _task(inject="segfault"), "aaaa", 20.0)["status"] == "crashed"
    assert log.run(runner, _task(), "aaaa", 20.0)["status"] == OK  # the plan itself runs
    assert len(runner.calls) == 2


def test_time_limit_follows_accepted_candidates_within_the_configured_cap():
    log = CandidateLog()
    for i in range(4):
        log.record(f"p{i}", {"status": OK, "median_ms": 1.0}, 0.5)
    assert log.time_limit_s(300.0) == 300.0  # too few to tell: the configured limit
    log.record("p4", {"status": OK, "median_ms": 1.0}, 0.5)
    assert log.time_limit_s(300.0) == 5.0  # never below the floor
    for i in range(5, 20):
        log.record(f"p{i}", {"status": OK, "median_ms": 1.0}, 4.0)
    assert log.time_limit_s(300.0) == 20.0  # 5 x the 90th percentile
    assert log.time_limit_s(8.0) == 8.0  # the configured limit stays the upper bound
    log.record("slow", {"status": TIMEOUT}, 99.0)  # failures do not move the limit
    assert log.time_limit_s(300.0) == 20.0


def test_the_timing_cutoff_follows_the_best_time_and_reaches_the_worker():
    runner = FakeRunner([{"status": OK, "median_ms": 4.0}, {"status": OK, "median_ms": 1.0},
                         *_won(1.1, 4.4), {"status": OK, "median_ms": 9.0}])
    log = CandidateLog()
    log.run(runner, _task(), "a", 20.0)
    assert "cutoff_ms" not in runner.calls[0][0]["timing"]  # no best yet: full timing
    log.run(runner, _task(), "b", 20.0)
    assert runner.calls[1][0]["timing"]["cutoff_ms"] == 20.0  # 5 x 4.0
    log.run(runner, _task(), "c", 20.0)  # (calls[2-3]: b timed against a, 4x faster, twice)
    assert runner.calls[4][0]["timing"] == {"repeats": 3, "cutoff_ms": 5.0}  # 5 x 1.0, other settings kept
    assert log.best_ms == 1.0


def test_a_candidate_timed_below_the_best_takes_its_place_only_if_faster_side_by_side():
    runner = FakeRunner([{"status": OK, "median_ms": 4.0},
                         {"status": OK, "median_ms": 1.0}, _cmp(2.2, 2.0),  # lucky once
                         {"status": OK, "median_ms": 1.5}, *_won(1.0, 2.0),  # really faster
                         {"status": OK, "median_ms": 2.5},
                         {"status": OK, "median_ms": 0.9}, _cmp(0.99, 1.0),  # a tie
                         {"status": OK, "median_ms": 0.5},  # 10% faster overall, but slower in one round
                         _cmp(0.9, 1.0, rounds=([0.8, 0.9, 1.05], [1.0, 1.0, 1.0])),
                         {"status": OK, "median_ms": 0.5}, *_won(0.6, 1.2)])  # faster again, on a slower machine
    log = CandidateLog()
    log.run(runner, _task(plan='{"p":"a"}'), "a", 20.0)
    lucky = log.run(runner, _task(plan='{"p":"b"}'), "b", 20.0)
    compare_task = runner.calls[2][0]
    assert compare_task["plan"] == '{"p":"b"}' and compare_task["compare_with"] == '{"p":"a"}'
    assert compare_task["rounds"] == CONFIRM_ROUNDS and "cutoff_ms" not in compare_task["timing"]
    # a's 4.0 was one lone timing, and a took 2.0 side by side: the scale starts from there
    assert lucky["median_ms"] == 1.0 and value_of(lucky) == pytest.approx(2.2)  # 10% slower than a, on a's scale
    assert not lucky["confirm"]["faster"] and (log.best_ms, log.best_hash, log.best_compared) == (2.0, "a", True)
    faster = log.run(runner, _task(plan='{"p":"c"}'), "c", 20.0)
    assert value_of(faster) == pytest.approx(1.0) and faster["confirm"]["faster"]
    assert (log.best_ms, log.best_hash, log.best_plan) == (pytest.approx(1.0), "c", '{"p":"c"}')
    slower = log.run(runner, _task(plan='{"p":"d"}'), "d", 20.0)  # above the best: no comparison
    assert value_of(slower) == 2.5 and "confirm" not in slower and len(runner.calls) == 7
    tie = log.run(runner, _task(plan='{"p":"e"}'), "e", 20.0)  # 1% faster side by side: within the margin
    assert value_of(tie) == pytest.approx(1.0) and not tie["confirm"]["faster"] and log.best_hash == "c"
    mixed = log.run(runner, _task(plan='{"p":"g"}'), "g", 20.0)
    assert value_of(mixed) == pytest.approx(1.0) and not mixed["confirm"]["faster"] and log.best_hash == "c"
    # c's value came from a side-by-side timing: now the scale is kept, whatever the machine does
    again = log.run(runner, _task(plan='{"p":"f"}'), "f", 20.0)
    assert value_of(again) == pytest.approx(0.5) and log.best_hash == "f"
    assert value_of(log.run(runner, _task(plan='{"p":"b"}'), "b", 20.0)) == pytest.approx(2.2)  # a repeat keeps its score
    rebuilt = _log_of_trials([("a", 4.0, None), ("f", 0.5, again["confirm"])])
    assert rebuilt.best_hash == "f" and rebuilt.best_compared  # a resumed job keeps the scale too


def test_a_win_side_by_side_counts_only_if_its_replicate_wins():
    """A gemm_bn job's score fell from 1.34 to 0.85 ms over ten wins of 3-9% each while every
    plan it compared ran 1.31-1.48 ms side by side (NOTES 53): among hundreds of candidates
    tied with the best, some win one comparison by luck.  A win is compared once more: a
    lost replicate is a tie, a won one scores by the smaller gain (here its own: the first's
    was chosen for being low), and a replicate that fails to run leaves a tie."""
    runner = FakeRunner([{"status": OK, "median_ms": 1.40},
                         {"status": OK, "median_ms": 1.30}, _cmp(1.30, 1.41), _cmp(1.42, 1.40),  # b: lucky once
                         {"status": OK, "median_ms": 1.30}, _cmp(1.20, 1.40), _cmp(1.33, 1.40),  # c: 5% faster, not 14%
                         {"status": OK, "median_ms": 1.20}, _cmp(1.20, 1.33), {"status": TIMEOUT, "error": "timed out"}])
    log = CandidateLog()
    log.run(runner, _task(plan='{"p":"a"}'), "a", 20.0)
    b = log.run(runner, _task(plan='{"p":"b"}'), "b", 20.0)
    assert [c[0].get("compare_with") for c in runner.calls] == [None, None, '{"p":"a"}', '{"p":"a"}']
    assert not b["confirm"]["faster"] and b["confirm"]["first"] == {"candidate_ms": 1.30, "incumbent_ms": 1.41}
    assert value_of(b) == pytest.approx(1.42) and log.best_hash == "a"  # a tie, on the replicate's times
    c = log.run(runner, _task(plan='{"p":"c"}'), "c", 20.0)
    assert c["confirm"]["faster"] and value_of(c) == pytest.approx(1.40 * 1.33 / 1.40)
    assert (log.best_hash, log.best_timings) == ("c", [1.33])
    d = log.run(runner, _task(plan='{"p":"d"}'), "d", 20.0)
    assert not d["confirm"]["faster"] and d["confirm"]["replicate_error"].endswith("timed out")
    assert value_of(d) == pytest.approx(1.33) and log.best_hash == "c" and len(runner.calls) == 10


def test_a_replicated_win_scores_by_the_smaller_of_its_two_gains():
    """An attention job's replicate of a real 10% step met a slow incumbent and read it as
    18%, and its score ended 21% below what its plan ran at (NOTES 53).  Neither ratio is
    kept for being low: the win scores by the gain both comparisons show."""
    runner = FakeRunner([{"status": OK, "median_ms": 0.2158},
                         {"status": OK, "median_ms": 0.20}, _cmp(0.2014, 0.2238), _cmp(0.2010, 0.2451),
                         {"status": OK, "median_ms": 0.19}, _cmp(0.1800, 0.2100), _cmp(0.1900, 0.2050)])
    log = CandidateLog()
    log.run(runner, _task(plan='{"p":"a"}'), "a", 20.0)
    b = log.run(runner, _task(plan='{"p":"b"}'), "b", 20.0)  # 0.90 then 0.82: scored 0.90
    assert b["confirm"]["faster"] and value_of(b) == pytest.approx(0.2158 * 0.2014 / 0.2238)
    assert log.best_hash == "b" and log.best_timings == [0.2010]  # its time is the replicate's
    c = log.run(runner, _task(plan='{"p":"c"}'), "c", 20.0)  # 0.86 then 0.93: scored 0.93
    assert c["confirm"]["faster"] and value_of(c) == pytest.approx(value_of(b) * 0.1900 / 0.2050)


def test_the_log_line_of_a_replicated_win_gives_both_comparisons():
    from autofuse.job import _confirm_text

    won = {"vs": "aa", "candidate_ms": 1.33, "incumbent_ms": 1.40, "rounds": 3, "faster": True,
           "first": {"candidate_ms": 1.20, "incumbent_ms": 1.40}}
    assert _confirm_text({"value_ms": 1.33, "confirm": won}) == (
        "; against the best aa side by side: 1.3300 vs 1.4000 ms, new best in the replicate of a win "
        "(1.2000 vs 1.4000 ms), scored 1.3300 ms")
    failed = {**won, "faster": False, "candidate_ms": 1.20, "replicate_error": "timeout: timed out"}
    assert "not faster in the replicate of a win (1.2000 vs 1.4000 ms; the replicate failed: timeout: timed out)" in \
        _confirm_text({"value_ms": 1.40, "confirm": failed})


def test_a_hand_picked_plan_timed_alone_a_little_above_the_best_is_compared_side_by_side():
    """An mlp_gelu job's fast_math seeds were timed alone at 13.3-13.6 ms against a best
    scored 12.81 ms, on a machine where one plan read 27-41 ms within seconds; they were
    never compared, and their 20% step came by mutation 8 minutes later (NOTES 38).  A
    seed (or the stored best) within HAND_PICKED_GATE of the gate is compared; a sampler's
    candidate at the same time is not."""
    runner = FakeRunner([{"status": OK, "median_ms": 2.0},
                         {"status": OK, "median_ms": 1.5}, *_won(1.5, 2.0),  # b: the best, at 1.5 on a's scale
                         {"status": OK, "median_ms": 1.6},  # c, the sampler's, 7% above: not compared
                         {"status": OK, "median_ms": 1.6}, *_won(1.2, 1.5),  # d, a seed, as slow alone: compared, wins
                         {"status": OK, "median_ms": 1.25 * HAND_PICKED_GATE}])  # e, a seed far above d: not compared
    log = CandidateLog()
    log.run(runner, _task(plan='{"p":"a"}'), "a", 20.0)
    log.run(runner, _task(plan='{"p":"b"}'), "b", 20.0)
    sampled = log.run(runner, _task(plan='{"p":"c"}'), "c", 20.0)
    assert "confirm" not in sampled and log.best_hash == "b" and len(runner.calls) == 5
    seed = log.run(runner, _task(plan='{"p":"d"}'), "d", 20.0, hand_picked=True)
    assert runner.calls[6][0]["compare_with"] == '{"p":"b"}' and seed["confirm"]["faster"]
    assert log.best_hash == "d" and value_of(seed) == pytest.approx(1.5 * 1.2 / 1.5)
    far = log.run(runner, _task(plan='{"p":"e"}'), "e", 20.0, hand_picked=True)
    assert "confirm" not in far and log.best_hash == "d" and len(runner.calls) == 9


def test_a_gate_that_no_candidate_passes_for_a_while_is_retimed_beside_one_of_them():
    """An attention job's best ran 0.26 ms beside a candidate in a quiet moment, then
    0.26-0.46 ms; the gate stood at 0.269 ms and none of the 530 candidates of the job's last
    8 minutes timed alone below it, so none was compared (NOTES 59).  After STALE_AFTER
    candidates with no comparison, one timed alone within STALE_GATE of the gate is
    compared, and the best's time beside it moves the gate."""
    slow = 0.9  # what a plan as fast as the best times alone on the busier machine
    runner = FakeRunner([{"status": OK, "median_ms": 1.0},  # a: the first best
                         {"status": OK, "median_ms": 0.95}, _cmp(0.95, 0.80),  # b: a tie, beside a quiet best
                         *[{"status": OK, "median_ms": slow}] * STALE_AFTER,  # not compared: above the gate
                         {"status": OK, "median_ms": 0.80 * STALE_GATE * 1.01},  # stale, but past STALE_GATE
                         {"status": OK, "median_ms": slow}, _cmp(0.91, 0.92),  # stale: compared, a tie
                         {"status": OK, "median_ms": 0.91}, *_won(0.80, 0.92)])  # below the moved gate: a win
    log = CandidateLog()
    log.run(runner, _task(plan='{"p":"a"}'), "a", 20.0)
    log.run(runner, _task(plan='{"p":"b"}'), "b", 20.0)
    assert log.compare_below_ms() == 0.80 and log.uncompared == 0
    for i in range(STALE_AFTER):
        assert "confirm" not in log.run(runner, _task(plan=f'{{"p":"c{i}"}}'), f"c{i}", 20.0)
    assert log.uncompared == STALE_AFTER
    assert "confirm" not in log.run(runner, _task(plan='{"p":"d"}'), "d", 20.0)
    tie = log.run(runner, _task(plan='{"p":"e"}'), "e", 20.0)
    assert runner.calls[-1][0]["compare_with"] == '{"p":"a"}' and not tie["confirm"]["faster"]
    assert log.compare_below_ms() == 0.92 and log.uncompared == 0
    won = log.run(runner, _task(plan='{"p":"f"}'), "f", 20.0)
    assert won["confirm"]["faster"] and log.best_hash == "f" and not runner.results
    rebuilt = _log_of_trials([("a", 1.0, None), ("b", 1.0, {"vs": "a", "candidate_ms": 0.95, "incumbent_ms": 0.80}),
                              ("c", 1.1, None), ("d", 1.1, None)])
    assert rebuilt.uncompared == 2  # a resumed job counts on


def test_a_seed_timed_alone_at_twice_the_best_is_still_compared():
    """A mobilenet_block job timed its ``tall`` seed alone at 0.350 ms, 1.9x the default plan's
    lone 0.181, in the slow first seconds of the job; side by side the seed runs 7% faster
    (NOTES 41).  A seed is compared up to HAND_PICKED_GATE (2.5x) of the gate."""
    runner = FakeRunner([{"status": OK, "median_ms": 0.181},  # the default plan, the first best
                         {"status": OK, "median_ms": 0.350}, *_won(0.176, 0.189)])  # the seed: compared, wins
    log = CandidateLog()
    log.run(runner, _task(plan='{"p":"default"}'), "default", 20.0)
    seed = log.run(runner, _task(plan='{"p":"tall"}'), "tall", 20.0, hand_picked=True)
    assert runner.calls[2][0]["compare_with"] == '{"p":"default"}' and seed["confirm"]["faster"]
    assert log.best_hash == "tall"
    runner = FakeRunner([{"status": OK, "median_ms": 0.181}, {"status": OK, "median_ms": 0.350}])
    log = CandidateLog()
    log.run(runner, _task(plan='{"p":"default"}'), "default", 20.0)
    sampled = log.run(runner, _task(plan='{"p":"tall"}'), "tall", 20.0)  # a sampler's plan: not compared
    assert "confirm" not in sampled and log.best_hash == "default" and len(runner.calls) == 2


def test_a_tie_with_a_lone_first_timing_rescales_the_best():
    """The first plan of a job, timed alone in a fresh worker, ran 2.46 ms; side by side it
    ran 1.38 ms against a candidate that was faster overall but not in every round.  The tie
    leaves the first plan the best, at 1.38 ms: scored on the lone 2.46 ms, every later
    candidate had to beat that number alone to be compared at all (a random-search job of
    conv_bn_relu stayed at 2.46 ms for its 10 minutes, NOTES 22)."""
    runner = FakeRunner([{"status": OK, "median_ms": 2.46},
                         {"status": OK, "median_ms": 1.32}, _cmp(1.29, 1.38, rounds=([1.2, 1.29, 1.5], [1.38] * 3)),
                         {"status": OK, "median_ms": 1.35}, *_won(1.2, 1.4)])
    log = CandidateLog()
    log.run(runner, _task(plan='{"p":"a"}'), "a", 20.0)
    tie = log.run(runner, _task(plan='{"p":"b"}'), "b", 20.0)
    assert not tie["confirm"]["faster"] and value_of(tie) == pytest.approx(1.38)
    assert (log.best_ms, log.best_hash, log.best_compared) == (pytest.approx(1.38), "a", True)
    won = log.run(runner, _task(plan='{"p":"c"}'), "c", 20.0)  # 1.35 alone: below 1.38, so compared
    assert won["confirm"]["faster"] and value_of(won) == pytest.approx(1.38 * 1.2 / 1.4)
    assert log.best_hash == "c"


def test_a_comparison_in_which_the_incumbent_runs_far_above_its_recent_time_is_run_again():
    """An attention job's incumbent ran 0.176-0.193 ms side by side, then 0.302 ms in one
    comparison 40 s later, against which a candidate at 0.203 ms counted 1.5x faster and
    kept that score for the rest of the job (NOTES 31).  Such a comparison is run once
    more; a second one disturbed too judges the candidate against the incumbent's recent
    time, and leaves the incumbent's new time as its recent one."""
    runner = FakeRunner([{"status": OK, "median_ms": 0.5},
                         {"status": OK, "median_ms": 0.2}, *_won(0.1761, 0.1926),  # b wins
                         {"status": OK, "median_ms": 0.15}, _cmp(0.1798, 0.1781),  # c ties: b ran 0.1781
                         {"status": OK, "median_ms": 0.12}, _cmp(0.2028, 0.3021), _cmp(0.2030, 0.3000),
                         {"status": OK, "median_ms": 0.10}, _cmp(0.4, 0.5), _cmp(0.3, 0.3),  # disturbed, then a tie
                         {"status": OK, "median_ms": 0.10}, *[_cmp(0.15, 0.45), _cmp(0.2, 0.5)] * 2])  # faster still, twice
    log = CandidateLog()
    log.run(runner, _task(plan='{"p":"a"}'), "a", 20.0)
    log.run(runner, _task(plan='{"p":"b"}'), "b", 20.0)
    assert (log.best_hash, log.best_ms, log.best_recent_ms) == ("b", pytest.approx(0.1761), 0.1761)
    log.run(runner, _task(plan='{"p":"c"}'), "c", 20.0)
    assert (log.best_hash, log.best_recent_ms) == ("b", 0.1781)
    d = log.run(runner, _task(plan='{"p":"d"}'), "d", 20.0)
    assert 0.3021 > DISTURBED_FACTOR * 0.1781 and len(runner.calls) == 9  # compared twice
    assert not d["confirm"]["faster"] and value_of(d) == pytest.approx(0.1761)  # 0.203 is slower than 0.178
    assert d["confirm"] == {"vs": "b", "candidate_ms": 0.2030, "incumbent_ms": 0.3000, "rounds": CONFIRM_ROUNDS,
                            "faster": False, "attempts": 2, "disturbed": True, "recent_ms": 0.1781}
    assert (log.best_hash, log.best_recent_ms) == ("b", 0.3)  # the machine is slower now: judged from here on
    e = log.run(runner, _task(plan='{"p":"e"}'), "e", 20.0)  # 0.5 > 1.25 x 0.3: the repeat decides
    assert e["confirm"]["attempts"] == 2 and not e["confirm"]["disturbed"] and not e["confirm"]["faster"]
    assert value_of(e) == pytest.approx(0.1761) and log.best_hash == "b"
    f = log.run(runner, _task(plan='{"p":"f"}'), "f", 20.0)  # disturbed twice, faster than b's recent time too
    assert f["confirm"]["faster"] and value_of(f) == pytest.approx(0.1761 * 0.2 / 0.3)
    assert (log.best_hash, log.best_recent_ms) == ("f", 0.2)
    rebuilt = _log_of_trials([("a", 0.5, None), ("b", 0.1761, {"vs": "a", "candidate_ms": 0.1761,
                                                                  "incumbent_ms": 0.1926, "faster": True}),
                              ("c", 0.1761, {"vs": "b", "candidate_ms": 0.1798, "incumbent_ms": 0.1781,
                                             "faster": False})])
    assert (rebuilt.best_hash, rebuilt.best_recent_ms) == ("b", 0.1781)  # a resumed job knows b's recent time


def test_a_first_comparison_with_the_incumbent_far_above_its_lone_timing_is_run_again():
    """A mobilenet_block job's unfused first plan timed 0.510 ms alone, then 0.813 ms side by
    side with the default plan (0.249 ms), which was scored 0.510 x 0.249/0.813 = 0.156 ms,
    below anything a plan ran at alone (NOTES 32).  The lone timing is the incumbent's
    recent time for the disturbed check."""
    runner = FakeRunner([{"status": OK, "median_ms": 0.5104},
                         {"status": OK, "median_ms": 0.20}, *[_cmp(0.2485, 0.8126), _cmp(0.2490, 0.8000)] * 2,
                         {"status": OK, "median_ms": 0.5104},
                         {"status": OK, "median_ms": 0.20}, _cmp(0.2485, 0.8126), *_won(0.24, 0.50)])
    log = CandidateLog()
    log.run(runner, _task(plan='{"p":"a"}'), "a", 20.0)
    b = log.run(runner, _task(plan='{"p":"b"}'), "b", 20.0)  # disturbed twice: judged against a's 0.5104
    assert b["confirm"]["disturbed"] and b["confirm"]["recent_ms"] == 0.5104 and b["confirm"]["faster"]
    assert value_of(b) == pytest.approx(0.2490) and (log.best_hash, log.best_recent_ms) == ("b", 0.2490)
    log = CandidateLog()
    log.run(runner, _task(plan='{"p":"a"}'), "a", 20.0)
    b = log.run(runner, _task(plan='{"p":"b"}'), "b", 20.0)  # the repeat is clean: it decides
    # a ran 0.50 side by side, below its lone 0.5104: the scale starts from there (NOTES 22)
    first = b["confirm"]["first"]  # (the replicate, clean at once, decides whether it won)
    assert first["attempts"] == 2 and not first["disturbed"] and value_of(b) == pytest.approx(0.50 * 0.24 / 0.50)


def test_a_candidate_is_compared_when_timed_below_the_best_plans_timed_median_even_above_its_score():
    """A score can fall below what the best plan runs at; candidates timed alone below that
    time are still compared, or the job would stop comparing (NOTES 32)."""
    runner = FakeRunner([{"status": OK, "median_ms": 0.5},
                         {"status": OK, "median_ms": 0.2}, *_won(0.25, 0.6),  # scored 0.5 x 0.25/0.6
                         {"status": OK, "median_ms": 0.22}, *_won(0.21, 0.25),  # above the score: compared
                         {"status": OK, "median_ms": 0.23}])  # above the best's 0.21 ms: not compared
    log = CandidateLog()
    log.run(runner, _task(plan='{"p":"a"}'), "a", 20.0)
    log.run(runner, _task(plan='{"p":"b"}'), "b", 20.0)
    assert (log.best_ms, log.best_recent_ms, log.compare_below_ms()) == (pytest.approx(0.5 * 0.25 / 0.6), 0.25, 0.25)
    c = log.run(runner, _task(plan='{"p":"c"}'), "c", 20.0)
    assert c["confirm"]["faster"] and value_of(c) == pytest.approx(0.5 * 0.25 / 0.6 * 0.21 / 0.25)
    assert log.best_hash == "c" and log.compare_below_ms() == 0.21
    d = log.run(runner, _task(plan='{"p":"d"}'), "d", 20.0)
    assert "confirm" not in d and len(runner.calls) == 8 and log.best_hash == "c"
    assert value_of(d) == pytest.approx(log.best_ms * 0.23 / 0.21)  # on the score's scale, above it


def test_a_score_above_what_the_best_runs_side_by_side_does_not_gate_the_comparisons():
    """A gemm_bn job's score stood at 4.03 ms for a plan that ran 2.62 ms side by side, and
    298 of its 411 candidates, timed alone below the score, were compared; none was faster
    (NOTES 56).  The gate is what the best runs at side by side; a candidate above it is not
    compared, and is scored on the score's scale, so it cannot read faster than the best."""
    from autofuse.job import _confirm_text

    runner = FakeRunner([{"status": OK, "median_ms": 4.0},
                         {"status": OK, "median_ms": 3.0}, *_won(3.6, 4.0),  # b wins on a slow host: scored 3.6
                         *[x for _ in range(2)  # the host speeds up: two ties, the best at 2.6 side by side
                           for x in ({"status": OK, "median_ms": 2.5}, _cmp(2.7, 2.6))],
                         {"status": OK, "median_ms": 2.9},  # below the score, above the best's time: not compared
                         {"status": OK, "median_ms": 2.9}, _cmp(2.7, 2.6),  # a seed there is compared (wider gate)
                         {"status": OK, "median_ms": 2.5}, *_won(2.34, 2.6)])  # below it: compared, and faster
    log = CandidateLog()
    for h in "abcd":
        log.run(runner, _task(plan=f'{{"p":"{h}"}}'), h, 20.0)
    assert (log.best_hash, log.best_ms, log.best_timings) == ("b", pytest.approx(3.6), [3.6, 2.6, 2.6])
    assert log.side_by_side_ms() == log.compare_below_ms() == 2.6
    e = log.run(runner, _task(plan='{"p":"e"}'), "e", 20.0)
    assert "confirm" not in e and len(runner.calls) == 9 and log.best_hash == "b"
    assert e["median_ms"] == 2.9 and value_of(e) == pytest.approx(3.6 * 2.9 / 2.6)
    assert _confirm_text(e) == ("; not compared (the best runs 2.6000 ms side by side), "
                                "scored 4.0154 ms on the scale of its 3.6000")
    assert value_of(log.run(runner, _task(plan='{"p":"e"}'), "e", 20.0)) == value_of(e)  # a repeat keeps its score
    seed = log.run(runner, _task(plan='{"p":"s"}'), "s", 20.0, hand_picked=True)
    assert not seed["confirm"]["faster"] and "scaled" not in seed and value_of(seed) == pytest.approx(3.6 * 2.7 / 2.6)
    f = log.run(runner, _task(plan='{"p":"f"}'), "f", 20.0)
    assert f["confirm"]["faster"] and log.best_hash == "f" and value_of(f) == pytest.approx(3.6 * 2.34 / 2.6)
    assert not runner.results


def test_one_lucky_timing_of_the_best_does_not_stop_the_comparisons():
    """A conv_bn_relu job's best ran 1.527 ms when it won and 1.49-1.53 ms as the incumbent,
    then 1.429 once; gated by that latest time, none of the 511 candidates of the job's last
    8 minutes was compared (NOTES 36).  The gate is the median of the best's last few
    side-by-side medians when that is higher."""
    runner = FakeRunner([{"status": OK, "median_ms": 1.3},
                         {"status": OK, "median_ms": 1.1}, *_won(1.5266, 1.5784),  # b wins, scored 1.257
                         *[x for inc in (1.4925, 1.5039, 1.5285, 1.4289)  # four ties
                           for x in ({"status": OK, "median_ms": 1.45}, _cmp(1.50, inc))],
                         {"status": OK, "median_ms": 1.45}, *_won(1.40, 1.55)])  # 1.45 alone: compared, and wins
    log = CandidateLog()
    log.run(runner, _task(plan='{"p":"a"}'), "a", 20.0)
    log.run(runner, _task(plan='{"p":"b"}'), "b", 20.0)
    for h in "cdef":
        assert not log.run(runner, _task(plan=f'{{"p":"{h}"}}'), h, 20.0)["confirm"]["faster"]
    assert log.best_hash == "b" and log.best_recent_ms == 1.4289 and log.best_ms == pytest.approx(1.3 * 1.5266 / 1.5784)
    assert log.best_timings == [1.5266, 1.4925, 1.5039, 1.5285, 1.4289][-RECENT_TIMINGS:]
    assert log.compare_below_ms() == pytest.approx(1.5039)
    g = log.run(runner, _task(plan='{"p":"g"}'), "g", 20.0)
    assert g["confirm"]["faster"] and log.best_hash == "g" and log.best_timings == [1.40]
    rebuilt = CandidateLog()
    for h, res in log.results.items():  # a resumed job gates the same way: rebuilt from its records
        if h != "g":
            rebuilt.record(h, res, 1.0)
    assert rebuilt.compare_below_ms() == pytest.approx(1.5039)


def _log_of_trials(rows):
    study = optuna.create_study()
    for h, value, confirm in rows:
        t = study.ask()
        t.set_user_attr("plan", f"plan {h}")
        t.set_user_attr("plan_hash", h)
        t.set_user_attr("status", OK)
        t.set_user_attr("seconds", 0.5)
        if confirm:
            t.set_user_attr("confirm", confirm)
        study.tell(t, value)
    return CandidateLog.from_trials(study.trials)


def test_a_failed_comparison_leaves_the_candidate_its_own_time():
    runner = FakeRunner([{"status": OK, "median_ms": 4.0}, {"status": OK, "median_ms": 1.0},
                         {"status": TIMEOUT, "error": "candidate timed out"}])
    log = CandidateLog()
    log.run(runner, _task(), "a", 20.0)
    res = log.run(runner, _task(), "b", 20.0)
    assert value_of(res) == 1.0 and "timed out" in res["confirm"]["error"] and log.best_hash == "b"


def test_the_log_is_rebuilt_from_a_studys_trials():
    study = optuna.create_study()
    for h, status, value in (("a", OK, 3.0), ("b", OK, 1.5), ("c", TIMEOUT, None)):
        t = study.ask()
        t.set_user_attr("plan", f"plan {h}")
        t.set_user_attr("plan_hash", h)
        t.set_user_attr("status", status)
        t.set_user_attr("seconds", 0.7)
        if value is None:
            study.tell(t, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(t, value)
    t = study.ask()  # a repeat trial points back to a measured plan: not a measurement of its own
    t.set_user_attr("plan_hash", "a")
    t.set_user_attr("status", OK)
    t.set_user_attr("repeat", True)
    study.tell(t, 3.0)
    log = CandidateLog.from_trials(study.trials)
    assert log.best_ms == 1.5 and log.seconds == [0.7, 0.7]
    assert (log.best_hash, log.best_plan) == ("b", "plan b")  # what a resumed job times new candidates against
    assert log.known("a")["median_ms"] == 3.0 and log.known("c")["status"] == TIMEOUT and log.known("d") is None


@pytest.mark.parametrize("cutoff_ms, repeats", [(None, 3), (1e-6, 1)])
def test_a_candidate_slower_than_the_cutoff_is_timed_once(cutoff_ms, repeats):
    w = get_workload("ew_chain", True)
    timing = {"repeats": 3, "min_repeat_ms": 1, "warmup": 1, "cutoff_ms": cutoff_ms}
    res = run_task({"space": "ew_chain", "tiny": True, "plan": w.reference_plan("default").to_json(),
                    "target": "llvm", "timing": timing})
    assert res["status"] == OK and res["correct"]  # checked before timed, cut or not
    assert res["repeats"] == repeats and len(res["samples_ms"]) == repeats and res["median_ms"] > 0


def _time_tiny_default_plan(cutoff_ms: float) -> dict:
    """ew_chain's tiny default plan timed in this process, 3 repeats, under ``cutoff_ms``."""
    w = get_workload("ew_chain", True)
    timing = {"repeats": 3, "min_repeat_ms": 1, "warmup": 1, "cutoff_ms": cutoff_ms}
    return run_task({"space": "ew_chain", "tiny": True, "plan": w.reference_plan("default").to_json(),
                     "target": "llvm", "timing": timing})


def test_the_cutoff_check_times_the_kernels_not_the_copy_of_the_output(monkeypatch):
    """layernorm_residual's plans run in about 0.07 ms and write 3 MB, which copied into NumPy
    from fresh pages (``steady_allocations``, as in every worker) took 0.8 ms per call: with
    the copy inside the cutoff check, every candidate of a job on that space read over 5x
    the best and was timed once, at 10x its time (NOTES 65).  Here the copy is made to take
    200 ms, twice the cutoff, and the plan (microseconds) must still be timed in full.  With
    a real copy this test compared two timings of a loaded CI machine and failed by chance."""
    from autofuse import measure

    real_call = measure.Session.__call__

    def slow_copy(self, args):
        time.sleep(0.2)
        return real_call(self, args)

    monkeypatch.setattr(measure.Session, "__call__", slow_copy)
    res = _time_tiny_default_plan(cutoff_ms=100.0)
    assert res["status"] == OK and res["correct"]
    assert res["repeats"] == 3 and max(res["samples_ms"]) < 100.0, res["samples_ms"]


def test_one_slow_call_alone_does_not_cut_the_timing(monkeypatch):
    """A first call over the cutoff is followed by a second; only when that one is slow too
    is the candidate timed once.  Here the first call "took" 1000 s, the second was real."""
    from autofuse import measure

    real, calls = measure.Session._call_ms, []

    def first_call_slow(self, args):
        calls.append(real(self, args))
        return 1e6 if len(calls) == 1 else calls[-1]

    monkeypatch.setattr(measure.Session, "_call_ms", first_call_slow)
    res = _time_tiny_default_plan(cutoff_ms=1000.0)
    assert res["status"] == OK and res["correct"]
    assert len(calls) == 2 and res["repeats"] == 3 and max(res["samples_ms"]) < 1000.0


def _job_with_the_default_plan_queued_again(tmp_path, user_attrs: dict | None):
    """A tiny job whose queue ends with the default plan once more (``user_attrs`` on that
    trial; without a label it stands for the sampler's own suggestion): its config, result
    and trials."""
    from autofuse.job import JobConfig, prepare_study, run_job
    from autofuse.measure import TimingConfig
    from autofuse.search import PlanSpace

    quick = TimingConfig(repeats=2, min_repeat_ms=1, warmup=1)
    cfg = JobConfig(space="ew_chain", tiny=True, db_url=f"sqlite:///{tmp_path}/t.db", seed=0, warm_start=False,
                    timing=quick, final_timing=quick, top_k=1, log_dir=str(tmp_path), mutation_rate=0.0)
    study = prepare_study(cfg)
    w = get_workload("ew_chain", True)
    study.enqueue_trial(PlanSpace(w).params_of(w.reference_plan("default")), user_attrs=user_attrs,
                        skip_if_exists=False)
    cfg.trials = len(study.get_trials(states=(optuna.trial.TrialState.WAITING,)))
    result = run_job(cfg)
    return cfg, result, optuna.load_study(study_name=cfg.study_name(), storage=cfg.db_url).trials


def test_a_plan_suggested_again_in_a_job_is_not_measured_again(tmp_path):
    cfg, _, trials = _job_with_the_default_plan_queued_again(tmp_path, {"label": "again"})
    by_label = {t.user_attrs.get("label"): t for t in trials}
    again, default = by_label["again"], by_label["default"]
    assert again.user_attrs["plan_hash"] == default.user_attrs["plan_hash"]
    assert again.user_attrs.get("repeat") and again.value == default.value
    assert "seconds" in default.user_attrs and "seconds" not in again.user_attrs
    con = sqlite3.connect(f"{tmp_path}/t.db")
    (measured,) = con.execute("select count(*) from af_measurements where kind = 'trial' and study = ?",
                              (cfg.study_name(),)).fetchone()
    assert measured == len(trials) - 1


def test_the_samplers_suggestion_of_a_plan_measured_before_is_pruned_not_told_its_time(tmp_path):
    _, result, trials = _job_with_the_default_plan_queued_again(tmp_path, None)  # no label: "tuned"
    default = next(t for t in trials if t.user_attrs.get("label") == "default")
    again = next(t for t in trials if t.user_attrs.get("label", "tuned") == "tuned")
    assert again.user_attrs["plan_hash"] == default.user_attrs["plan_hash"] and again.user_attrs.get("repeat")
    assert again.state == optuna.trial.TrialState.PRUNED and again.value is None
    assert default.state == optuna.trial.TrialState.COMPLETE
    assert result.repeats == 1 and result.pruned == 1 and result.complete == len(trials) - 1


def test_tpe_suggests_fewer_plans_measured_before_when_their_repeats_are_pruned():
    """The reason repeats are pruned (``pruned_as_repeat``): told complete, every repeat of a
    good plan joins TPE's best trials as another copy of it and draws later suggestions back
    to it.  A search of 200 trials over six four-way knobs, as a tuning job tells them."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    names = [f"k{i}" for i in range(6)]

    def repeats(tell_repeat_as: str) -> int:
        study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0, multivariate=True, n_startup_trials=10))
        seen, again = set(), 0
        for _ in range(200):
            t = study.ask()
            x = tuple(t.suggest_categorical(n, [0, 1, 2, 3]) for n in names)
            value = 1.0 + sum((xi - 1) ** 2 for xi in x) + 0.3 * x[0] * x[1]
            if x in seen and tell_repeat_as == "pruned":
                study.tell(t, state=optuna.trial.TrialState.PRUNED)
            else:
                study.tell(t, value)
            again += x in seen
            seen.add(x)
        return again

    told, pruned = repeats("complete"), repeats("pruned")
    assert pruned <= 0.7 * told, (told, pruned)


def test_comparing_two_plans_in_a_worker_times_them_interleaved_on_kept_builds():
    w = get_workload("ew_chain", True)
    default, unfused = w.reference_plan("default").to_json(), w.reference_plan("unfused").to_json()
    timing = {"repeats": 2, "min_repeat_ms": 1, "warmup": 1}
    base = {"space": "ew_chain", "tiny": True, "target": "llvm", "timing": timing}
    log = CandidateLog()
    with IsolatedRunner(120.0) as runner:
        first = log.run(runner, {**base, "plan": default}, w.reference_plan("default").hash, 120.0)
        assert first["status"] == OK and log.best_plan == default
        log.best_ms = 1e6  # as if the default plan had been timed in a busy moment: the next one is compared
        second = log.run(runner, {**base, "plan": unfused}, w.reference_plan("unfused").hash, 120.0)
    c = second["confirm"]
    assert second["status"] == OK and "error" not in c and c["vs"] == w.reference_plan("default").hash
    assert c["candidate_ms"] > 0 and c["incumbent_ms"] > 0
    ratio = c["candidate_ms"] / c["incumbent_ms"]
    # the best's 1e6 is a lone timing: the scale starts from the side-by-side timing, win or tie
    assert value_of(second) == pytest.approx(c["incumbent_ms"] * (ratio if c["faster"] else max(1.0, ratio)))
    assert log.best_compared and log.best_ms <= c["incumbent_ms"]
    cmp = run_task({**base, "plan": unfused, "compare_with": default, "rounds": 3})
    assert cmp["status"] == OK and [len(s) for s in cmp["samples_ms"]] == [6, 6]  # 3 rounds x 2 repeats each
    assert [len(r) for r in cmp["round_ms"]] == [3, 3]
    bad = run_task({**base, "plan": unfused, "compare_with": '{"groups": "nonsense"}', "rounds": 1})
    assert bad["status"] not in (OK,) and bad["error"]


def test_a_worker_whose_job_is_gone_exits_quietly(capfd):
    import signal

    from autofuse.runner import _worker_main

    class GoneJob:  # the job was killed while the worker built its candidate
        def __init__(self):
            self.tasks = [{"space": "ew_chain", "tiny": True, "plan": "not a plan", "target": "llvm"}]

        def recv(self):
            return self.tasks.pop(0)

        def send(self, _result):
            raise BrokenPipeError(32, "Broken pipe")

    before = signal.getsignal(signal.SIGINT)
    try:
        _worker_main(GoneJob(), None)  # returns: no BrokenPipeError, no traceback on stderr
    finally:
        signal.signal(signal.SIGINT, before)
    assert "Traceback" not in capfd.readouterr().err


def test_plans_are_timed_in_rounds_that_alternate_their_order(monkeypatch):
    """Side-by-side comparisons and the final re-measurement time plans A B C, then C B A:
    each plan as often early as late, and the plans of one round still built in the next."""
    import autofuse.build
    from autofuse import runner as runner_mod
    from autofuse.runner import interleaved

    assert list(interleaved(3, 3)) == [0, 1, 2, 2, 1, 0, 0, 1, 2]
    assert list(interleaved(2, 0)) == []
    # a final re-measurement (default top-k 3 and the two references) builds each plan once
    w = get_workload("ew_chain", tiny=True)
    plans = [w.partition_plan(((0, 1, 2, 3),), True, f"p{t}", [{"t0": t}]) for t in (1, 2, 4)]
    plans += [w.reference_plan("unfused"), w.reference_plan("default")]
    built = []
    monkeypatch.setattr(autofuse.build, "build", lambda g, plan, target, reuse_kernels=False: built.append(plan.hash) or plan.hash)
    monkeypatch.setattr(runner_mod, "_RECENT_BUILDS", type(runner_mod._RECENT_BUILDS)())
    target = parse_target('{"kind": "llvm"}')
    for i in interleaved(len(plans), 3):
        assert runner_mod._built(w, plans[i], target, keep=True) == plans[i].hash
    assert sorted(built) == sorted(p.hash for p in plans)


def _count_builds(monkeypatch) -> list[str]:
    """The hashes of the plans built from here on, in order, with this process's kept builds emptied."""
    import autofuse.build
    from autofuse import runner as runner_mod

    real_build, built = autofuse.build.build, []

    def counting_build(g, plan, target, reuse_kernels=False):
        built.append(plan.hash)
        return real_build(g, plan, target, reuse_kernels=reuse_kernels)

    monkeypatch.setattr(autofuse.build, "build", counting_build)
    monkeypatch.setattr(runner_mod, "_RECENT_BUILDS", type(runner_mod._RECENT_BUILDS)())
    return built


def test_each_comparison_builds_its_plans_anew(monkeypatch):
    """A build that landed badly in memory runs up to 1.4x slower for as long as it lives
    (NOTES 62): a comparison does not reuse the builds of an earlier one, a plain measurement
    of a plan built before does."""
    from autofuse import runner as runner_mod
    from autofuse.measure import QUICK
    from autofuse.runner import evaluate_plan

    w = get_workload("ew_chain", tiny=True)
    a, b = (w.partition_plan(((0, 1, 2, 3),), True, f"p{t}", [{"t0": t}]) for t in (1, 2))
    built = _count_builds(monkeypatch)
    target = parse_target('{"kind": "llvm"}')
    assert evaluate_plan(w, a, target, QUICK, keep_build=True)["status"] == OK
    assert evaluate_plan(w, a, target, QUICK, keep_build=True)["status"] == OK
    assert built == [a.hash]
    for _ in range(2):
        res = runner_mod.compare_plans(w, [a, b], target, QUICK, rounds=1)
        assert res["status"] == OK and len(res["median_ms"]) == 2
    assert built == [a.hash, a.hash, b.hash, a.hash, b.hash]


def test_a_finals_contenders_are_linked_anew_each_round_its_references_once(monkeypatch):
    """A final times each plan in many rounds; a contender's build that landed badly would
    rank it low in all of them (NOTES 62), so each of its runs links it anew and keeps no
    build; a reference keeps its one build, whose changes over the rounds are the host's."""
    from dataclasses import asdict

    from autofuse import runner as runner_mod
    from autofuse.measure import QUICK

    w = get_workload("ew_chain", tiny=True)
    a = w.partition_plan(((0, 1, 2, 3),), True, "p1", [{"t0": 1}])
    built = _count_builds(monkeypatch)
    task = {"space": "ew_chain", "tiny": True, "plan": a.to_json(), "target": '{"kind": "llvm"}',
            "timing": asdict(QUICK)}
    for _ in range(2):
        assert runner_mod.run_task({**task, "fresh_build": True})["status"] == OK
    assert built == [a.hash, a.hash] and not runner_mod._RECENT_BUILDS  # linked each time, kept nothing
    for _ in range(2):
        assert runner_mod.run_task(task)["status"] == OK
    assert built == [a.hash] * 3 and len(runner_mod._RECENT_BUILDS) == 1  # one build, kept for both


def test_timing_processes_keep_glibcs_mmap_threshold():
    """glibc raises its mmap threshold as large blocks are freed, and a long-lived process
    then runs later builds up to 1.9x slower (NOTES 62); the CLI and every worker pin it."""
    import platform

    from autofuse.measure import steady_allocations

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        pytest.skip("mallopt is glibc's")
    assert steady_allocations() is True


def test_the_comparisons_script_lists_a_studys_side_by_side_timings(tmp_path):
    """benchmarks/study_comparisons.py, the read NOTES 32 quotes: one line per comparison."""
    import subprocess
    import sys
    from pathlib import Path

    url = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(study_name="s", storage=url)
    rows = [("a", 0.5, None),
            ("b", 0.1761, {"vs": "a", "candidate_ms": 0.1761, "incumbent_ms": 0.1926, "rounds": 3, "faster": True}),
            ("d", 0.1761, {"vs": "b", "candidate_ms": 0.2030, "incumbent_ms": 0.3000, "rounds": 3, "faster": False,
                           "attempts": 2, "disturbed": True, "recent_ms": 0.1781}),
            ("e", 0.9, {"vs": "b", "error": "timeout: candidate timed out"}),
            ("f", 0.15, {"vs": "b", "candidate_ms": 0.15, "incumbent_ms": 0.18, "rounds": 3, "faster": True,
                         "first": {"candidate_ms": 0.14, "incumbent_ms": 0.18}})]
    for h, value, confirm in rows:
        attrs = {"plan_hash": h, **({"confirm": confirm} if confirm else {})}
        study.add_trial(optuna.trial.create_trial(value=value, user_attrs=attrs))
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "study_comparisons.py"
    out = subprocess.run([sys.executable, str(script), url, "s"], capture_output=True, text=True, check=True)
    lines = out.stdout.splitlines()
    assert len(lines) == 5 and lines[-1] == "4 comparisons, 1 run twice"
    assert lines[0].endswith("b  score 0.1761  vs a: 0.1761 vs 0.1926 ms, faster")
    assert lines[1].endswith("d  score 0.1761  vs b: 0.2030 vs 0.3000 ms, tie  "
                             "(run twice, recent 0.1781 ms, disturbed the second time)")
    assert lines[2].endswith("e  comparison failed: timeout: candidate timed out")
    assert lines[3].endswith("f  score 0.1500  vs b: 0.1500 vs 0.1800 ms, faster  (replicating a win of 0.1400 vs 0.1800 ms)")


def test_the_stability_script_times_stored_plans_and_variants_over_fresh_workers(tmp_path):
    """benchmarks/plan_stability.py, the experiment NOTES 33 quotes."""
    import subprocess
    import sys
    from pathlib import Path

    from autofuse.db import PlanDB
    from autofuse.target import host_fingerprint, parse_target

    w = get_workload("ew_chain", True)
    plan = w.reference_plan("default")
    url = f"sqlite:///{tmp_path / 'p.db'}"
    with PlanDB(url) as db:
        db.put_workload(w.hash, w.name, w.graph_json())
        db.put_plan(w.hash, parse_target("llvm").spec, host_fingerprint(), plan.hash, plan.to_json(), "default")
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "plan_stability.py"
    out = subprocess.run([sys.executable, str(script), url, "ew_chain", plan.hash[:6], "--tiny", "--rounds", "1",
                          "--variant", f"u16={plan.hash[:6]}:0:unroll=16"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 3 and " round 0 " in lines[0]
    assert lines[1].split()[0] == plan.hash[:8] and lines[2].split()[0] == "u16"
    assert all(line.endswith("ms  (2 runs)") for line in lines[1:])
    bad = subprocess.run([sys.executable, str(script), url, "ew_chain", "ffff"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode != 0 and bad.stderr.strip() == "plan 'ffff': 0 stored plans match, need exactly one"


def test_interleaved_rounds_alternate_and_go_on_in_whole_rounds_until_a_time():
    from autofuse.runner import interleaved

    assert list(interleaved(3, 2)) == [0, 1, 2, 2, 1, 0]
    ticks = iter(range(100))  # a fake clock: one tick per look, looked at once per round after the first two
    order = list(interleaved(2, 2, until=3, clock=lambda: next(ticks)))
    assert order == [0, 1, 1, 0, 0, 1, 1, 0, 0, 1]  # rounds 3-5 ran while the clock read 0, 1, 2
    assert list(interleaved(2, 2, until=0, clock=lambda: 5.0)) == [0, 1, 1, 0]  # never fewer than asked


def test_the_trajectory_script_lists_each_new_best_and_what_it_changed(tmp_path):
    """benchmarks/study_trajectory.py, the read NOTES 35 and 36 quote."""
    import datetime
    import subprocess
    import sys
    from pathlib import Path

    url = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(study_name="s", storage=url)
    dist = {"t0": optuna.distributions.CategoricalDistribution([4, 8]),
            "fast_math": optuna.distributions.CategoricalDistribution([False, True])}
    start = datetime.datetime(2026, 12, 3, 12, 0, 0)
    rows = [(0, 2.0, {"t0": 8, "fast_math": False}, "default"),
            (5, 1.5, {"t0": 4, "fast_math": False}, "seed:registers"),
            (9, 1.7, {"t0": 8, "fast_math": True}, None),  # not a new best: not listed
            (30, 1.2, {"t0": 4, "fast_math": True}, None)]
    for at, value, params, label in rows:
        study.add_trial(optuna.trial.create_trial(
            value=value, params=params, distributions=dist, user_attrs={"label": label} if label else {}))
    import sqlalchemy  # the times a job's trials would have: set in the storage's own table
    engine = sqlalchemy.create_engine(url)
    with engine.begin() as conn:
        for number, (at, *_rest) in enumerate(rows):
            when = start + datetime.timedelta(seconds=at)
            conn.execute(sqlalchemy.text("UPDATE trials SET datetime_start=:s, datetime_complete=:c WHERE number=:n"),
                         {"s": start if number == 0 else when, "c": when, "n": number})
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "study_trajectory.py"
    out = subprocess.run([sys.executable, str(script), url, "s"], capture_output=True, text=True, check=True)
    lines = out.stdout.splitlines()
    assert len(lines) == 3, lines
    assert lines[0].split() == ["0", "s", "trial", "0", "default", "2.0000"]
    assert lines[1].endswith("1.5000  t0: 8 -> 4") and "seed:registers" in lines[1]
    assert lines[2].startswith("    30 s") and lines[2].endswith("1.2000  fast_math: False -> True")
