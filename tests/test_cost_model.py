"""The learned cost model: fit on a study's trials, it ranks plans, picks mutations and
keeps a job from building plans it predicts to be far slower than the best."""

import sqlite3

import numpy as np
import optuna
import pytest

from autofuse import cost_model
from autofuse.cost_model import CostModel, measured, prescreen
from autofuse.search import LocalMutation

TILES = [1, 2, 4, 8, 16, 32, 64]


def _toy_objective(trial):
    """A 'time' set by two knobs: small tiles and no vectorizing are slow."""
    t = trial.suggest_categorical("F:op:t0", TILES)
    v = trial.suggest_categorical("F:op:vector", [True, False])
    trial.suggest_categorical("F:op:unroll", [0, 16, 64])  # irrelevant to the time
    return 64.0 / t * (1.0 if v else 8.0)


def _toy_study(n=40, seed=0):
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    study.optimize(_toy_objective, n_trials=n)
    return study


def test_fit_needs_enough_trials_then_ranks_plans():
    study = _toy_study()
    model = CostModel()
    assert not model.update(*measured(study.trials[: cost_model.MIN_TRIALS - 1]))
    assert model.update(*measured(study.trials))
    fast, mid, slow = ({"F:op:t0": 64, "F:op:vector": True, "F:op:unroll": 0},
                       {"F:op:t0": 8, "F:op:vector": True, "F:op:unroll": 0},
                       {"F:op:t0": 1, "F:op:vector": False, "F:op:unroll": 0})
    p = model.predict_ms([fast, mid, slow])
    assert p[0] < p[1] < p[2]
    assert prescreen(model, slow, best_ms=1.0) is not None  # predicted far slower: not measured
    assert prescreen(model, fast, best_ms=1.0) is None
    assert prescreen(None, slow, best_ms=1.0) is None and prescreen(model, slow, best_ms=None) is None


def test_timed_out_candidates_are_learned_as_very_slow():
    """A region of the space whose candidates hit the time limit (failed trials, which the
    sampler ignores) is predicted slow enough to be pre-screened; without them it is not."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))

    def objective(trial):
        t = trial.suggest_categorical("F:op:t0", TILES)
        wide = trial.suggest_categorical("F:fuse:a>b", [False, True])
        if wide:  # every plan that fuses a and b hangs in the build
            trial.set_user_attr("status", "timeout")
            raise RuntimeError("candidate timed out")
        trial.set_user_attr("status", "ok")
        return 64.0 / t

    study.optimize(objective, n_trials=60, catch=(RuntimeError,))
    hang = {"F:op:t0": 64, "F:fuse:a>b": True}
    best = min(t.value for t in study.trials if t.value is not None)
    model = CostModel()
    assert model.update(*measured(study.trials))
    assert prescreen(model, hang, best_ms=best) is not None
    assert model.predict_ms([hang])[0] > 8 * model.predict_ms([{"F:op:t0": 64, "F:fuse:a>b": False}])[0]
    complete_only = CostModel()
    complete_only.update(*measured([t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]))
    assert prescreen(complete_only, hang, best_ms=best) is None  # nothing to learn it from


def _hanging_study(n: int, seed: int = 0):
    """A study where every plan that fuses a and b times out (a failed trial the sampler ignores)."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))

    def objective(trial):
        t = trial.suggest_categorical("F:op:t0", TILES)
        if trial.suggest_categorical("F:fuse:a>b", [False, True]):
            trial.set_user_attr("status", "timeout")
            raise RuntimeError("candidate timed out")
        return 64.0 / t

    study.optimize(objective, n_trials=n, catch=(RuntimeError,))
    return study


def test_timeouts_count_toward_the_first_fit_and_each_new_one_refits():
    """Timeouts are the costliest trials: waiting for MIN_TRIALS completed ones before learning
    from them let a 10-minute job spend 11 time limits first (results/NOTES.md 15)."""
    study = _hanging_study(n=80)
    trials = study.trials
    killed_at = [i for i, t in enumerate(trials) if t.state == optuna.trial.TrialState.FAIL]
    done_at = [i for i, t in enumerate(trials) if t.state == optuna.trial.TrialState.COMPLETE]
    # the first prefix with MIN_TRIALS measured trials still has fewer than MIN_TRIALS completed
    first = cost_model.MIN_TRIALS
    assert sum(i < first for i in done_at) < cost_model.MIN_TRIALS
    assert sum(i < first for i in done_at) >= cost_model.MIN_COMPLETED
    model = CostModel()
    assert not model.update(*measured(trials[: first - 1]))
    assert model.update(*measured(trials[:first]))
    booster = model._booster
    one_more_done = trials[:first] + [trials[min(i for i in done_at if i >= first)]]
    model.update(*measured(one_more_done))  # one more completed trial: no refit yet
    assert model._booster is booster
    model.update(*measured(one_more_done + [trials[min(i for i in killed_at if i >= first)]]))  # a new timeout: refit at once
    assert model._booster is not booster
    assert not CostModel().update(*measured([trials[i] for i in killed_at]))  # nothing completed to scale by


def test_refit_waits_for_new_trials():
    study = _toy_study(n=cost_model.MIN_TRIALS + cost_model.REFIT_EVERY)
    model = CostModel()
    model.update(*measured(study.trials[: cost_model.MIN_TRIALS]))
    booster = model._booster
    model.update(*measured(study.trials[: cost_model.MIN_TRIALS + 1]))
    assert model._booster is booster
    model.update(*measured(study.trials))
    assert model._booster is not booster


def test_a_long_study_refits_after_a_share_of_its_trials_not_after_every_few():
    """A refit reads every measured trial: at REFIT_EVERY new trials each, a long job paid
    the whole study every few trials (1.5 s a refit on 16000 mobilenet_block trials, NOTES
    68). Past REFIT_EVERY * REFIT_SHARE trials the model waits for 1/REFIT_SHARE new ones."""
    fit_on = 2 * cost_model.REFIT_EVERY * cost_model.REFIT_SHARE
    due = fit_on // cost_model.REFIT_SHARE
    trials = _toy_study(n=fit_on + due).trials
    model = CostModel()
    model.update(*measured(trials[:fit_on]))
    booster = model._booster
    model.update(*measured(trials[:fit_on + due - 1]))
    assert model._booster is booster
    model.update(*measured(trials))
    assert model._booster is not booster


def test_mutation_queues_the_neighbour_the_model_predicts_fastest():
    study = _toy_study()
    mutation = LocalMutation(rate=1.0, seed=1)
    mutation.rng.random = lambda: 0.99  # past both the rate and the exploration draw
    mutation(study, None)
    (queued,) = [t for t in study.get_trials() if t.state == optuna.trial.TrialState.WAITING]
    params = queued.system_attrs["fixed_params"]  # what the trial will run with
    best = study.best_trial.params
    assert 1 <= sum(params[k] != best[k] for k in best) <= 2  # a neighbour of the best
    assert queued.user_attrs["predicted_ms"] > 0
    model = mutation.model_for(study)
    assert queued.user_attrs["predicted_ms"] == pytest.approx(float(model.predict_ms([params])[0]), rel=1e-4)
    measured = [t.params for t in study.trials if t.state.is_finished()]
    others = [p for p in (mutation.mutate(best, study.best_trial.distributions) for _ in range(200))
              if p not in measured]
    predicted = sorted(model.predict_ms(others))
    assert queued.user_attrs["predicted_ms"] <= predicted[len(predicted) // 2]  # not a random pick


def test_a_sweep_queues_the_unmeasured_one_knob_neighbours_in_the_models_order():
    """A sweep's pool is every one-knob neighbour of the parent not measured yet, and the
    model takes the one it predicts fastest; queued one after another, sweeps measure the
    whole neighbourhood, and only then does the mutation draw from farther away again."""
    from autofuse.search import parent_of

    study = _toy_study(n=cost_model.MIN_TRIALS + 2)
    mutation = LocalMutation(rate=1.0, seed=1)
    draws = iter([0.0, 0.0, 0.99] * 40)  # past the rate, into a sweep, past the exploration draw
    mutation.rng.random = lambda: next(draws)
    swept = 0
    for _ in range(40):
        trials = study.get_trials()
        parent = parent_of(trials)
        measured = [t.params for t in trials]
        one_knob = [{**parent.params, k: c} for k, d in parent.distributions.items() for c in d.choices
                    if c != parent.params[k]]
        unmeasured = [p for p in one_knob if p not in measured]
        mutation(study, None)
        (queued,) = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
        params = queued.system_attrs["fixed_params"]
        if not unmeasured:  # the neighbourhood is spent: a drawn mutation, one or two knobs away
            assert "sweep" not in queued.user_attrs
            assert params not in measured and params not in one_knob
            break
        assert queued.user_attrs["sweep"] and params in unmeasured
        model = mutation.model_for(study)
        assert queued.user_attrs["predicted_ms"] == pytest.approx(min(model.predict_ms(unmeasured)), rel=1e-4)
        swept += 1
        study.optimize(_toy_objective, n_trials=1)
    else:
        pytest.fail("the sweep never spent the neighbourhood")
    assert swept >= 3


def test_random_search_and_use_model_false_have_no_model():
    from autofuse.search import mutation_for

    assert mutation_for("random", 0.5, 0) is None
    assert LocalMutation(use_model=False).model_for(_toy_study(n=2)) is None


def test_a_job_prunes_sampler_plans_the_model_expects_far_slower(tmp_path, monkeypatch):
    """With the model fit early and the threshold at 1x, some sampler trials are predicted
    slower than the best: they are pruned unbuilt, with the prediction in the trial."""
    from autofuse.job import JobConfig, run_job
    from autofuse.measure import TimingConfig

    monkeypatch.setattr(cost_model, "MIN_TRIALS", 6)
    monkeypatch.setattr(cost_model, "REFIT_EVERY", 2)
    monkeypatch.setattr("autofuse.cost_model.PRESCREEN_FACTOR", 1.0)
    quick = TimingConfig(repeats=2, min_repeat_ms=1, warmup=1)
    cfg = JobConfig(space="ew_chain", tiny=True, db_url=f"sqlite:///{tmp_path}/t.db", seed=0, trials=30,
                    timing=quick, final_timing=quick, top_k=1, log_dir=str(tmp_path), mutation_rate=0.5)
    run_job(cfg)
    trials = optuna.load_study(study_name=cfg.study_name(), storage=cfg.db_url).trials
    screened = [t for t in trials if t.user_attrs.get("status") == "prescreened"]
    assert screened, [t.user_attrs.get("status") for t in trials]
    for t in screened:
        assert t.state == optuna.trial.TrialState.PRUNED and t.user_attrs.get("label", "tuned") == "tuned"
        assert t.user_attrs["predicted_ms"] > 0 and "cost model" in t.user_attrs["error"]
    con = sqlite3.connect(f"{tmp_path}/t.db")
    (measured,) = con.execute("select count(distinct trial_number) from af_measurements where kind = 'trial'").fetchone()
    assert measured <= len(trials) - len(screened)  # none of them built or stored
    assert any("predicted_ms" in t.user_attrs for t in trials if t.user_attrs.get("label") == "mutation")


@pytest.mark.parametrize("value, expected", [(True, 1.0), (64, 6.0), (0, 0.0), (-1, -1.0)])
def test_tiles_are_encoded_on_a_log_scale_and_flags_as_numbers(value, expected):
    model = CostModel()
    model.names = ["F:op:t1"]
    assert model.encode([{"F:op:t1": value}])[0, 0] == expected


def test_a_refit_encodes_each_trial_once_and_reads_the_same_matrix_as_a_fresh_encoding(monkeypatch):
    """Trials whose params differ by partition (names that appear later, params a trial
    lacks): the kept encodings give exactly what encoding every trial anew gives, and a
    trial's values are computed once across refits; another study's trial of the same
    number is encoded anew."""
    def objective(trial):
        fused = trial.suggest_categorical("F:fuse:a>b", [False, True])
        groups = ["ab"] if fused else ["a", "b"]
        for g in groups:
            trial.suggest_categorical(f"F:{g}:t0", TILES)
            trial.suggest_categorical(f"F:{g}:layout", ["nchw", "nhwc"])
        return 1.0 + trial.number % 7

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    study.optimize(objective, n_trials=60)
    every = study.get_trials(deepcopy=False)  # the same objects on every read, as the job's index keeps them
    calls = []
    real_value = cost_model._value
    monkeypatch.setattr(cost_model, "_value", lambda n, v: calls.append(n) or real_value(n, v))

    def fresh_encoding(trials):
        fresh = CostModel()
        fresh.names = sorted({k for t in trials for k in t.params})
        return fresh.names, fresh.encode([t.params for t in trials])

    model = CostModel()
    for n in (30, 45, 60):
        x = model._encode_trials(every[:n])
        names, expected = fresh_encoding(every[:n])
        assert model.names == names
        np.testing.assert_array_equal(x, expected)  # NaN where a trial lacks the param, in both
    calls.clear()
    model._encode_trials(every)
    assert calls == []  # nothing computed again
    other = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=2))
    other.optimize(objective, n_trials=30)
    np.testing.assert_array_equal(model._encode_trials(other.get_trials(deepcopy=False)),
                                  fresh_encoding(other.get_trials(deepcopy=False))[1])
