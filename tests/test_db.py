"""Tests for autofuse.db (the tuned-plan database)."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import inspect

from autofuse import db as dbmod
from autofuse.db import DBError, PlanDB

LLVM = {"kind": "llvm", "mcpu": "skylake", "keys": ["cpu"]}
CUDA = {"kind": "cuda", "arch": "sm_90", "keys": ["cuda", "gpu"]}
HOST = {"cpu": "Xeon", "cores": 16, "gpu": None}
HOST2 = {"cpu": "EPYC", "cores": 64, "gpu": "H200"}
VERS = {"tvm_version": "0.27.0", "autofuse_version": "0.1.0"}


def _url(path: Path) -> str:
    return f"sqlite:///{path}"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _measure(db: PlanDB, plan_id: int, median: float, *, correct: bool = True, kind: str = "trial",
             trial: int | None = None, study: str | None = "s") -> int:
    return db.add_measurement(
        plan_id, median_ms=median, min_ms=median * 0.9, max_ms=median * 1.2, std_ms=median * 0.05,
        repeats=10, correct=correct, max_rel_err=0.0 if correct else 0.5,
        error=None if correct else "mismatch", kind=kind, study=study, trial_number=trial, **VERS,
    )


@pytest.fixture
def db(tmp_path: Path):
    d = PlanDB(_url(tmp_path / "results" / "af.db"))
    yield d
    d.close()


# --------------------------------------------------------------------------- #
# round trip / best_plan
# --------------------------------------------------------------------------- #
def test_round_trip_and_idempotence(db: PlanDB, tmp_path: Path) -> None:
    assert (tmp_path / "results" / "af.db").exists()  # parent dir created
    w = db.put_workload("wh1", "mlp", '{"nodes": []}')
    assert db.put_workload("wh1", "other-name", "{}") == w
    t = db.put_target(LLVM, HOST)
    # key order of the target/host dicts is irrelevant
    assert db.put_target(dict(reversed(list(LLVM.items()))), dict(reversed(list(HOST.items())))) == t
    assert db.put_target(LLVM, HOST2) != t
    p = db.put_plan("wh1", LLVM, HOST, "ph1", '{"groups": [[0, 1]]}', "tuned")
    assert db.put_plan("wh1", LLVM, HOST, "ph1", '{"groups": [[0, 1]]}', "tuned") == p
    m = _measure(db, p, 1.25, trial=0)
    assert isinstance(m, int)

    best = db.best_plan("wh1", LLVM)
    assert best is not None
    assert (best.workload_name, best.workload_hash, best.plan_hash, best.label) == ("mlp", "wh1", "ph1", "tuned")
    assert best.target == LLVM and best.host == HOST
    assert best.plan_json == '{"groups": [[0, 1]]}'
    assert db.plan_json("wh1", "ph1") == '{"groups": [[0, 1]]}'
    assert db.plan_json("wh1", "nope") is None and db.plan_json("other", "ph1") is None
    assert best.median_ms == pytest.approx(1.25)
    assert best.spread_ms == pytest.approx(1.25 * 0.3)
    assert best.repeats == 10 and best.trials == 1
    assert best.tvm_version == "0.27.0" and best.autofuse_version == "0.1.0"
    assert best.measured_at.endswith("+00:00")
    json.dumps(best.as_dict())

    hist = db.measurements("wh1", LLVM)
    assert [(h.trial_number, h.median_ms, h.correct, h.label) for h in hist] == [(0, 1.25, True, "tuned")]
    assert db.best_plan("wh1", CUDA) is None
    assert db.best_plan("nope", LLVM) is None


def test_best_plan_ignores_incorrect_and_prefers_final(db: PlanDB) -> None:
    db.put_workload("w", "net", "{}")
    slow = db.put_plan("w", LLVM, HOST, "slow", "{}", "default")
    fast = db.put_plan("w", LLVM, HOST, "fast", "{}", "tuned")
    wrong = db.put_plan("w", LLVM, HOST, "wrong", "{}", "tuned")
    _measure(db, slow, 2.0, trial=0)
    _measure(db, fast, 1.0, trial=1)
    _measure(db, wrong, 0.1, correct=False, trial=2)
    _measure(db, fast, 1.1, trial=3)
    best = db.best_plan("w", LLVM)
    assert best is not None and best.plan_hash == "fast" and best.median_ms == 1.0
    assert best.trials == 4

    # Once final measurements exist only they count, even if a trial was faster.
    _measure(db, slow, 1.8, kind="final", trial=None)
    _measure(db, fast, 1.9, kind="final", trial=None)
    _measure(db, wrong, 0.05, correct=False, kind="final")
    best = db.best_plan("w", LLVM)
    assert best is not None and (best.plan_hash, best.kind, best.median_ms) == ("slow", "final", 1.8)


def test_finals_rank_by_the_75th_percentile_of_their_runs(db: PlanDB) -> None:
    """A plan fast in most runs and much slower in some (NOTES 33) loses to a steady one
    with a slightly higher median; the leaderboard shows both figures."""
    db.put_workload("w", "net", "{}")
    jumpy = db.put_plan("w", LLVM, HOST, "jumpy", "{}", "mutation")
    steady = db.put_plan("w", LLVM, HOST, "steady", "{}", "default")
    for plan_id, median, p75 in ((jumpy, 0.190, 0.249), (steady, 0.205, 0.213)):
        db.add_measurement(plan_id, median_ms=median, min_ms=median, max_ms=p75 * 1.2, std_ms=0.01, repeats=24,
                           rank_ms=p75, correct=True, kind="final", **VERS)
    best = db.best_plan("w", LLVM)
    assert best is not None and (best.plan_hash, best.median_ms, best.rank_ms) == ("steady", 0.205, 0.213)
    rows = db.leaderboard(top=2)
    assert [(r.plan_hash, r.rank_ms) for r in rows] == [("steady", 0.213), ("jumpy", 0.249)]
    # without a rank time (a trial, or a final of a version-1 database) the median is what ranks
    _measure(db, jumpy, 0.200, kind="final")
    assert db.best_plan("w", LLVM).plan_hash == "jumpy"


def test_a_version_1_database_is_read_as_is_and_migrated_when_opened_to_write(tmp_path: Path) -> None:
    path = tmp_path / "af.db"
    with PlanDB(_url(path)) as d:
        d.put_workload("w", "net", "{}")
        plan = d.put_plan("w", LLVM, HOST, "p", "{}", "tuned")
        _measure(d, plan, 1.5, kind="final")
    con = sqlite3.connect(path)  # what version 1 wrote: no rank column
    with con:
        con.execute("ALTER TABLE af_measurements DROP COLUMN rank_ms")
    con.close()
    _set_version(path, 1)
    before = _sha(path)

    with PlanDB(_url(path), create=False, readonly=True) as d:  # a reader after an upgrade of autofuse
        best = d.best_plan("w", LLVM)
        assert best is not None and (best.median_ms, best.rank_ms) == (1.5, None)
        assert [r.plan_hash for r in d.leaderboard()] == ["p"]
    assert _sha(path) == before  # read-only means untouched

    with PlanDB(_url(path)) as d:  # a job opens it to write: migrated, data kept
        assert d.schema_version() == dbmod.SCHEMA_VERSION
        assert "rank_ms" in {c["name"] for c in inspect(d.engine).get_columns("af_measurements")}
        d.add_measurement(plan, median_ms=1.4, min_ms=1.3, max_ms=1.6, std_ms=0.1, repeats=8, rank_ms=1.45,
                          correct=True, kind="final", **VERS)
        best = d.best_plan("w", LLVM)
        assert (best.median_ms, best.rank_ms) == (1.4, 1.45)
        assert len(d.measurements("w", LLVM)) == 2


def test_a_version_2_database_reads_its_p75_column_as_the_rank_and_is_renamed_when_opened_to_write(
        tmp_path: Path) -> None:
    """Version 2 called the rank time ``p75_ms``; it is a 75th percentile only when a final saw
    one speed level, so version 3 calls it ``rank_ms``.  Readers still rank a version-2 database
    by it, and the rename keeps every stored value."""
    path = tmp_path / "af.db"
    with PlanDB(_url(path)) as d:
        d.put_workload("w", "net", "{}")
        jumpy = d.put_plan("w", LLVM, HOST, "jumpy", "{}", "mutation")
        steady = d.put_plan("w", LLVM, HOST, "steady", "{}", "default")
        for plan_id, median, rank in ((jumpy, 0.190, 0.249), (steady, 0.205, 0.213)):
            d.add_measurement(plan_id, median_ms=median, min_ms=median, max_ms=0.3, std_ms=0.01, repeats=24,
                              rank_ms=rank, correct=True, kind="final", **VERS)
    con = sqlite3.connect(path)  # what version 2 wrote
    with con:
        con.execute("ALTER TABLE af_measurements RENAME COLUMN rank_ms TO p75_ms")
    con.close()
    _set_version(path, 2)
    before = _sha(path)

    with PlanDB(_url(path), create=False, readonly=True) as d:  # ranked by the stored values, not the medians
        assert [(r.plan_hash, r.rank_ms) for r in d.leaderboard(top=2)] == [("steady", 0.213), ("jumpy", 0.249)]
    assert _sha(path) == before

    with PlanDB(_url(path)) as d:
        assert d.schema_version() == 3
        columns = {c["name"] for c in inspect(d.engine).get_columns("af_measurements")}
        assert "rank_ms" in columns and "p75_ms" not in columns
        assert [(r.plan_hash, r.rank_ms) for r in d.leaderboard(top=2)] == [("steady", 0.213), ("jumpy", 0.249)]


def test_best_plan_host_preference(db: PlanDB) -> None:
    db.put_workload("w", "net", "{}")
    a = db.put_plan("w", LLVM, HOST, "pa", "{}", "tuned")
    b = db.put_plan("w", LLVM, HOST2, "pb", "{}", "tuned")
    _measure(db, a, 2.0)
    _measure(db, b, 1.0)
    assert db.best_plan("w", LLVM).plan_hash == "pb"  # any host
    mine = db.best_plan("w", LLVM, host=HOST)
    assert mine.plan_hash == "pa" and mine.host == HOST
    other = db.best_plan("w", LLVM, host={"cpu": "unknown"})  # falls back, host tells caller
    assert other.plan_hash == "pb" and other.host == HOST2
    assert len(db.measurements("w", LLVM)) == 2
    assert len(db.measurements("w", LLVM, host=HOST)) == 1


def test_bad_inputs(db: PlanDB) -> None:
    with pytest.raises(DBError, match="unknown workload"):
        db.put_plan("missing", LLVM, HOST, "p", "{}", "tuned")
    db.put_workload("w", "net", "{}")
    p = db.put_plan("w", LLVM, HOST, "p", "{}", "tuned")
    with pytest.raises(DBError, match="unknown plan"):
        _measure(db, p + 100, 1.0)
    with pytest.raises(ValueError):
        _measure(db, p, float("nan"))  # correct but no finite median
    # a failed trial without timings is fine, stored with NULL median
    db.add_measurement(p, median_ms=float("inf"), min_ms=None, max_ms=None, std_ms=None, repeats=0,
                       correct=False, error="build failed", trial_number=5, **VERS)
    (row,) = db.measurements("w", LLVM)
    assert row.median_ms is None and row.error == "build failed" and not row.correct
    assert db.best_plan("w", LLVM) is None


# --------------------------------------------------------------------------- #
# leaderboard
# --------------------------------------------------------------------------- #
def _populate_board(db: PlanDB) -> None:
    db.put_workload("aaaa1111", "resnet", "{}")
    db.put_workload("bbbb2222", "bert", "{}")
    for target in (LLVM, CUDA):
        scale = 1.0 if target is LLVM else 0.1
        for label, med in (("unfused", 4.0), ("default", 3.0), ("tuned", 2.0), ("tuned", 1.0)):
            pid = db.put_plan("aaaa1111", target, HOST, f"{label}-{med}", "{}", label)
            _measure(db, pid, med * scale, trial=int(med))
        bad = db.put_plan("aaaa1111", target, HOST, "bad", "{}", "tuned")
        _measure(db, bad, 0.01, correct=False, trial=99)
    pid = db.put_plan("bbbb2222", LLVM, HOST, "only", "{}", "tuned")
    _measure(db, pid, 5.0, trial=0)


def test_leaderboard_rows_and_speedups(db: PlanDB) -> None:
    _populate_board(db)
    rows = db.leaderboard()
    assert [(r.workload, json.loads(r.target)["kind"]) for r in rows] == [
        ("bert", "llvm"), ("resnet", "cuda"), ("resnet", "llvm")]
    resnet_llvm = rows[2]
    assert resnet_llvm.plan_hash == "tuned-1.0" and resnet_llvm.median_ms == 1.0
    assert resnet_llvm.speedup_vs_unfused == pytest.approx(4.0)
    assert resnet_llvm.speedup_vs_default == pytest.approx(3.0)
    assert resnet_llvm.trials == 5
    assert resnet_llvm.target == dbmod.canonical_json(LLVM)
    assert resnet_llvm.tuned_at.endswith("+00:00")
    assert rows[1].median_ms == pytest.approx(0.1) and rows[1].speedup_vs_unfused == pytest.approx(4.0)
    bert = rows[0]
    assert bert.speedup_vs_unfused is None and bert.speedup_vs_default is None
    text = json.dumps([r.as_dict() for r in rows])
    assert json.loads(text)[2]["plan_hash"] == "tuned-1.0"


def test_leaderboard_filters_and_top(db: PlanDB) -> None:
    _populate_board(db)
    assert {r.workload for r in db.leaderboard(workload="resnet")} == {"resnet"}
    assert {r.workload for r in db.leaderboard(workload="bbbb")} == {"bert"}  # hash prefix
    assert db.leaderboard(workload="res") == []  # names match exactly, not by prefix
    cuda = db.leaderboard(target="cuda")
    assert len(cuda) == 1 and json.loads(cuda[0].target)["kind"] == "cuda"
    assert {r.workload for r in db.leaderboard(target="skylake")} == {"resnet", "bert"}  # substring
    top3 = db.leaderboard(workload="resnet", target="llvm", top=3)
    assert [r.plan_hash for r in top3] == ["tuned-1.0", "tuned-2.0", "default-3.0"]
    assert [r.rank for r in top3] == [1, 2, 3]
    assert top3[2].speedup_vs_default == pytest.approx(1.0)
    assert len(db.leaderboard(workload="resnet", top=10)) == 8  # 4 correct plans x 2 targets


# --------------------------------------------------------------------------- #
# security
# --------------------------------------------------------------------------- #
def test_sql_injection_strings_are_data(db: PlanDB) -> None:
    evil = "x'; DROP TABLE af_plans;--"
    db.put_workload(evil, evil, evil)
    pid = db.put_plan(evil, {"kind": evil}, {"cpu": evil}, evil, evil, evil)
    _measure(db, pid, 1.0, study=evil)
    best = db.best_plan(evil, {"kind": evil})
    assert best is not None
    assert best.workload_name == evil and best.plan_hash == evil and best.label == evil
    assert best.target == {"kind": evil} and best.host == {"cpu": evil}
    assert [r.workload for r in db.leaderboard(workload=evil)] == [evil]
    assert len(db.leaderboard(target=evil)) == 1
    names = set(inspect(db.engine).get_table_names())
    assert set(dbmod.AF_TABLES) <= names


def test_arbitrary_text_round_trips(tmp_path: Path) -> None:
    with PlanDB(_url(tmp_path / "h.db")) as d:
        @settings(max_examples=25, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
        @given(name=st.text(max_size=40), plan=st.text(max_size=80), kind=st.text(min_size=1, max_size=10))
        def check(name: str, plan: str, kind: str) -> None:
            wh = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()
            d.put_workload(wh, name, "{}")
            pid = d.put_plan(wh, {"kind": kind}, HOST, "p", plan, "tuned")
            _measure(d, pid, 1.0)
            best = d.best_plan(wh, {"kind": kind})
            assert best is not None and best.workload_name == name and best.target == {"kind": kind}

        check()


# --------------------------------------------------------------------------- #
# opening: versions, corruption, missing files, WAL
# --------------------------------------------------------------------------- #
def _set_version(path: Path, version: int) -> None:
    con = sqlite3.connect(path)
    with con:
        con.execute("UPDATE af_schema SET version = ?", (version,))
    con.close()


def test_newer_schema_version_rejected(tmp_path: Path) -> None:
    path = tmp_path / "af.db"
    PlanDB(_url(path)).close()
    _set_version(path, 7)
    with pytest.raises(DBError, match=rf"database schema version 7 is newer than this autofuse \({dbmod.SCHEMA_VERSION}\); upgrade autofuse"):
        PlanDB(_url(path))
    with pytest.raises(DBError, match="newer"):
        PlanDB(_url(path), readonly=True)


def test_migrations_are_applied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "af.db"
    with PlanDB(_url(path)) as d:
        d.put_workload("w", "net", "{}")
    _set_version(path, 0)

    with pytest.raises(DBError, match="older"):
        PlanDB(_url(path), readonly=True)
    with pytest.raises(DBError, match="no migration from database schema version 0"):
        PlanDB(_url(path))

    calls: list[int] = []

    def migrate_0_to_1(conn) -> None:
        calls.append(conn.exec_driver_sql("SELECT version FROM af_schema").scalar())

    monkeypatch.setitem(dbmod.MIGRATIONS, 0, migrate_0_to_1)
    with PlanDB(_url(path)) as d:
        assert d.schema_version() == dbmod.SCHEMA_VERSION
        assert d.put_workload("w", "net", "{}") == 1  # data survived
    assert calls == [0]
    with PlanDB(_url(path)):
        pass
    assert calls == [0]  # not re-run


@pytest.mark.parametrize("content", [
    b"this is definitely not a database\n" * 200,
    b"SQLite format 3\x00" + bytes(range(256)) * 40,
])
def test_corrupt_file_is_rejected_and_untouched(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "af.db"
    path.write_bytes(content)
    before = _sha(path)
    for kwargs in ({}, {"readonly": True}, {"create": False}):
        with pytest.raises(DBError) as ei:
            PlanDB(_url(path), **kwargs)
        msg = str(ei.value)
        assert "is not a valid autofuse database" in msg and "\n" not in msg
    assert _sha(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["af.db"]  # no -wal/-shm created


def test_missing_file_without_create(tmp_path: Path) -> None:
    path = tmp_path / "nope" / "af.db"
    with pytest.raises(DBError, match="does not exist"):
        PlanDB(_url(path), create=False)
    with pytest.raises(DBError, match="does not exist"):
        PlanDB(_url(path), readonly=True)
    assert not path.parent.exists()


def test_readonly_refuses_writes(tmp_path: Path) -> None:
    path = tmp_path / "af.db"
    with PlanDB(_url(path)) as d:
        d.put_workload("w", "net", "{}")
    with PlanDB(_url(path), readonly=True) as r:
        with pytest.raises(DBError, match="read-only"):
            r.put_workload("w2", "x", "{}")
        assert r.leaderboard() == []


def test_wal_mode_and_busy_timeout(db: PlanDB) -> None:
    with db.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar().lower() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 30000


# --------------------------------------------------------------------------- #
# concurrency
# --------------------------------------------------------------------------- #
N_WORKERS = 4
N_PER_WORKER = 50


def _worker(args: tuple[str, int]) -> int:
    url, k = args
    d = PlanDB(url)
    try:
        d.put_workload("shared-w", "shared", "{}")
        for i in range(N_PER_WORKER):
            pid = d.put_plan("shared-w", LLVM, HOST, f"p{k}-{i}", "{}", "tuned")
            _measure(d, pid, 1.0 + i, trial=k * 1000 + i)
            shared = d.put_plan("shared-w", LLVM, HOST, f"shared-{i}", "{}", "tuned")  # raced by all
            _measure(d, shared, 2.0 + i, trial=None)
        return k
    finally:
        d.close()


def test_concurrent_writers(tmp_path: Path) -> None:
    url = _url(tmp_path / "conc" / "af.db")
    ctx = mp.get_context("spawn")
    with ctx.Pool(N_WORKERS) as pool:
        assert sorted(pool.map(_worker, [(url, k) for k in range(N_WORKERS)])) == list(range(N_WORKERS))
    with PlanDB(url, readonly=True) as d:
        rows = d.measurements("shared-w", LLVM)
        assert len(rows) == 2 * N_WORKERS * N_PER_WORKER
        assert len({r.plan_hash for r in rows}) == N_WORKERS * N_PER_WORKER + N_PER_WORKER
        assert d.best_plan("shared-w", LLVM).trials == N_WORKERS * N_PER_WORKER


# --------------------------------------------------------------------------- #
# Optuna coexistence
# --------------------------------------------------------------------------- #
def _optuna_roundtrip(url: str, name: str) -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(url)
    study = optuna.create_study(study_name=name, storage=storage, load_if_exists=True)
    study.optimize(lambda t: t.suggest_float("x", -1, 1) ** 2, n_trials=3)
    assert len(optuna.load_study(study_name=name, storage=storage).trials) == 3
    storage.remove_session()
    storage.engine.dispose()


def test_optuna_after_plandb(tmp_path: Path) -> None:
    url = _url(tmp_path / "af.db")
    with PlanDB(url) as d:
        d.put_workload("w", "net", "{}")
    _optuna_roundtrip(url, "s1")
    with PlanDB(url) as d:
        assert d.put_workload("w", "net", "{}") == 1
        names = set(inspect(d.engine).get_table_names())
    assert {"studies", "trials"} <= names and set(dbmod.AF_TABLES) <= names


def test_plandb_after_optuna(tmp_path: Path) -> None:
    url = _url(tmp_path / "af.db")
    _optuna_roundtrip(url, "s1")
    with PlanDB(url) as d:
        d.put_workload("w", "net", "{}")
        p = d.put_plan("w", LLVM, HOST, "p", "{}", "tuned")
        _measure(d, p, 1.0)
        assert d.best_plan("w", LLVM) is not None
    _optuna_roundtrip(url, "s2")
    with pytest.raises(DBError, match="not an autofuse database"):
        other = tmp_path / "optuna_only.db"
        _optuna_roundtrip(_url(other), "s")
        PlanDB(_url(other), create=False)


def test_an_empty_database_file_reads_as_no_plans_yet(tmp_path: Path) -> None:
    """A job creates the file (WAL on) before its tables; a leaderboard polling in between
    must not call it foreign (a four-worker run's reader did, NOTES 32)."""
    path = tmp_path / "new.db"
    sqlite3.connect(path).execute("PRAGMA journal_mode=WAL").fetchall()
    with pytest.raises(DBError, match="has no tables yet .*no tuned plans"):
        PlanDB(_url(path), create=False, readonly=True)
