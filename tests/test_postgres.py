"""Several machines share one PostgreSQL database: two jobs on one study at once, the
leaderboard and deployment, against a real server (the ``postgres_server`` fixture starts
one on 127.0.0.1)."""

import json
import subprocess
import time

import numpy as np
import optuna
import sqlalchemy as sa

from autofuse import deploy
from autofuse.workload import get_workload
from helpers import assert_clean_error, cli, cli_json, spawn_tune
from pg_server import free_port, start_or_skip


def _study_exists(url: str) -> bool:
    """Whether a job has created its study yet; asked without Optuna, which would create
    its tables itself and race the job doing the same."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return sa.inspect(conn).has_table("studies") and bool(
                conn.exec_driver_sql("SELECT count(*) FROM studies").scalar())
    finally:
        engine.dispose()


def _trials(url: str) -> list[optuna.trial.FrozenTrial]:
    (summary,) = optuna.get_all_study_summaries(url)
    return optuna.load_study(study_name=summary.study_name, storage=url).trials


def test_two_jobs_share_one_postgresql_study_and_deployment_runs_the_best_plan(postgres_server, tmp_path):
    url = postgres_server.new_database()
    first = spawn_tune(url, "--trials", "16", cwd=tmp_path)
    t0 = time.time()
    while not _study_exists(url):  # the second machine joins once the study exists
        assert first.poll() is None and time.time() - t0 < 120, first.communicate()
        time.sleep(0.5)
    second = spawn_tune(url, "--trials", "16", "--resume", cwd=tmp_path)
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


def test_a_missing_database_or_an_absent_server_is_a_one_line_error(postgres_server):
    r = cli("leaderboard", "--db", postgres_server.url("no_such_database"))
    assert_clean_error(r, 1, "cannot connect to", "no_such_database")
    nobody = free_port()  # a port nobody listens on
    for command in (("tune", "ew_chain", "--tiny", "--trials", "2"), ("leaderboard",)):
        r = cli(*command, "--db", f"postgresql://postgres:s3cret@127.0.0.1:{nobody}/x")
        assert_clean_error(r, 1, "cannot connect to", str(nobody))
        assert "s3cret" not in r.stderr  # a password never reaches the screen or a log


def test_a_url_whose_driver_is_not_installed_names_what_to_install():
    r = cli("leaderboard", "--db", "postgresql+pg8000://postgres@127.0.0.1:5432/x")
    assert_clean_error(r, 1, "driver is not installed", "pg8000")


def test_a_job_whose_database_server_goes_away_stops_with_a_one_line_error(tmp_path):
    server, job = start_or_skip(), None
    try:
        url = server.new_database()
        job = spawn_tune(url, "--trials", "500", cwd=tmp_path)
        t0 = time.time()
        while not _study_exists(url) or sum(t.state == optuna.trial.TrialState.COMPLETE for t in _trials(url)) < 3:
            assert job.poll() is None and time.time() - t0 < 180, job.communicate()
            time.sleep(0.5)
        server.kill()
        out, err = job.communicate(timeout=240)
        assert_clean_error(subprocess.CompletedProcess(job.args, job.returncode, out, err), 1,
                           "database server is running and reachable")
    finally:
        if job is not None and job.poll() is None:
            job.kill()
        server.stop()
