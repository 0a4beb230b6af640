"""The job's Optuna storage: a trial's parameters written in one transaction."""

from __future__ import annotations

import optuna

from autofuse.storage import open_storage


def test_a_trials_parameters_are_written_together_and_read_back_by_plain_optuna(tmp_path):
    url = f"sqlite:///{tmp_path}/t.db"
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
