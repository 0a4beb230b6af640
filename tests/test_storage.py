"""The job's Optuna storage: a trial's parameters written in one transaction, on SQLite and PostgreSQL."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from autofuse.storage import open_storage


def test_a_trials_parameters_are_written_together_and_read_back_by_plain_optuna(any_db_url):
    url = any_db_url
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="s", storage=open_storage(url))
    asked = []
    for i in range(3):  # later trials share some parameters with earlier ones, and add new ones
        trial = study.ask()
        params = {f"knob{(k + 40 * i) % 150}": trial.suggest_categorical(f"knob{(k + 40 * i) % 150}", [1, 2, 4, 8])
                  for k in range(100)}
        params["unroll"] = trial.suggest_int("unroll", 0, 64)
        study.tell(trial, 1.0 + i)
        asked.append(params)
    stored = optuna.load_study(study_name="s", storage=url).trials  # stock RDBStorage, a fresh connection
    assert [t.params for t in stored] == asked
    assert [t.value for t in stored] == [1.0, 2.0, 3.0]


def _two_trials(url):
    storage = open_storage(url)
    study_id = storage.create_new_study([optuna.study.StudyDirection.MINIMIZE], "s")
    return storage, storage.create_new_trial(study_id), storage.create_new_trial(study_id)


def test_a_parameter_whose_distribution_clashes_with_the_studys_is_rejected_and_nothing_is_written(any_db_url):
    from optuna.distributions import CategoricalDistribution, IntDistribution

    url = any_db_url
    storage, first, second = _two_trials(url)
    storage.set_trial_param(first, "tile", 1, CategoricalDistribution([1, 2, 4]))
    storage.set_trial_param(first, "unroll", 3, IntDistribution(0, 8))
    storage.flush(first)
    # Another worker's storage: its cache has not seen "tile", so the flush asks the database.
    other = open_storage(url)
    other.set_trial_param(second, "unroll", 5, IntDistribution(0, 16))  # a wider range is compatible
    other.set_trial_param(second, "tile", 0, IntDistribution(0, 4))  # categorical before: a clash
    with pytest.raises(ValueError):
        other.flush(second)
    plain = optuna.storages.RDBStorage(url)
    assert plain.get_trial(second).params == {}
    assert plain.get_trial(first).params == {"tile": 2, "unroll": 3}


def test_parameters_of_a_trial_another_worker_has_finished_are_not_written(any_db_url):
    from optuna.distributions import IntDistribution
    from optuna.exceptions import UpdateFinishedTrialError

    url = any_db_url
    storage, first, _ = _two_trials(url)
    storage.set_trial_param(first, "unroll", 3, IntDistribution(0, 8))
    optuna.storages.RDBStorage(url).set_trial_state_values(first, TrialState.FAIL)  # as a heartbeat would
    with pytest.raises(UpdateFinishedTrialError):
        storage.flush(first)
    assert optuna.storages.RDBStorage(url).get_trial(first).params == {}
