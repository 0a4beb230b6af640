"""Tuning jobs: results kept across kills, faults contained, workers sharing a study."""

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from helpers import ROOT, cli

STATES_DONE = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)


def _study(url):
    (summary,) = optuna.get_all_study_summaries(url)
    return optuna.load_study(study_name=summary.study_name, storage=url)


def _tune(url, *args, env=None, timeout=240):
    return cli("tune", "ew_chain", "--tiny", "--db", url, "--repeats", "2", "--min-repeat-ms", "1",
               "--top-k", "2", *args, env=env, timeout=timeout)


def test_tune_records_baselines_trials_and_final_measurements(tmp_path):
    url = f"sqlite:///{tmp_path}/t.db"
    r = _tune(url, "--trials", "6", "--seed", "1", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["trials_total"] == 6 and out["complete"] >= 2
    assert out["best"]["median_ms"] > 0 and out["reference"]["unfused"] and out["reference"]["default"]
    assert {f["label"] for f in out["final"]} >= {"unfused", "default"}
    timed = [f for f in out["final"] if f["correct"]]
    (marker,) = [f for f in timed if f["label"] == "unfused"]  # never dropped (job.narrowed): one run per round
    rounds = len(marker["runs_ms"])
    assert rounds >= 8 and not marker["dropped"]
    # a plan dropped, or dropped in one speed level and timed again in the other, missed rounds
    assert all(3 <= len(f["runs_ms"]) <= rounds for f in timed)
    assert all(len(f["runs_ms"]) < rounds for f in timed if f["dropped"])
    assert [f["rank_ms"] for f in timed] == sorted(f["rank_ms"] for f in timed)  # ranked by it
    assert out["best"]["plan_hash"] == timed[0]["plan_hash"]
    log = Path(out["log"])  # beside the database, not in a results/ folder of the working directory
    assert log.parent == tmp_path and "trial" in log.read_text()
    study = _study(url)
    labels = [t.user_attrs.get("label") for t in study.trials[:2]]
    assert labels == ["unfused", "default"]  # baselines enqueued first
    for key in ("sampler_and_storage_s", "build_s", "measure_s"):
        assert key in out["overhead"]


def test_seeded_random_search_is_reproducible(tmp_path):
    hashes = []
    for run in ("a", "b"):
        url = f"sqlite:///{tmp_path}/{run}.db"
        r = _tune(url, "--trials", "5", "--sampler", "random", "--seed", "7", "--json")
        assert r.returncode == 0, r.stderr
        hashes.append([t.user_attrs["plan_hash"] for t in _study(url).trials])
    assert hashes[0] == hashes[1]
    assert len(set(hashes[0])) >= 3


def test_crashing_hanging_and_raising_candidates_leave_the_job_running(tmp_path):
    url = f"sqlite:///{tmp_path}/t.db"
    env = {"AUTOFUSE_FAULT_INJECTION": "1", "AUTOFUSE_INJECT": "2:segfault,3:raise,4:hang,5:exit"}
    r = _tune(url, "--trials", "7", "--candidate-timeout", "20", "--json", env=env)
    assert r.returncode == 0, r.stderr
    trials = {t.number: t for t in _study(url).trials}
    assert len(trials) == 7
    assert trials[2].state == optuna.trial.TrialState.FAIL and "signal 11" in trials[2].user_attrs["error"]
    assert trials[3].state == optuna.trial.TrialState.FAIL and "injected" in trials[3].user_attrs["error"]
    assert trials[4].state == optuna.trial.TrialState.FAIL and "timed out" in trials[4].user_attrs["error"]
    assert trials[5].state == optuna.trial.TrialState.FAIL and "exit code 3" in trials[5].user_attrs["error"]
    assert trials[6].state == optuna.trial.TrialState.COMPLETE  # a fresh worker took over
    best = json.loads(r.stdout)["best"]
    assert best["plan_hash"] not in {trials[n].user_attrs["plan_hash"] for n in (2, 3, 4, 5)}


def _wait_for_complete(url, n, proc, limit=180):
    t0 = time.time()
    while time.time() - t0 < limit:
        assert proc.poll() is None, proc.communicate()
        try:
            done = [t for t in _study(url).trials if t.state == optuna.trial.TrialState.COMPLETE]
        except Exception:
            done = []
        if len(done) >= n:
            return done
        time.sleep(0.5)
    raise AssertionError("job made no progress")


def _spawn_tune(url, *args):
    return subprocess.Popen([sys.executable, "-m", "autofuse", "tune", "ew_chain", "--tiny", "--db", url, "--repeats", "2",
                             "--min-repeat-ms", "1", "--json", *args],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TVM_NUM_THREADS": "2"}, start_new_session=True)


def test_sigkill_then_resume_loses_no_completed_trial(tmp_path):
    url = f"sqlite:///{tmp_path}/t.db"
    proc = _spawn_tune(url, "--trials", "200", "--heartbeat", "1")
    done = _wait_for_complete(url, 4, proc)
    os.killpg(proc.pid, signal.SIGKILL)  # the job and its candidate worker
    proc.wait()
    before = {t.number: t.value for t in _study(url).trials if t.state == optuna.trial.TrialState.COMPLETE}
    assert len(before) >= len(done)
    time.sleep(3)  # let the dead job's heartbeat go stale (grace period 2 s)
    target_total = len([t for t in _study(url).trials if t.state in STATES_DONE]) + 3
    r = _tune(url, "--resume", "--trials", str(target_total), "--heartbeat", "1", "--json")
    assert r.returncode == 0, r.stderr
    after = _study(url).trials
    for number, value in before.items():
        assert after[number].state == optuna.trial.TrialState.COMPLETE and after[number].value == value
    assert not [t for t in after if t.state == optuna.trial.TrialState.RUNNING]  # stale trial failed by heartbeat
    assert len([t for t in after if t.state in STATES_DONE]) >= target_total


def test_sigterm_stops_after_the_trial_in_flight(tmp_path):
    url = f"sqlite:///{tmp_path}/t.db"
    proc = _spawn_tune(url, "--trials", "200")
    _wait_for_complete(url, 3, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(out)["interrupted"] is True
    assert not [t for t in _study(url).trials if t.state == optuna.trial.TrialState.RUNNING]


def test_two_workers_share_one_sqlite_study(tmp_path):
    url = f"sqlite:///{tmp_path}/t.db"
    r = _tune(url, "--trials", "12", "--workers", "2", "--json")
    assert r.returncode == 0, r.stderr
    trials = _study(url).trials
    finished = [t for t in trials if t.state in STATES_DONE]
    assert len(finished) >= 12
    assert not [t for t in trials if "locked" in str(t.user_attrs.get("error", ""))]
    assert "locked" not in r.stderr
    log = open(json.loads(r.stdout)["log"]).read() if os.path.exists(json.loads(r.stdout)["log"]) else ""
    assert "database is locked" not in log
    assert len({t.user_attrs.get("plan_hash") for t in finished}) > 3


def test_resume_fails_trials_killed_before_their_first_heartbeat(tmp_path):
    """A job killed between creating a trial and its first heartbeat leaves a RUNNING trial
    that Optuna's stale check never sees; resuming fails it and re-enqueues the baselines."""
    from autofuse.job import JobConfig, prepare_study

    cfg = JobConfig(space="ew_chain", tiny=True, db_url=f"sqlite:///{tmp_path}/t.db", heartbeat_s=1, log_dir=str(tmp_path))
    study = prepare_study(cfg)
    study.ask()
    study.ask()  # both enqueued baselines now RUNNING, never beating
    time.sleep(2.5)
    study = prepare_study(cfg)
    states = [t.state for t in study.trials]
    assert states[:2] == [optuna.trial.TrialState.FAIL] * 2
    waiting = [t.user_attrs.get("label") for t in study.trials if t.state == optuna.trial.TrialState.WAITING]
    assert sorted(waiting) == ["default", "unfused"]


def test_new_study_starts_from_the_stored_best_plan_and_seed_templates(tmp_path):
    """A second study on a DB that already holds a best plan for the workload measures that
    plan (label db-best) right after the two baselines; seed templates follow."""
    url = f"sqlite:///{tmp_path}/t.db"
    r = cli("tune", "conv_bn_relu", "--tiny", "--db", url, "--repeats", "2", "--min-repeat-ms", "1",
            "--top-k", "1", "--trials", "8", "--seed", "3", "--study", "first", timeout=240)
    assert r.returncode == 0, r.stderr
    first = optuna.load_study(study_name="first", storage=url)
    assert [t.user_attrs.get("label") for t in first.trials[:3]] == ["unfused", "default", "seed:inline"]
    best = cli("best", "conv_bn_relu", "--tiny", "--target", "llvm", "--db", url)  # what the second study finds
    assert best.returncode == 0, best.stderr
    r = cli("tune", "conv_bn_relu", "--tiny", "--db", url, "--repeats", "2", "--min-repeat-ms", "1",
            "--top-k", "1", "--trials", "4", "--study", "second", timeout=240)
    assert r.returncode == 0, r.stderr
    second = optuna.load_study(study_name="second", storage=url)
    labels = [t.user_attrs.get("label") for t in second.trials]
    from autofuse.plan import Plan
    from autofuse.search import PlanSpace
    from autofuse.workload import get_workload

    stored = Plan.from_json(best.stdout)
    w = get_workload("conv_bn_relu", tiny=True)
    space = PlanSpace(w)
    baselines = [space.params_of(w.reference_plan(label)) for label in ("unfused", "default")]
    assert ("db-best" in labels) == (space.params_of(stored) not in baselines)  # same plan: not measured twice
    if "db-best" in labels:
        assert labels[2] == "db-best"
        assert second.trials[2].user_attrs["plan_hash"] == stored.hash
    r = cli("tune", "conv_bn_relu", "--tiny", "--db", url, "--repeats", "1", "--min-repeat-ms", "1",
            "--top-k", "1", "--trials", "3", "--study", "third", "--no-warm-start", timeout=240)
    assert r.returncode == 0, r.stderr
    third = optuna.load_study(study_name="third", storage=url)
    ran = [t.user_attrs.get("label") for t in third.trials if t.state != optuna.trial.TrialState.WAITING]
    assert ran == ["unfused", "default", "seed:inline"]  # exactly --trials; later seeds stay enqueued
    assert "db-best" not in [t.user_attrs.get("label") for t in third.trials]


def test_seed_trials_add_the_most_fused_partition_where_tvm_stops_earlier():
    """TVM's FuseOps keeps the residual add out of layer_norm (2 kernels); the most-fused
    partition (1 kernel) is seeded.  Where both agree (conv_bn_relu), nothing is added."""
    from autofuse.plan import Plan
    from autofuse.search import PlanSpace
    from autofuse.workload import get_workload

    w = get_workload("layernorm_residual", tiny=True)
    space = PlanSpace(w)
    seeds = dict((label, params) for params, label in space.seed_trials())
    assert len(w.reference_plan("default").groups) == 2
    assert "seed:most-fused" in seeds
    plan = space.suggest(optuna.trial.FixedTrial(seeds["seed:most-fused"]))[0]
    assert isinstance(plan, Plan) and len(plan.groups) == 1
    conv = get_workload("conv_bn_relu", tiny=True)
    assert not [label for _, label in PlanSpace(conv).seed_trials() if "most-fused" in label]


def test_seed_trials_add_the_gemm_with_its_epilogue_apart():
    """gemm_bn's one FuseOps kernel (GEMM, bias, BatchNorm, ReLU) is also seeded as two: the
    GEMM alone, then the epilogue; layernorm_residual has no complex op, so no such seed."""
    from autofuse.plan import Plan
    from autofuse.search import PlanSpace
    from autofuse.workload import get_workload

    w = get_workload("gemm_bn", tiny=True)
    space = PlanSpace(w)
    seeds = dict((label, params) for params, label in space.seed_trials())
    assert len(w.reference_plan("default").groups) == 1
    plan = space.suggest(optuna.trial.FixedTrial(seeds["seed:epilogue-apart"]))[0]
    assert isinstance(plan, Plan)
    ops = w.graph(True).ops  # matmul, then bias, BatchNorm's four ops, ReLU
    assert plan.groups == ((ops[0].name,), tuple(o.name for o in ops[1:]))
    assert "seed:epilogue-apart:wide" in seeds
    norm = PlanSpace(get_workload("layernorm_residual", tiny=True))
    assert not [label for _, label in norm.seed_trials() if "epilogue-apart" in label]


def test_seed_trials_repack_the_weight_where_there_is_one():
    """gemm_bn's GEMM reads a constant weight: the default partition and the epilogue-apart one
    are also seeded with it repacked (``pack_weight``), plain and with the wide register tile,
    and as a dense layer with its reduction unrolled, with and without its column strips
    outermost (``packed-columns``, ``outer_first=1``; a convolution gets neither).  A
    convolution is seeded with its weight packed by output channels, and with the channels
    as its vector axis; attention's GEMMs read no constant, so no packed seed is measured
    there."""
    from autofuse.search import PlanSpace
    from autofuse.workload import get_workload

    space = PlanSpace(get_workload("gemm_bn", tiny=True))
    seeds = dict((label, params) for params, label in space.seed_trials())
    for label in ("seed:packed", "seed:wide-packed", "seed:epilogue-apart:packed", "seed:epilogue-apart:wide-packed",
                  "seed:packed-unrolled", "seed:packed-columns"):
        plan = space.suggest(optuna.trial.FixedTrial(seeds[label]))[0]
        assert plan.schedules[0].get("pack_weight") is True, (label, plan.schedules)
    assert space.suggest(optuna.trial.FixedTrial(seeds["seed:packed-unrolled"]))[0].schedules[0]["r0"] == 4
    columns = space.suggest(optuna.trial.FixedTrial(seeds["seed:packed-columns"]))[0].schedules[0]
    assert (columns["outer_first"], columns["r0"]) == (1, 4)  # column strips outermost
    conv = PlanSpace(get_workload("conv_bn_relu", tiny=True))
    seeds = dict((label, params) for params, label in conv.seed_trials())
    plan = conv.suggest(optuna.trial.FixedTrial(seeds["seed:channels-vector"]))[0]
    assert {k: plan.schedules[0].get(k) for k in ("vector_axis", "t1", "pack_weight")} == \
        {"vector_axis": 1, "t1": 8, "pack_weight": True}
    assert "seed:packed" in seeds and "seed:packed-unrolled" not in seeds  # a dense layer's template only
    assert "seed:packed-columns" not in seeds
    attention = PlanSpace(get_workload("attention", tiny=True))
    assert not [label for _, label in attention.seed_trials() if "packed" in label or "channels" in label]


def test_tall_seed_doubles_the_pointwise_convolutions_rows_and_computes_the_reference():
    """mobilenet_block's pointwise convolution cannot widen its 16 columns (the image is 112
    wide): the ``tall`` seed gives it two image rows under its 8 output channels instead."""
    from autofuse.build import group_anchor, partition_of
    from autofuse.measure import QUICK
    from autofuse.runner import evaluate_plan
    from autofuse.schedule import default_knobs
    from autofuse.search import PlanSpace
    from autofuse.target import parse_target
    from autofuse.workload import get_workload

    w = get_workload("mobilenet_block", tiny=True)
    space = PlanSpace(w)
    seeds = dict((label, params) for params, label in space.seed_trials())
    plan = space.suggest(optuna.trial.FixedTrial(seeds["seed:tall"]))[0]
    g = w.graph(True)
    nests = [group_anchor(g, group)[1] for group in partition_of(g, plan)]
    pointwise = [i for i, nest in enumerate(nests) if nest.reduce == (8, 1, 1)]  # 8 input channels, 1x1
    assert len(pointwise) == 1
    i = pointwise[0]
    assert default_knobs(nests[i])["t2"] == 1 and plan.schedules[i]["t2"] == 2
    depthwise = 1 - i  # the other group, left at its default rows
    assert plan.schedules[depthwise]["t2"] == default_knobs(nests[depthwise])["t2"]
    res = evaluate_plan(w, plan, parse_target("llvm"), QUICK)
    assert res["correct"], res


def test_seed_trials_put_a_stored_plan_first_and_skip_ones_outside_the_space():
    from autofuse.search import PlanSpace
    from autofuse.workload import get_workload

    w = get_workload("layernorm_residual", tiny=True)
    space = PlanSpace(w)
    fused = w.partition_plan(((0, 1),), True, "fused", [{"reduce_vector": 8}])
    seeds = space.seed_trials(fused)
    assert seeds[0] == (space.params_of(fused), "db-best")
    assert space.params_of(w.reference_plan("default")) not in [p for p, _ in seeds]
    odd = w.partition_plan(((0,), (1,)), True, "odd", [{"t0": 5}, {}])  # 5 is no candidate tile
    with pytest.warns(UserWarning, match="outside the search space"):
        assert [label for _, label in space.seed_trials(odd)] == [label for _, label in seeds[1:]]

    assert space.seed_trials(fused, templates=False) == [seeds[0]]  # the stored best alone: no templates
    assert space.seed_trials(None, templates=False) == []
    # every seed is compared side by side with a wider gate (CandidateLog.run); nothing else is
    assert all(PlanSpace.hand_picked(label) for _, label in seeds)
    assert not [label for label in ("unfused", "default", "tuned", "mutation", "seeded") if PlanSpace.hand_picked(label)]


def test_a_study_without_seed_templates_starts_from_the_baselines_alone(tmp_path):
    """``seed_templates=False`` (the bench's plain random-search baseline): a new study
    enqueues the two reference plans and none of autofuse's seed templates."""
    from dataclasses import replace

    from autofuse.job import JobConfig, prepare_study

    cfg = JobConfig(space="conv_bn_relu", tiny=True, db_url=f"sqlite:///{tmp_path}/t.db", study="plain",
                    seed_templates=False, log_dir=str(tmp_path))
    assert sorted(t.user_attrs.get("label") for t in prepare_study(cfg).trials) == ["default", "unfused"]
    seeded = [t.user_attrs.get("label") for t in prepare_study(replace(cfg, study="seeded", seed_templates=True)).trials]
    assert [label for label in seeded if label.startswith("seed")]

def test_local_mutation_queues_a_neighbour_of_the_best_trial():
    """The mutation callback enqueues the best trial with one or two parameters changed,
    each to another of its choices (tiles mostly to a neighbouring size), and nothing
    while trials are queued or once the budget is reached."""
    from autofuse.search import LocalMutation

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    tiles = [1, 2, 4, 8, 16, 32]

    def objective(t):
        return abs(t.suggest_categorical("t0", tiles) - 8) + (0 if t.suggest_categorical("vector", [True, False]) else 5)

    study.optimize(objective, n_trials=8)
    mut = LocalMutation(rate=1.0, seed=1)
    best = study.best_trial.params
    mut(study, study.trials[-1])
    (queued,) = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    fixed = queued.system_attrs["fixed_params"]
    changed = {k for k in best if fixed[k] != best[k]}
    assert 1 <= len(changed) <= 2
    assert all(fixed[k] in (tiles if k == "t0" else [True, False]) for k in changed)
    assert fixed not in [t.params for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert queued.user_attrs["label"] == "mutation"
    mut(study, study.trials[-1])  # one already queued: nothing more
    assert len(study.get_trials(states=(optuna.trial.TrialState.WAITING,))) == 1
    study.optimize(objective, n_trials=1)
    LocalMutation(rate=1.0, seed=1, max_trials=9)(study, study.trials[-1])  # budget reached
    assert not study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    steps = []
    for seed in range(40):
        out = LocalMutation(seed=seed).mutate({"t0": 8}, {"t0": optuna.distributions.CategoricalDistribution(tiles)})
        steps.append(abs(tiles.index(out["t0"]) - tiles.index(8)))
    assert steps.count(1) > len(steps) / 2  # mostly a neighbouring tile



def test_the_mutation_step_reads_each_finished_trial_once_and_sees_what_the_whole_study_shows():
    """The mutation step's view of a study (measured plans, the best trial, the trials ranked,
    what the cost model learns from) is kept up as trials finish, in any order, and agrees
    with reading the whole study anew; a call reads only trials new or still unfinished
    (reading all of them took 742 ms per trial at 16000 mobilenet_block trials, NOTES 68)."""
    from autofuse import cost_model, search

    rng = random.Random(0)
    dist = {"a": optuna.distributions.CategoricalDistribution(list(range(50))),
            "b": optuna.distributions.CategoricalDistribution([True, False])}
    S = optuna.trial.TrialState

    def trial(number, state, params=None):
        params = params or {"a": rng.randrange(50), "b": rng.random() < 0.5}
        value = float(rng.choice([1, 2, 3, 5, 8])) if state == S.COMPLETE else None
        status = "timeout" if state == S.FAIL and rng.random() < 0.5 else "error"
        t = optuna.trial.create_trial(state=state, value=value, params=params, distributions=dist,
                                      user_attrs={"status": status, "plan_hash": f"p{params['a']}"})
        t.number = number
        return t

    finished = (S.COMPLETE, S.FAIL, S.PRUNED)
    trials, index = [], search._TrialIndex()
    reads, was_finished = 0, set()
    real_key = search._key

    def counting_key(params):
        nonlocal reads
        reads += 1
        return real_key(params)

    search._key = counting_key
    try:
        for _step in range(60):
            for _ in range(rng.randrange(1, 6)):  # new trials, some still running
                trials.append(trial(len(trials), rng.choice(finished + (S.RUNNING,))))
            for i, t in enumerate(trials):  # running trials finish in any order
                if t.state == S.RUNNING and rng.random() < 0.3:
                    trials[i] = trial(t.number, rng.choice(finished), t.params)
            newly_finished = {t.number for t in trials if t.state.is_finished()} - was_finished
            reads = 0
            unfinished = index.update(trials)
            assert reads == len(newly_finished)  # each finished trial's params are read once
            assert index.upto == next((t.number for t in trials if not t.state.is_finished()), len(trials))
            was_finished |= newly_finished
            assert [t.number for t in unfinished] == [t.number for t in trials if not t.state.is_finished()]
            assert index.finished_keys == {real_key(t.params) for t in trials if t.state.is_finished()}
            done = sorted((t for t in trials if t.state == S.COMPLETE), key=lambda t: (t.value, t.number))
            assert [t.number for t in index.ranked()] == [t.number for t in done]
            assert search.parent_of(index.tied_with_best()) is search.parent_of(trials)
            done, killed = cost_model.measured(trials)
            assert sorted(t.number for t in index.done) == [t.number for t in done]
            assert sorted(t.number for t in index.killed) == [t.number for t in killed]
    finally:
        search._key = real_key


def test_after_the_sampler_repeats_a_plan_a_mutation_of_a_runner_up_takes_the_next_trial():
    """Every plan one or two knobs from the best is measured, and the sampler has just
    suggested a measured plan again: whatever the rate draws, a mutation is queued, from one
    of the next-best plans (the only ones with unmeasured plans one or two knobs away)."""
    import itertools

    from autofuse.search import LocalMutation

    names = ("a", "b", "c")
    study = optuna.create_study()
    dists = {n: optuna.distributions.CategoricalDistribution([0, 1, 2, 3]) for n in names}
    for x in itertools.product(range(4), repeat=3):
        if sum(v != 0 for v in x) <= 2:  # the best (0, 0, 0) and all its one- and two-knob neighbours
            study.add_trial(optuna.trial.create_trial(params=dict(zip(names, x)), distributions=dists,
                                                      value=1.0 + sum(x)))
    study.add_trial(optuna.trial.create_trial(params={"a": 0, "b": 0, "c": 0}, distributions=dists,
                                              state=optuna.trial.TrialState.PRUNED, user_attrs={"repeat": True}))
    LocalMutation(rate=0.0, seed=0, use_model=False)(study, study.trials[0])  # not a repeat: the rate decides
    assert not study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    LocalMutation(rate=0.0, seed=0, use_model=False)(study, study.trials[-1])
    (queued,) = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert all(queued.system_attrs["fixed_params"][n] != 0 for n in names)
    assert queued.user_attrs["label"] == "mutation"

def test_a_mutation_that_cuts_a_fused_group_is_queued_whole_and_never_twice():
    """Turning a fuse decision makes a group the best plan had no knobs for.  The mutation
    step completes such params (new knobs at their defaults) before it compares them with
    what was measured: queued partial, the sampler filled the knobs in the same way every
    time, and one plan was queued over and over (NOTES 22)."""
    from autofuse.search import LocalMutation, PlanSpace
    from autofuse.workload import get_workload

    w = get_workload("gemm_bn", tiny=True)
    space = PlanSpace(w)
    default = w.reference_plan("default")
    best = space.params_of(default)
    cut = next(k for k, v in best.items() if ":fuse:" in k and v)
    partial = {**best, cut: False}
    with pytest.raises(ValueError):  # a FixedTrial, like an enqueued trial, has no value for the new group's knobs
        space.suggest(optuna.trial.FixedTrial(partial))
    whole = space.complete(partial)
    assert all(whole[k] == v for k, v in partial.items() if k in whole)  # knobs the cut group lost are gone
    assert set(whole) - set(partial)  # the new group's knobs
    plan, _ = space.suggest(optuna.trial.FixedTrial(whole))
    assert len(plan.groups) == len(default.groups) + 1
    assert space.complete(whole) == whole and space.complete(best) == best

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    mut = LocalMutation(rate=1.0, seed=3, use_model=False)
    mut.use_space(study.study_name, space)
    study.enqueue_trial(best)
    for _ in range(30):  # every queued mutation is a whole plan, and a new one
        waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
        queued = waiting[0].system_attrs["fixed_params"] if waiting else None
        trial = study.ask()
        space.suggest(trial)
        study.tell(trial, 1.0 if queued is None or queued == best else 2.0)
        if queued is not None and queued != best:
            assert queued == trial.params
        mut(study, study.trials[-1])
    params = [t.params for t in study.trials]
    assert len({json.dumps(p, sort_keys=True) for p in params}) == len(params)


def test_a_study_made_with_another_search_space_fails_in_one_clear_error(tmp_path):
    """A study whose parameter has other choices (made by an autofuse with another space) cannot
    be continued by Optuna; the job says so in one line (exit 2) instead of Optuna's ValueError."""
    import optuna

    from autofuse.errors import classify
    from autofuse.search import PlanSpace, SpaceChanged
    from autofuse.workload import get_workload

    study = optuna.create_study(study_name="old-space")
    old = study.ask()
    old.suggest_categorical("fold_params", [True])  # an older space with one choice
    study.tell(old, 1.0)
    with pytest.raises(SpaceChanged, match="'old-space' holds parameter 'fold_params' with other choices") as e:
        PlanSpace(get_workload("ew_chain", tiny=True)).suggest(study.ask())
    assert classify(e.value) == 2


def test_the_final_remeasurement_takes_the_top_k_plans_whatever_found_them_and_the_references():
    from autofuse.job import final_candidates

    def trial(h, label, value):
        return optuna.trial.create_trial(value=value, user_attrs={"plan_hash": h, "plan": f"plan {h}", "label": label})

    complete = [trial("u", "unfused", 9.0), trial("d", "default", 1.0), trial("m1", "mutation", 1.0),
                trial("m2", "mutation", 1.0), trial("s", "seed:inline", 1.2), trial("t", "tuned", 1.1),
                trial("m1", "mutation", 1.0), trial("m3", "mutation", 1.5)]
    chosen = final_candidates(complete, top_k=3)
    # tied best scores (a tie keeps the incumbent's score) must not crowd in every mutation
    assert set(chosen) == {"m1", "m2", "t", "u", "d"}
    assert chosen["d"] == ("plan d", "default") and chosen["m1"] == ("plan m1", "mutation")


def _final_trial(number: int, h: str, value: float, confirm: dict | None = None) -> optuna.trial.FrozenTrial:
    """A completed mutation trial as ``final_candidates`` reads it (with its comparison, if any)."""
    attrs = {"plan_hash": h, "plan": f"plan {h}", "label": "mutation"}
    if confirm is not None:
        attrs["confirm"] = confirm
    t = optuna.trial.create_trial(value=value, user_attrs=attrs)
    t.number = number
    return t


def test_the_final_remeasurement_takes_the_tied_plans_that_ran_fastest_side_by_side():
    """A tie is scored exactly the incumbent's value, so dozens of plans share the best
    score; the final takes those that ran fastest beside the incumbent, not the first found.
    In a 10-minute attention job the 3-minute final took the first two ties, one of them
    timed 1.38x the incumbent's recent time, while a tie timed at 0.82x (found later, still
    within the 3 minutes) ran 5% faster than the plan it returned (NOTES 58)."""
    from autofuse.job import final_candidates

    trial = _final_trial

    def tie(cand, inc, **more):
        return {"faster": False, "candidate_ms": cand, "incumbent_ms": inc, **more}

    complete = [trial(0, "best", 0.40, {"faster": True, "candidate_ms": 0.40, "incumbent_ms": 0.5}),
                trial(1, "first-tie", 0.40, tie(0.41, 0.40)),
                trial(2, "disturbed", 0.40, tie(0.37, 0.38, disturbed=True, recent_ms=0.27)),
                trial(3, "slower", 0.45), trial(4, "fast-tie", 0.40, tie(0.33, 0.40)),
                trial(5, "near-tie", 0.40, tie(0.38, 0.40))]
    # the ties timed faster than the incumbent, then the incumbent (its own ratio is 1);
    # not the first tie, nor the one timed far above the incumbent's recent time
    assert list(final_candidates(complete, top_k=3)) == ["fast-tie", "near-tie", "best"]
    assert list(final_candidates(complete, top_k=2)) == ["fast-tie", "near-tie", "best"]  # best: an incumbent


def test_the_final_remeasurement_also_takes_the_last_incumbents_whatever_their_scores():
    """A plan that won its side-by-side comparison in a slow stretch is scored below every
    earlier best; the earlier bests it displaced still run in the final (NOTES 44)."""
    from autofuse.job import final_candidates

    def trial(number, h, value, faster=None):
        return _final_trial(number, h, value, None if faster is None else {"faster": faster})

    complete = [trial(0, "d", 0.18), trial(1, "b1", 0.17, True), trial(2, "b2", 0.16, True),
                trial(3, "b3", 0.15, True), trial(4, "lost", 0.16, False), trial(5, "slow", 0.12, True),
                trial(6, "s1", 0.11, True), trial(7, "s2", 0.10, True)]
    assert set(final_candidates(complete, top_k=3)) == {"s2", "s1", "slow"}  # the last incumbents are the top 3
    complete[5:] = [trial(5, "slow", 0.12, True), trial(6, "s1", 0.11, False), trial(7, "s2", 0.10, False)]
    # top 3 by score: s2, s1, slow; the last 3 incumbents: b2, b3, slow; never the one that lost
    assert set(final_candidates(complete, top_k=3)) == {"s2", "s1", "slow", "b2", "b3"}


def test_mutations_start_from_the_tied_plan_that_ran_fastest_side_by_side():
    """A tie is scored exactly the incumbent's value; Optuna's best trial is then the first
    of the tie (often the unfused seed), and the search would stay in its neighbourhood.
    Mutations start from the tied plan that was fastest side by side with the incumbent."""
    from autofuse.search import LocalMutation, parent_of

    dists = {f"k{i}": optuna.distributions.CategoricalDistribution(["a", "b", "c"]) for i in range(6)}
    study = optuna.create_study()

    def add(letter, value, confirm=None):
        attrs = {"confirm": confirm} if confirm else {}
        study.add_trial(optuna.trial.create_trial(params={k: letter for k in dists}, distributions=dists,
                                                  value=value, user_attrs=attrs))

    add("a", 2.0)  # the incumbent: first of the tie
    add("b", 2.0, {"vs": "h", "candidate_ms": 1.94, "incumbent_ms": 2.0, "rounds": 3, "faster": False})
    add("c", 2.0, {"vs": "h", "candidate_ms": 1.99, "incumbent_ms": 2.0, "rounds": 3, "faster": False})
    # timed against an incumbent that ran far above its recent 2.0 ms twice: 2.2 ms is slower, not 0.73x
    add("a", 2.0, {"vs": "h", "candidate_ms": 2.2, "incumbent_ms": 3.0, "rounds": 3, "faster": False,
                   "attempts": 2, "disturbed": True, "recent_ms": 2.0})
    study.add_trial(optuna.trial.create_trial(params={k: "c" for k in dists}, distributions=dists, value=2.3))
    assert study.best_trial.params["k0"] == "a"  # what the mutation used to start from
    assert parent_of(study.get_trials()).params["k0"] == "b"
    LocalMutation(rate=1.0, seed=0, use_model=False)(study, study.trials[-1])
    (queued,) = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    fixed = queued.system_attrs["fixed_params"]
    assert sum(v != "b" for v in fixed.values()) <= 2  # a neighbour of "b", not of "a"
    add("c", 1.5, {"vs": "h", "candidate_ms": 1.5, "incumbent_ms": 2.0, "rounds": 3, "faster": True})
    assert parent_of(study.get_trials()).value == 1.5  # a faster plan is the best, tie or not
    assert parent_of([]) is None


def test_runs_p75_is_the_time_a_plan_keeps_in_three_runs_of_four():
    from autofuse.job import runs_p75

    assert runs_p75([0.3]) == 0.3
    steady = [0.205, 0.199, 0.21, 0.204, 0.22, 0.198, 0.213, 0.207]
    jumpy = [0.185, 0.289, 0.19, 0.177, 0.181, 0.282, 0.288, 0.171]  # mobilenet_block, NOTES 33
    assert sorted([steady, jumpy], key=lambda r: sorted(r)[len(r) // 2])[0] is jumpy  # the median picks it
    assert runs_p75(jumpy) > runs_p75(steady)  # this does not
    assert runs_p75([1.0, 2.0, 3.0, 4.0, 5.0]) == 4.0


def test_the_speed_levels_of_a_final_are_told_apart_by_its_marker_plan():
    from autofuse.job import LEVEL_ROUNDS, slow_rounds

    fast, slow = 0.38, 0.61  # the unfused plan of mobilenet_block in the host's two levels (NOTES 47)
    assert slow_rounds([0, 1, 2, 3], [fast, 0.40, 0.37, 0.39]) is None  # one level
    assert slow_rounds([], []) is None
    spike = [fast] * 9 + [slow]
    assert slow_rounds(list(range(10)), spike) is None  # one slow run is not a level
    runs = [fast] * 5 + [slow] * LEVEL_ROUNDS
    assert slow_rounds(list(range(8)), runs) == {5, 6, 7}
    assert slow_rounds([0, 2, 4, 5, 6, 7, 8, 9], runs) == {7, 8, 9}  # rounds as timed, gaps and all


def _final_of(marker: list[float], plans: dict[str, list[float]]):
    from autofuse.job import FinalTiming

    chosen = {"u": ("{}", "unfused"), **{h: ("{}", "tuned") for h in plans}}
    timed = {h: FinalTiming(runs=[[x] for x in runs], rounds=list(range(len(runs))))
             for h, runs in {"u": marker, **plans}.items()}
    return chosen, timed


def test_a_final_that_saw_both_speed_levels_ranks_by_both():
    """mobilenet_block's plans tie in the host's fast level and one is 1.4x slower in the slow
    one; ew_chain's tie in the slow level and differ in the fast one (NOTES 45, 47).  The 75th
    percentile of the runs follows whichever level the final saw most of; the level ranking
    weighs both, so the plan that is never slower wins either way."""
    from autofuse.job import final_levels, final_rank_ms, runs_p75

    # mobilenet_block: 11 fast rounds, 3 slow; a025e86d ties fast, 1.47x slower when slow
    level = [0.38] * 11 + [0.61] * 3
    chosen, timed = _final_of(level, {"tie_fast": [0.156] * 11 + [0.230] * 3, "steady": [0.158] * 11 + [0.163] * 3})
    assert final_levels(chosen, timed) == {11, 12, 13}
    assert runs_p75(timed["tie_fast"].run_medians) < runs_p75(timed["steady"].run_medians)  # p75 picks it
    rank = final_rank_ms(timed, final_levels(chosen, timed))
    assert rank["steady"] < rank["tie_fast"]
    # ew_chain: mostly slow rounds where the plans tie; 12% apart in the fast ones
    level = [1.36] * 10 + [0.60] * 4
    chosen, timed = _final_of(level, {"tie_slow": [1.35] * 10 + [0.674] * 4, "default": [1.356] * 10 + [0.604] * 4})
    assert runs_p75(timed["tie_slow"].run_medians) < runs_p75(timed["default"].run_medians)  # p75 picks it
    rank = final_rank_ms(timed, final_levels(chosen, timed))
    assert rank["default"] < rank["tie_slow"]
    # one level seen: the 75th percentile, as before
    chosen, timed = _final_of([0.38] * 8, {"a": [0.2] * 6 + [0.3] * 2, "b": [0.25] * 8})
    assert final_levels(chosen, timed) is None
    assert final_rank_ms(timed, final_levels(chosen, timed)) == {h: runs_p75(t.run_medians) for h, t in timed.items()}


class _ScriptedRunner:
    """Stands in for IsolatedRunner in a final: a plan's JSON names its timing, and the
    marker ("U") turns slow from ``slow_from`` runs on."""

    def __init__(self, slow_from: int | None):
        self.slow_from, self.marker_runs, self.runs = slow_from, 0, {}
        self.fresh_builds: dict[str, set[bool]] = {}  # plan -> the fresh_build flags of its runs

    def __call__(self, *_a):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *_a):
        return False

    def slow_now(self) -> bool:
        return self.slow_from is not None and self.marker_runs > self.slow_from

    def run(self, payload):
        time.sleep(0.005)
        self.fresh_builds.setdefault(payload["plan"], set()).add(payload["fresh_build"])
        if payload["plan"] == "U":
            self.marker_runs += 1
            return {"status": "ok", "samples_ms": [0.6 if self.slow_now() else 0.38]}
        if "/" in payload["plan"]:  # "0.32/0.54": the plan's time in the host's fast and slow level
            fast, slow = payload["plan"].split("/")
            return {"status": "ok", "samples_ms": [float(slow if self.slow_now() else fast)]}
        if payload["plan"][0].isdigit():  # "0.14,0.16": the plan's runs take these times in turn
            times = payload["plan"].split(",")
            self.runs[payload["plan"]] = self.runs.get(payload["plan"], -1) + 1
            return {"status": "ok", "samples_ms": [float(times[self.runs[payload["plan"]] % len(times)])]}
        return {"status": "ok", "samples_ms": [0.15]}


def test_a_final_waits_for_the_other_speed_level_but_not_past_its_limit(monkeypatch):
    import autofuse.job as job
    from autofuse.job import LEVEL_ROUNDS, JobConfig, final_levels, time_final

    cfg = JobConfig(space="ew_chain", tiny=True, final_rounds=2, progress=False)
    chosen = {"u": ("U", "unfused"), "p": ("P", "tuned")}
    monkeypatch.setattr(job, "IsolatedRunner", _ScriptedRunner(slow_from=None))
    t0 = time.perf_counter()
    timed = time_final(cfg, chosen, seconds=0.05, wait_s=0.5)  # one level all along: waits it out
    assert time.perf_counter() - t0 >= 0.5
    assert final_levels(chosen, timed) is None
    monkeypatch.setattr(job, "IsolatedRunner", _ScriptedRunner(slow_from=4))
    t0 = time.perf_counter()
    timed = time_final(cfg, chosen, seconds=0.05, wait_s=30.0)  # the slow level comes: done once seen
    assert time.perf_counter() - t0 < 10.0
    assert final_levels(chosen, timed) == set(range(4, 4 + LEVEL_ROUNDS))
    assert timed["p"].rounds == list(range(4 + LEVEL_ROUNDS))
    monkeypatch.setattr(job, "IsolatedRunner", _ScriptedRunner(slow_from=None))
    t0 = time.perf_counter()
    time_final(cfg, chosen, seconds=0.05)  # no wait asked: the final's own seconds
    assert time.perf_counter() - t0 < 0.4


def test_a_final_drops_the_plans_clearly_behind_the_leader(monkeypatch):
    """From NARROW_AFTER rounds on, the final stops timing a plan that lost to the leader in
    so many rounds side by side that plans of one speed would rarely (a sign test): its
    rounds go to the near-ties it has to tell apart.  A plan that wins some rounds stays;
    the level marker stays whatever its speed; the dropped plans keep their runs and rank
    behind by their side-by-side ratio to the best kept plan."""
    import autofuse.job as job
    from autofuse.job import NARROW_AFTER, JobConfig, final_levels, final_rank_ms, time_final

    assert NARROW_AFTER == 3
    cfg = JobConfig(space="ew_chain", tiny=True, final_rounds=8, progress=False)
    times = {"a": "0.150", "b": "0.140,0.170", "c": "0.149,0.152,0.152,0.152,0.152,0.152,0.152,0.152",
             "far": "0.300", "farther": "0.450"}
    chosen = {"u": ("U", "unfused"), "d": ("0.200", "default"), **{h: (t, "tuned") for h, t in times.items()}}
    monkeypatch.setattr(job, "IsolatedRunner", _ScriptedRunner(slow_from=None))
    timed = time_final(cfg, chosen, seconds=0.0)
    every_round = list(range(8))
    assert {h: timed[h].rounds for h in chosen} == {
        "u": every_round, "a": every_round, "b": every_round,  # b won every other round
        "c": list(range(6)),  # won 1 of 6: dropped before the seventh round
        "d": [0, 1, 2], "far": [0, 1, 2], "farther": [0, 1, 2]}  # lost all 3
    assert [h for h in chosen if timed[h].dropped] == ["d", "c", "far", "farther"]
    rank = final_rank_ms(timed, final_levels(chosen, timed))
    assert sorted(rank, key=rank.get) == ["a", "c", "b", "d", "far", "u", "farther"]
    assert rank["far"] == pytest.approx(2 * rank["a"])


def test_a_plan_dropped_in_one_speed_level_is_timed_again_in_the_other(monkeypatch):
    """Plans that tie in the host's fast level can be 1.6x apart in the slow one. A final
    that dropped every plan 3% behind its leader in the fast level, then saw the slow level
    with the leader alone, kept a leader 0.52 ms slow there against 0.36 for the plan it had
    dropped (mobilenet_block, NOTES 68). Once the final has seen both levels, a dropped plan
    is timed in the other level, and dropped again only if it is clearly behind in both."""
    import autofuse.job as job
    from autofuse.job import JobConfig, final_levels, final_rank_ms, time_final

    cfg = JobConfig(space="ew_chain", tiny=True, final_rounds=20, progress=False)
    chosen = {"u": ("U", "unfused"), "lead_fast": ("0.320/0.540", "tuned"),
              "steady": ("0.330/0.380", "tuned"), "behind": ("0.400/0.700", "tuned")}
    monkeypatch.setattr(job, "IsolatedRunner", _ScriptedRunner(slow_from=8))
    timed = time_final(cfg, chosen, seconds=0.0)
    slow = final_levels(chosen, timed)
    assert slow is not None and len(slow) >= 8
    assert timed["steady"].rounds[:3] == [0, 1, 2] and 3 not in timed["steady"].rounds  # dropped in the fast level
    assert set(timed["steady"].rounds) & slow and not timed["steady"].dropped  # timed again in the slow one
    assert timed["behind"].dropped and set(timed["behind"].rounds) & slow  # behind in both: dropped again
    rank = final_rank_ms(timed, slow)
    assert min(rank, key=rank.get) == "steady"
    assert rank["steady"] == pytest.approx((0.330 * 0.380) ** 0.5)


def test_a_final_links_its_contenders_anew_each_round_and_keeps_the_references_builds(monkeypatch):
    """The level markers keep one build (their times over the rounds are the host's levels);
    every other plan asks for a fresh build in each run (NOTES 62: a bad landing lasts)."""
    import autofuse.job as job
    from autofuse.job import JobConfig, time_final

    cfg = JobConfig(space="ew_chain", tiny=True, final_rounds=3, progress=False)
    chosen = {"u": ("U", "unfused"), "d": ("0.200", "default"), "a": ("0.150", "tuned"), "b": ("0.140", "seed:packed")}
    scripted = _ScriptedRunner(slow_from=None)
    monkeypatch.setattr(job, "IsolatedRunner", scripted)
    time_final(cfg, chosen, seconds=0.0)
    assert scripted.fresh_builds == {"U": {False}, "0.200": {False}, "0.150": {True}, "0.140": {True}}


def test_a_dropped_plan_ranks_by_its_runs_beside_the_best_kept_one():
    """A plan dropped in the host's fast level has only fast runs; its 75th percentile would
    beat a kept plan ranked over both levels though it ran 5% slower beside it."""
    from autofuse.job import final_levels, final_rank_ms

    level = [0.38] * 11 + [0.61] * 3
    chosen, timed = _final_of(level, {"kept": [0.150] * 11 + [0.230] * 3, "dropped": [0.1575] * 3})
    timed["dropped"].dropped = True
    slow = final_levels(chosen, timed)
    assert timed["dropped"].p75 < timed["kept"].level_ms(slow)  # not comparable: fast runs only
    rank = final_rank_ms(timed, slow)
    assert rank["dropped"] == pytest.approx(1.05 * rank["kept"])


def test_the_final_remeasurement_lasts_a_share_of_the_job_and_a_stop_ends_it(tmp_path):
    from autofuse.job import FINAL_SHARE, JobConfig, _StopFlag, final_remeasure, run_job
    from autofuse.measure import TimingConfig

    quick = TimingConfig(repeats=2, min_repeat_ms=1, warmup=1)
    url = f"sqlite:///{tmp_path}/t.db"
    cfg = JobConfig(space="ew_chain", tiny=True, db_url=url, seed=0, trials=3, timing=quick, final_timing=quick,
                    top_k=1, final_rounds=2, log_dir=str(tmp_path), progress=False)
    assert run_job(cfg).final
    study = optuna.load_study(study_name=cfg.study_name(), storage=url)

    def finals():
        con = sqlite3.connect(f"{tmp_path}/t.db")
        (n,) = con.execute("select count(*) from af_measurements where kind = 'final'").fetchone()
        con.close()
        return n

    before = finals()
    t0 = time.perf_counter()
    # an 80-s job: an 8-s final.  The final's time includes starting its worker and building
    # the plans (about 2.5 s here unloaded; a 3-s final on a loaded CI machine had no time
    # left after the two rounds asked), so it is long enough for rounds past those two.
    out = final_remeasure(cfg, study, job_wall_s=8.0 / FINAL_SHARE)
    assert time.perf_counter() - t0 >= 8.0
    timed = [r for r in out if r["correct"]]
    assert timed and all(len(r["runs_ms"]) > 2 for r in timed)  # rounds went on past the two asked
    assert finals() == before + len(out)
    stop = _StopFlag()
    stop.requested = True  # Ctrl-C during the final: it ends, nothing untimed is stored
    assert final_remeasure(cfg, study, job_wall_s=3.0 / FINAL_SHARE, stop=stop) == []
    assert finals() == before + len(out)


def test_the_choice_of_a_shorter_job_is_its_final_over_the_plans_it_had_and_stores_nothing(tmp_path):
    """The bench's 3-minute check asks what a job of 3 minutes would have returned: the same
    final re-measurement over the trials completed by then, not the best score then."""
    from autofuse.job import JobConfig, choice_of_shorter_job, final_candidates, run_job
    from autofuse.measure import TimingConfig
    from autofuse.plan import Plan

    quick = TimingConfig(repeats=2, min_repeat_ms=1, warmup=1)
    url = f"sqlite:///{tmp_path}/t.db"
    cfg = JobConfig(space="ew_chain", tiny=True, db_url=url, seed=0, trials=6, timing=quick, final_timing=quick,
                    top_k=2, final_rounds=3, log_dir=str(tmp_path), progress=False)
    run_job(cfg)
    study = optuna.load_study(study_name=cfg.study_name(), storage=url)
    complete = sorted(study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)), key=lambda t: t.number)
    early = complete[:3]
    con = sqlite3.connect(f"{tmp_path}/t.db")
    count = "select count(*) from af_measurements"
    (before,) = con.execute(count).fetchone()
    plan_json, details = choice_of_shorter_job(cfg, early, job_wall_s=10.0)
    assert details["candidates"] == list(final_candidates(early, cfg.top_k))
    assert details["rounds"] >= cfg.final_rounds
    assert set(details["rank_ms"]) == set(details["candidates"])  # every candidate timed (none failed)
    fastest = min(details["rank_ms"], key=details["rank_ms"].get)
    assert Plan.from_json(plan_json).hash == fastest
    assert con.execute(count).fetchone() == (before,)  # a what-if: nothing stored
    con.close()
    assert choice_of_shorter_job(cfg, [], job_wall_s=10.0) == (None, {"candidates": [], "rank_ms": {}, "rounds": 0,
                                                                   "slow_rounds": None})


@pytest.mark.parametrize("constant_liar", [False, True])
def test_tpe_splits_its_history_once_per_ask_and_draws_what_optunas_tpe_draws(monkeypatch, constant_liar):
    """Most knobs lie outside the params all trials share, and TPE samples each of those by
    itself; Optuna splits the history anew for each (about 350 ms an ask at 1000 trials of
    mobilenet_block).  The job's TPE splits once per ask, and a seeded study must still draw
    exactly the plans Optuna's own TPE draws."""
    import zlib

    from autofuse.search import BoundedTPE, PlanSpace
    from autofuse.workload import get_workload

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = PlanSpace(get_workload("mobilenet_block", True))
    tpe_module = optuna.samplers._tpe.sampler
    real = tpe_module._split_trials
    splits: list[int] = []

    def counted(study, trials, n_below):
        splits.append(len(trials))
        return real(study, trials, n_below)

    monkeypatch.setattr(tpe_module, "_split_trials", counted)

    def drawn(sampler: optuna.samplers.BaseSampler) -> tuple[list[dict], int]:
        study = optuna.create_study(sampler=sampler)
        out = []
        splits.clear()
        for _ in range(40):
            trial = study.ask()
            space.suggest(trial)
            out.append(dict(trial.params))
            study.tell(trial, 1 + zlib.crc32(repr(sorted(trial.params.items())).encode()) % 1000 / 1000)
        return out, len(splits)

    kwargs = {"seed": 3, "multivariate": True, "constant_liar": constant_liar, "n_startup_trials": 10}
    ours, our_splits = drawn(BoundedTPE(**kwargs))
    optunas, optuna_splits = drawn(optuna.samplers.TPESampler(**kwargs))
    shared = set.intersection(*(set(p) for p in ours))
    assert len({k for p in ours for k in p}) > 2 * len(shared)  # most knobs are sampled on their own
    assert ours == optunas
    assert our_splits <= 2 * 30 < optuna_splits  # the relative knobs' split and one more, per ask past start-up


def test_tpe_learns_from_the_best_and_the_latest_trials_of_a_long_study(monkeypatch):
    """Each TPE ask passes over the history it learns from, so an overnight job's asks would
    grow slower hour by hour (0.6-1.1 s at 8000 trials of layernorm_residual).  Past
    TPE_HISTORY finished trials, the job's TPE sees the TPE_KEEP_BEST best and the latest."""
    import random

    from autofuse.search import TPE_HISTORY, PlanSpace, make_sampler
    from autofuse.workload import get_workload

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = PlanSpace(get_workload("layernorm_residual", True))
    rng = random.Random(0)
    source = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    history = []
    for i in range(TPE_HISTORY + 300):
        t = source.ask()
        space.suggest(t)
        value = 0.5 if i == 5 else rng.uniform(1.0, 2.0)  # an old trial is the best
        history.append(optuna.trial.create_trial(params=t.params, distributions=t.distributions, value=value))
        source.tell(t, state=optuna.trial.TrialState.FAIL)
    seen: list[set[int]] = []
    tpe_module = optuna.samplers._tpe.sampler
    real = tpe_module._split_trials

    def counted(study, trials, n_below):  # every TPE split, of the relative knobs and the others
        seen.append({t.number for t in trials if t.state == optuna.trial.TrialState.COMPLETE})
        return real(study, trials, n_below)

    monkeypatch.setattr(tpe_module, "_split_trials", counted)
    study = optuna.create_study(sampler=make_sampler("tpe", seed=0))
    study.add_trials(history[:TPE_HISTORY // 2])
    space.suggest(study.ask())
    assert seen and all(len(s) == TPE_HISTORY // 2 for s in seen)  # a short study: all of it
    seen.clear()
    study.add_trials(history[TPE_HISTORY // 2:])
    space.suggest(study.ask())
    newest = study.trials[-2].number
    assert seen and all(len(s) == TPE_HISTORY and 5 in s and newest in s for s in seen)

