"""Several machines share one PostgreSQL database: two jobs on one study at once, the
leaderboard and deployment, against a real server (the ``postgres_server`` fixture starts
one on 127.0.0.1)."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import optuna

from autofuse import deploy
from autofuse.workload import get_workload
from helpers import assert_clean_error, cli, cli_json

TINY = ("--tiny", "--repeats", "2", "--min-repeat-ms", "1", "--top-k", "2", "--json")


def _job(url: str, *args: str, cwd) -> subprocess.Popen:
    """One machine's tuning job (its own process, as on another host)."""
    return subprocess.Popen([sys.executable, "-m", "autofuse", "tune", "ew_chain", "--db", url, *TINY, *args],
                            cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TVM_NUM_THREADS": "2"})


def _trials(url: str) -> list[optuna.trial.FrozenTrial]:
    (summary,) = optuna.get_all_study_summaries(url)
    return optuna.load_study(study_name=summary.study_name, storage=url).trials


def test_two_jobs_share_one_postgresql_study_and_deployment_runs_the_best_plan(postgres_server, tmp_path):
    url = postgres_server.new_database()
    first = _job(url, "--trials", "16", cwd=tmp_path)
    t0 = time.time()
    while not optuna.get_all_study_summaries(url):  # the second machine joins once the study exists
        assert first.poll() is None and time.time() - t0 < 120, first.communicate()
        time.sleep(0.5)
    second = _job(url, "--trials", "16", "--resume", cwd=tmp_path)
    results = [p.communicate(timeout=300) for p in (first, second)]
    for proc, (out, err) in zip((first, second), results):
        assert proc.returncode == 0, err
    trials = _trials(url)
    finished = [t for t in trials if t.state.is_finished()]
    assert len(finished) >= 16 and not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    measured = [t for t in finished if t.user_attrs.get("plan_hash")]
    assert len({t.user_attrs["plan_hash"] for t in measured}) > 3
    labels = [t.user_attrs.get("label") for t in finished]
    assert labels.count("unfused") == 1 and labels.count("default") == 1  # the baselines once, not per job

    (row,) = cli_json("leaderboard", "--db", url)
    best = {json.loads(out)["best"]["plan_hash"] for out, _ in results}
    assert row["workload"] == "ew_chain:tiny" and row["plan_hash"] in best

    w = get_workload("ew_chain", True)
    model = deploy.load(url, "ew_chain", target="llvm", tiny=True)
    assert model.plan_hash == row["plan_hash"]
    acts = w.activations(seed=3)
    ref = np.asarray(w.space.reference(**acts, **w.params))
    np.testing.assert_allclose(model(**acts), ref, rtol=w.space.rtol, atol=w.space.atol)


def test_a_missing_postgresql_database_is_a_one_line_error(postgres_server):
    r = cli("leaderboard", "--db", postgres_server.url("no_such_database"))
    assert_clean_error(r, 1, "no_such_database")
