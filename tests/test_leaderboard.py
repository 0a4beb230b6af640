"""The DB-reading commands as users run them: leaderboard, best, export, history."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import optuna
import pytest
from helpers import assert_clean_error, cli, cli_json
from test_deploy import build_db, measured, store, tuned_plan

from autofuse.db import PlanDB
from autofuse.target import parse_target
from autofuse.workload import get_workload

REQUIRED = ("workload", "workload_hash", "target", "plan_hash", "label", "median_ms", "spread_ms",
            "speedup_vs_unfused", "speedup_vs_default", "trials", "tuned_at", "tvm_version", "autofuse_version",
            "rank", "rank_ms")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    """(url, {space: {label: median}}) of a DB filled like a tuning job does."""
    path = tmp_path_factory.mktemp("lbdb") / "t.db"
    url = f"sqlite:///{path}"
    medians = build_db(url)
    return url, medians


@pytest.fixture(scope="module")
def target_json() -> str:
    # the exact target the fixture stored (its num-cores comes from TVM_NUM_THREADS, which the
    # CLI subprocess may see differently), so lookups by target match regardless of the env
    return json.dumps(parse_target("llvm").spec)


def test_leaderboard_json(db):
    url, medians = db
    r = cli("leaderboard", "--db", url, "--format", "json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert isinstance(rows, list) and len(rows) == 2
    by_name = {row["workload"]: row for row in rows}
    assert set(by_name) == {"mlp_gelu:tiny", "ew_chain:tiny"}
    for space in ("mlp_gelu", "ew_chain"):
        row = by_name[f"{space}:tiny"]
        for key in REQUIRED:
            assert key in row, key
        w = get_workload(space, True)
        assert row["plan_hash"] == tuned_plan(w).hash and row["label"] == "tuned"  # the final-measured plan
        assert row["workload_hash"] == w.hash
        assert json.loads(row["target"])["kind"] == "llvm"
        m = medians[space]
        assert row["median_ms"] == pytest.approx(m["tuned"])
        assert row["speedup_vs_unfused"] == pytest.approx(m["unfused"] / m["tuned"])
        assert row["speedup_vs_default"] == pytest.approx(m["default"] / m["tuned"])
        assert row["trials"] == 4  # 3 measured + 1 failed trial
        assert row["rank"] == 1
    # --json is an alias for --format json
    assert json.loads(cli("leaderboard", "--db", url, "--json").stdout) == rows


def test_leaderboard_top_filters_and_table(db):
    url, _ = db
    rows = json.loads(cli("leaderboard", "--db", url, "--format", "json", "--top", "3",
                          "--workload", "mlp_gelu:tiny", "--target", "llvm").stdout)
    # finals decide the ranking: only the tuned plan has one, so it is the only ranked plan
    assert [row["rank"] for row in rows] == list(range(1, len(rows) + 1))
    assert {row["workload"] for row in rows} == {"mlp_gelu:tiny"}
    r = cli("leaderboard", "--db", url)
    assert r.returncode == 0, r.stderr
    assert "mlp_gelu:tiny" in r.stdout and "ew_chain:tiny" in r.stdout and "llvm" in r.stdout


def test_leaderboard_top_ranks_trials_without_finals(tmp_path):
    url = f"sqlite:///{tmp_path}/nofinal.db"
    results = measured("ew_chain")
    with PlanDB(url) as d:
        for n, (plan, res) in enumerate(results):
            store(d, "ew_chain", plan, res, trial=n)
    rows = json.loads(cli("leaderboard", "--db", url, "--format", "json", "--top", "3").stdout)
    assert len(rows) == 3 and [row["rank"] for row in rows] == [1, 2, 3]
    assert [row["median_ms"] for row in rows] == sorted(row["median_ms"] for row in rows)
    assert {row["label"] for row in rows} == {"unfused", "default", "tuned"}


def test_leaderboard_csv(db):
    url, _ = db
    r = cli("leaderboard", "--db", url, "--format", "csv")
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert len(rows) == 2
    assert set(REQUIRED) <= set(rows[0])
    assert all(float(row["median_ms"]) > 0 for row in rows)


def test_leaderboard_errors(db, tmp_path):
    url, _ = db
    assert_clean_error(cli("leaderboard", "--db", url, "--workload", "nonexistent"), 1, "no tuned plans")
    assert_clean_error(cli("leaderboard", "--db", url, "--target", "cuda"), 1, "no tuned plans")
    assert_clean_error(cli("leaderboard", "--db", url, "--top", "0"), 2)
    assert_clean_error(cli("leaderboard", "--db", url, "--format", "xml"), 2)
    missing = tmp_path / "nope" / "missing.db"
    assert_clean_error(cli("leaderboard", "--db", f"sqlite:///{missing}"), 1, "does not exist")
    assert not missing.exists() and not missing.parent.exists()
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database at all")
    assert_clean_error(cli("leaderboard", "--db", f"sqlite:///{garbage}"), 1, "not a valid")
    assert garbage.read_bytes() == b"not a database at all"


def test_best(db, target_json):
    url, medians = db
    w = get_workload("mlp_gelu", True)
    r = cli("best", "mlp_gelu", "--tiny", "--target", target_json, "--db", url)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)  # the plan JSON itself, usable as `autofuse run --plan FILE`
    assert plan["workload"] == w.hash and plan["fold_params"] is True
    assert all(g["schedule"] == {"unroll": 16} for g in plan["groups"])
    out = cli_json("best", "mlp_gelu", "--tiny", "--target", target_json, "--db", url)
    assert out["workload"] == "mlp_gelu:tiny" and out["plan_hash"] == tuned_plan(w).hash
    assert out["plan"] == plan and out["median_ms"] == pytest.approx(medians["mlp_gelu"]["tuned"])
    assert out["target"]["kind"] == "llvm" and out["stale"] == []
    assert_clean_error(cli("best", "mlp_gelu", "--target", target_json, "--db", url), 1, "no tuned plan")
    assert_clean_error(cli("best", "nope", "--tiny", "--target", target_json, "--db", url), 2, "unknown space")
    assert_clean_error(cli("best", "mlp_gelu", "--tiny", "--target", "vulkan", "--db", url), 2, "target")
    missing = Path(url[len("sqlite:///"):]).parent / "missing.db"
    assert_clean_error(cli("best", "mlp_gelu", "--tiny", "--target", target_json, "--db", f"sqlite:///{missing}"),
                       1, "does not exist")
    assert not missing.exists()


def test_export_cli_then_load_library(db, target_json, tmp_path):
    url, _ = db
    lib = tmp_path / "lib" / "ew.so"
    out = cli_json("export", "ew_chain", "--tiny", "--target", target_json, "--db", url, "-o", str(lib))
    assert out["output"] == str(lib) and lib.is_file()
    assert out["plan_hash"] == tuned_plan(get_workload("ew_chain", True)).hash and out["warnings"] == []
    assert json.loads(Path(str(lib) + ".json").read_text())["plan_hash"] == out["plan_hash"]
    from autofuse import deploy

    w = get_workload("ew_chain", True)
    acts = w.activations()
    m = deploy.load_library(lib)
    import numpy as np

    np.testing.assert_allclose(m(**acts), w.expected(acts), rtol=w.space.rtol, atol=w.space.atol)
    r = cli("export", "ew_chain", "--tiny", "--target", target_json, "--db", url, "-o", str(tmp_path / "t.so"))
    assert r.returncode == 0 and "t.so" in r.stdout, r.stderr
    assert_clean_error(cli("export", "ew_chain", "--target", target_json, "--db", url, "-o", str(tmp_path / "x.so")),
                       1, "no tuned plan")
    assert not (tmp_path / "x.so").exists()


def test_history_writes_a_png(db, target_json, tmp_path):
    url, _ = db
    png = tmp_path / "plots" / "history.png"
    out = cli_json("history", "mlp_gelu", "--tiny", "--target", target_json, "--db", url, "-o", str(png))
    assert png.read_bytes()[:8] == PNG_MAGIC
    assert out["trials"] == 4 and out["output"] == str(png)
    assert out["studies"]["test-study"]["failed"] == 1 and out["best_ms"] > 0
    assert_clean_error(cli("history", "mlp_gelu", "--target", target_json, "--db", url, "-o", str(tmp_path / "n.png")),
                       1, "no tuning trials")
    assert not (tmp_path / "n.png").exists()


def test_plot_history_several_studies(tmp_path):
    from autofuse.db import MeasurementRow
    from autofuse.history import history_series, plot_history

    rows = []
    for s, study in enumerate(("tpe", "random")):
        for n in range(6):
            ok = n != 2
            rows.append(MeasurementRow(id=len(rows), plan_hash=f"p{n}", label="tuned", kind="trial", study=study,
                                       trial_number=n, median_ms=(10 - n + s) if ok else None, correct=ok,
                                       max_rel_err=0.0, error=None, created_at=f"2025-01-01T00:00:{n * 3 + s:02d}+00:00"))
    rows.append(MeasurementRow(id=99, plan_hash="p5", label="tuned", kind="final", study="tpe", trial_number=None,
                               median_ms=1.0, correct=True, max_rel_err=0.0, error=None,
                               created_at="2025-01-01T00:01:00+00:00"))
    series = {h.study: h for h in history_series(rows)}
    assert set(series) == {"tpe", "random"}
    assert series["tpe"].best_ms == [10, 9, 7, 6, 5] and series["tpe"].failed_trial == [2]
    assert series["tpe"].elapsed_s[:2] == [0.0, 3.0]
    path = plot_history(rows, tmp_path / "h.png", title="two studies")
    assert path.read_bytes()[:8] == PNG_MAGIC
    # trial 1 timed 9 ms alone, but side by side with the best it scored 9.5: the curve follows the score
    scored = {h.study: h for h in history_series(rows, {"tpe": {1: 9.5, 4: 5.5}})}
    assert scored["tpe"].best_ms == [10, 9.5, 7, 5.5, 5] and scored["random"].best_ms == series["random"].best_ms
    with pytest.raises(ValueError):
        plot_history([rows[-1]], tmp_path / "none.png")


def test_trial_scores_come_from_the_optuna_studies_in_the_database(tmp_path):
    """``history`` draws a job's curve from its trials' scores; a database without Optuna's
    tables gives none and gets none."""
    import sqlalchemy as sa

    from autofuse.storage import trial_scores

    url = f"sqlite:///{tmp_path / 'o.db'}"
    study = optuna.create_study(study_name="job", storage=url)
    for v in (3.0, 2.0):
        study.add_trial(optuna.trial.create_trial(value=v))
    assert trial_scores(url, {"job", "other"}) == {"job": {0: 3.0, 1: 2.0}}
    bare = f"sqlite:///{tmp_path / 'bare.db'}"
    with sa.create_engine(bare).begin() as c:
        c.execute(sa.text("create table t (x int)"))
    assert trial_scores(bare, {"job"}) == {}
    assert sa.inspect(sa.create_engine(bare)).get_table_names() == ["t"]
