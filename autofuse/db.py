"""The tuned-plan database.

Plans that deployment consumes and leaderboards read live here, stored through
SQLAlchemy Core on any SQLAlchemy URL (default ``sqlite:///results/autofuse.db``).
The same URL normally also holds Optuna's RDB storage tables (``studies``,
``trials``, ...), so every table of ours is prefixed ``af_``.

Design notes
------------
* SQL only through SQLAlchemy expressions with bound parameters; JSON via
  :mod:`json`; no pickle.  Every public call returns plain dataclasses/ints.
* SQLite: WAL journal, 30 s busy timeout, and write transactions opened with
  ``BEGIN IMMEDIATE`` (so a reader never has to upgrade to a writer, which is
  the usual source of instant "database is locked" errors).  Writes are short
  and retried with backoff on "database is locked"/"busy".
* An existing SQLite file is probed read-only (header check + opening the
  schema) *before* anything is allowed to write to it, so a corrupt file gives
  a one-line :class:`DBError` and is never modified.
* Schema version lives in ``af_schema``; ``MIGRATIONS[v](connection)`` upgrades
  a database from version ``v`` to ``v + 1`` inside the opening transaction.
  A read-only reader of an older database reads it as it is (version 1 has no
  rank column, read as NULL; version 2 calls it ``p75_ms``): upgrading autofuse
  never locks readers out.

This module deliberately does not import TVM.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import sqlite3
import time
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any, TypeVar

from sqlalchemy import (
    Boolean,
    Column,
    Connection,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    exc as sa_exc,
    inspect,
    literal_column,
    null,
    select,
)
from sqlalchemy.engine import URL, Engine, make_url

__all__ = [
    "DEFAULT_URL",
    "SCHEMA_VERSION",
    "MIGRATIONS",
    "DBError",
    "PlanDB",
    "BestPlan",
    "LeaderRow",
    "MeasurementRow",
    "canonical_json",
    "display_url",
    "utc_now_iso",
]

DEFAULT_URL = "sqlite:///results/autofuse.db"


def sqlite_file(url: str | URL) -> str | None:
    """The file behind a SQLite URL; None for an in-memory database, a server (PostgreSQL), or a
    URL that does not parse (whoever opens it reports that)."""
    try:
        url = make_url(url)
    except Exception:  # noqa: BLE001 - sqlalchemy raises several types for a bad URL
        return None
    if url.get_backend_name() != "sqlite":
        return None
    db = url.database
    if not db or db == ":memory:" or db.startswith("file:"):
        return None
    return db


def display_url(url: str | URL) -> str:
    """The URL to show a user: its password, if any, hidden."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - a URL that does not parse is shown as given
        return str(url)


def normalize_url(text: str) -> str:
    """A plain file path (``results/my.db``) means that SQLite file; anything with a
    scheme (``sqlite:///...``, ``postgresql://...``) is an SQLAlchemy URL as is."""
    if "://" in text or not text.strip():
        return text
    return f"sqlite:///{text}"
SCHEMA_VERSION = 3


def _add_p75_column(conn: Connection) -> None:
    """1 -> 2: ``af_measurements.p75_ms`` (nullable; older measurements keep NULL)."""
    if "p75_ms" not in {c["name"] for c in inspect(conn).get_columns("af_measurements")}:
        conn.exec_driver_sql("ALTER TABLE af_measurements ADD COLUMN p75_ms FLOAT")


def _rename_p75_to_rank(conn: Connection) -> None:
    """2 -> 3: ``p75_ms`` becomes ``rank_ms``.  It holds what a final ranks by, which is a
    75th percentile only when the final saw one of the host's speed levels (job.final_rank_ms)."""
    names = {c["name"] for c in inspect(conn).get_columns("af_measurements")}
    if "p75_ms" in names and "rank_ms" not in names:
        conn.exec_driver_sql("ALTER TABLE af_measurements RENAME COLUMN p75_ms TO rank_ms")


#: ``{from_version: fn(connection)}``; ``fn`` upgrades the schema from
#: ``from_version`` to ``from_version + 1``.  It runs inside the (exclusive)
#: opening transaction; ``af_schema`` is updated by :class:`PlanDB` afterwards.
MIGRATIONS: dict[int, Callable[[Connection], None]] = {1: _add_p75_column, 2: _rename_p75_to_rank}

BUSY_TIMEOUT_S = 30.0
WRITE_RETRIES = 8

_SQLITE_HEADER = b"SQLite format 3\x00"
_T = TypeVar("_T")


class DBError(Exception):
    """Any problem opening or using the plan database (one clear line)."""


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #
def utc_now_iso() -> str:
    """Current UTC time as ISO-8601 (``2025-01-01T12:00:00.123456+00:00``)."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def canonical_json(obj: Any) -> str:
    """Deterministic JSON: sorted keys, no insignificant whitespace."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _finite_or_none(value: float | None) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _is_locked(err: BaseException) -> bool:
    msg = str(getattr(err, "orig", None) or err).lower()
    return "database is locked" in msg or "database table is locked" in msg or "busy" in msg


# --------------------------------------------------------------------------- #
# schema
# --------------------------------------------------------------------------- #
metadata = MetaData()

af_schema = Table(
    "af_schema",
    metadata,
    Column("version", Integer, nullable=False),
)

af_workloads = Table(
    "af_workloads",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("hash", String(128), nullable=False, unique=True),
    Column("name", Text, nullable=False),
    Column("graph_json", Text, nullable=False),
    Column("created_at", String(40), nullable=False),
)

af_targets = Table(
    "af_targets",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    # target_hash + "|" + host_hash (sha256 hex each): bounded length, so the
    # unique index works on every backend even for long target JSON.
    Column("key", String(160), nullable=False, unique=True),
    Column("target_hash", String(64), nullable=False, index=True),
    Column("host_hash", String(64), nullable=False),
    Column("target_json", Text, nullable=False),
    Column("host_json", Text, nullable=False),
    Column("created_at", String(40), nullable=False),
)

af_plans = Table(
    "af_plans",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("workload_id", Integer, ForeignKey("af_workloads.id"), nullable=False),
    Column("target_id", Integer, ForeignKey("af_targets.id"), nullable=False),
    Column("plan_hash", String(128), nullable=False),
    Column("plan_json", Text, nullable=False),
    Column("label", String(64), nullable=False),
    Column("created_at", String(40), nullable=False),
    UniqueConstraint("workload_id", "target_id", "plan_hash", name="uq_af_plans_wtp"),
)

af_measurements = Table(
    "af_measurements",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("plan_id", Integer, ForeignKey("af_plans.id"), nullable=False),
    Column("median_ms", Float, nullable=True),
    Column("min_ms", Float, nullable=True),
    Column("max_ms", Float, nullable=True),
    Column("std_ms", Float, nullable=True),
    # A final re-measurement times each plan in several runs spread over its rounds; this is
    # what it ranks the plan by (job.final_rank_ms): the 75th percentile of those runs'
    # medians, the time the plan keeps in three runs of four, or where the final saw both of
    # the host's speed levels, the geometric mean of its median in each.  NULL for a trial.
    Column("rank_ms", Float, nullable=True),
    Column("repeats", Integer, nullable=False),
    Column("correct", Boolean, nullable=False),
    Column("max_rel_err", Float, nullable=True),
    Column("error", Text, nullable=True),
    Column("kind", String(16), nullable=False),
    Column("tvm_version", String(64), nullable=False),
    Column("autofuse_version", String(64), nullable=False),
    Column("study", String(255), nullable=True),
    Column("trial_number", Integer, nullable=True),
    Column("created_at", String(40), nullable=False),
)
Index("ix_af_measurements_plan", af_measurements.c.plan_id)
Index("ix_af_plans_workload_target", af_plans.c.workload_id, af_plans.c.target_id)

AF_TABLES = tuple(t.name for t in metadata.sorted_tables)


# --------------------------------------------------------------------------- #
# public records
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class BestPlan:
    workload_name: str
    workload_hash: str
    target: dict
    host: dict
    plan_hash: str
    plan_json: str
    label: str
    median_ms: float
    spread_ms: float | None  # max_ms - min_ms of the chosen measurement
    repeats: int
    kind: str
    tvm_version: str
    autofuse_version: str
    measured_at: str
    trials: int  # distinct (study, trial_number) measured for workload+target
    rank_ms: float | None = None  # what a final re-measurement ranks by (job.final_rank_ms)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LeaderRow:
    workload: str
    workload_hash: str
    target: str  # canonical target JSON
    plan_hash: str
    label: str
    median_ms: float
    spread_ms: float | None
    speedup_vs_unfused: float | None
    speedup_vs_default: float | None
    trials: int
    tuned_at: str
    tvm_version: str
    autofuse_version: str
    rank: int = 1
    host: dict | None = None  # host fingerprint of the chosen measurement (staleness checks)
    rank_ms: float | None = None  # what a final re-measurement ranks by (job.final_rank_ms)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class MeasurementRow:
    id: int
    plan_hash: str
    label: str
    kind: str
    study: str | None
    trial_number: int | None
    median_ms: float | None
    correct: bool
    max_rel_err: float | None
    error: str | None
    created_at: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# Internal flattened measurement joined with its plan/workload/target.
@dataclass(frozen=True)
class _Rec:
    id: int
    plan_id: int
    plan_hash: str
    label: str
    workload_name: str
    workload_hash: str
    target_json: str
    host_json: str
    host_hash: str
    median_ms: float | None
    min_ms: float | None
    max_ms: float | None
    rank_ms: float | None  # a final's rank time (job.final_rank_ms); None for a trial
    repeats: int
    correct: bool
    max_rel_err: float | None
    error: str | None
    kind: str
    tvm_version: str
    autofuse_version: str
    study: str | None
    trial_number: int | None
    created_at: str

    @property
    def spread(self) -> float | None:
        if self.max_ms is None or self.min_ms is None:
            return None
        return self.max_ms - self.min_ms

    @property
    def usable(self) -> bool:
        return bool(self.correct) and self.median_ms is not None

    @property
    def sort_ms(self) -> float:
        """What the measurement ranks by: a final re-measurement's rank time (its runs' 75th
        percentile, or the mean of its two speed levels: job.final_rank_ms), else its median."""
        return float(self.rank_ms if self.rank_ms is not None else self.median_ms)  # type: ignore[arg-type]


_REC_COLUMNS = (
    af_measurements.c.id,
    af_plans.c.id.label("plan_id"),
    af_plans.c.plan_hash,
    af_plans.c.label,
    af_workloads.c.name.label("workload_name"),
    af_workloads.c.hash.label("workload_hash"),
    af_targets.c.target_json,
    af_targets.c.host_json,
    af_targets.c.host_hash,
    af_measurements.c.median_ms,
    af_measurements.c.min_ms,
    af_measurements.c.max_ms,
    af_measurements.c.rank_ms,
    af_measurements.c.repeats,
    af_measurements.c.correct,
    af_measurements.c.max_rel_err,
    af_measurements.c.error,
    af_measurements.c.kind,
    af_measurements.c.tvm_version,
    af_measurements.c.autofuse_version,
    af_measurements.c.study,
    af_measurements.c.trial_number,
    af_measurements.c.created_at,
)


def _rec_select(rank_column: str | None = "rank_ms"):
    """``rank_column``: what this database calls the rank time; an older database opened
    read-only is read as it is (version 2: ``p75_ms``; version 1: None, no such column)."""
    rank = (af_measurements.c.rank_ms if rank_column == "rank_ms"
            else null() if rank_column is None
            else literal_column(f"af_measurements.{rank_column}", Float))
    columns = [rank.label("rank_ms") if c is af_measurements.c.rank_ms else c for c in _REC_COLUMNS]
    return (
        select(*columns)
        .select_from(af_measurements)
        .join(af_plans, af_plans.c.id == af_measurements.c.plan_id)
        .join(af_workloads, af_workloads.c.id == af_plans.c.workload_id)
        .join(af_targets, af_targets.c.id == af_plans.c.target_id)
        .order_by(af_measurements.c.id)
    )


@dataclass
class _Ranked:
    """Outcome of ranking one (workload, target) group."""

    plans: list[_Rec]  # best measurement per plan_hash, fastest first
    pool: list[_Rec]  # measurements the ranking used (finals if any)
    trials: int


def _count_trials(recs: Iterable[_Rec]) -> int:
    return len({(r.study, r.trial_number) for r in recs if r.trial_number is not None})


def _rank(recs: Sequence[_Rec]) -> _Ranked:
    """Rank plans of one group: only ``final`` measurements count when the group has
    any correct final measurement; the lowest ``sort_ms`` wins (a final's 75th
    percentile of runs: a plan that is fast in some minutes and much slower in others
    does not win on its fast minutes, NOTES 33)."""
    usable = [r for r in recs if r.usable]
    finals = [r for r in usable if r.kind == "final"]
    pool = finals or usable
    best: dict[str, _Rec] = {}
    for r in pool:
        cur = best.get(r.plan_hash)
        if cur is None or (r.sort_ms, r.id) < (cur.sort_ms, cur.id):
            best[r.plan_hash] = r
    plans = sorted(best.values(), key=lambda r: (r.sort_ms, r.id))
    return _Ranked(plans=plans, pool=pool, trials=_count_trials(recs))


def _baseline(recs: Sequence[_Rec], ranked: _Ranked, label: str) -> float | None:
    """Best correct median of the plan(s) labelled ``label``; taken from the
    ranking pool when present there (like-for-like), else any correct one."""
    for source in (ranked.pool, recs):
        meds = [r.median_ms for r in source if r.label == label and r.usable]
        if meds:
            return min(meds)
    return None


def _ratio(base: float | None, median: float) -> float | None:
    if base is None or not median or median <= 0:
        return None
    return base / median


# --------------------------------------------------------------------------- #
# the database
# --------------------------------------------------------------------------- #
class PlanDB:
    """Tuned-plan database on an SQLAlchemy URL.

    ``create``: create the sqlite parent directory/file and our tables if
    missing.  ``readonly``: never write (sqlite connections use
    ``PRAGMA query_only``); write methods raise :class:`DBError`.
    """

    def __init__(self, url: str = DEFAULT_URL, *, create: bool = True, readonly: bool = False) -> None:
        self.readonly = readonly
        self._rank_column: str | None = "rank_ms"  # an older database opened read-only: see _init_schema
        self._engine: Engine | None = None
        try:
            self._url: URL = make_url(url)
        except Exception as e:  # noqa: BLE001 - any parse error is a user error
            raise DBError(f"invalid database URL {url!r}: {e}") from None
        self._display = display_url(self._url)
        self._is_sqlite = self._url.get_backend_name() == "sqlite"
        self._sqlite_path = sqlite_file(self._url)

        if self._sqlite_path is not None:
            self._check_sqlite_file(create=create and not readonly)

        self._engine = self._make_engine()
        try:
            self._retry(self._init_schema, create=create and not readonly, write=not readonly)
        except DBError:
            self.close()
            raise
        except sa_exc.DBAPIError as e:
            self.close()
            if not self._is_sqlite and isinstance(e, sa_exc.OperationalError):  # a server down, unreachable, or refusing us
                raise DBError(f"cannot connect to {self._display}: {_short(e)}") from None
            raise DBError(f"{self._display} is not a valid autofuse database: {_short(e)}") from None
        except Exception as e:
            self.close()
            raise DBError(f"cannot open {self._display}: {_short(e)}") from None

    # ---- opening ----------------------------------------------------------

    def _check_sqlite_file(self, *, create: bool) -> None:
        path = self._sqlite_path
        assert path is not None
        if not os.path.exists(path):
            if not create:
                raise DBError(f"database file {path} does not exist")
            parent = os.path.dirname(os.path.abspath(path))
            try:
                os.makedirs(parent, exist_ok=True)
            except OSError as e:
                raise DBError(f"cannot create directory {parent}: {e.strerror or e}") from None
            return
        if os.path.isdir(path):
            raise DBError(f"{path} is a directory, not an autofuse database")
        # Validate read-only before anything (e.g. PRAGMA journal_mode) writes.  Only SQLite
        # itself opens the file: a plain open()/close() here would drop every POSIX lock
        # this process's SQLite connections (Optuna's, the heartbeat thread's) hold on it
        # -- SQLite's documented corruption hazard; with several workers and a reader it
        # produced "database disk image is malformed".
        try:
            if os.path.getsize(path) == 0:
                return  # empty file == empty SQLite database
        except OSError as e:
            raise DBError(f"cannot read database file {path}: {e.strerror or e}") from None
        uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro"
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        io_deadline = time.monotonic() + 5.0
        while True:
            try:
                con = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S)
                try:
                    names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
                    versions = [r[0] for r in con.execute("SELECT version FROM af_schema")] if "af_schema" in names else []
                finally:
                    con.close()
                newest = max((v for v in versions if isinstance(v, int)), default=None)
                if newest is not None and newest > SCHEMA_VERSION:
                    # refuse here, read-only: opening the engine would already switch the
                    # journal mode (a write) before _init_schema could say no
                    raise DBError(f"database schema version {newest} is newer than this autofuse "
                                  f"({SCHEMA_VERSION}); upgrade autofuse")
                return
            except sqlite3.Error as e:
                # "disk I/O error": a read-only open racing another process that is creating
                # or removing the WAL/shm files as it opens/closes the database; transient.
                transient = _is_locked(e) or ("disk i/o error" in str(e).lower() and time.monotonic() < io_deadline)
                if transient and time.monotonic() < deadline:
                    time.sleep(0.05 + random.random() * 0.1)
                    continue
                if "file is not a database" in str(e):
                    raise DBError(f"{path} is not a valid autofuse database: not an SQLite 3 file") from None
                raise DBError(f"{path} is not a valid autofuse database: {e}") from None

    def _make_engine(self) -> Engine:
        kwargs: dict[str, Any] = {}
        if self._is_sqlite:
            kwargs["connect_args"] = {"timeout": BUSY_TIMEOUT_S}
        try:
            engine = create_engine(self._url, **kwargs)
        except ImportError as e:
            raise DBError(f"cannot open {self._display}: {_missing_driver(e)}") from None
        except Exception as e:  # an unknown dialect etc.
            raise DBError(f"cannot open {self._display}: {_short(e)}") from None
        if self._is_sqlite:
            readonly = self.readonly
            use_wal = self._sqlite_path is not None and not readonly
            busy_ms = int(BUSY_TIMEOUT_S * 1000)

            @event.listens_for(engine, "connect")
            def _on_connect(dbapi_con, _record):
                # Take transaction control away from pysqlite; "begin" below
                # emits the BEGIN ourselves (SQLAlchemy's documented recipe).
                dbapi_con.isolation_level = None
                cur = dbapi_con.cursor()
                try:
                    cur.execute(f"PRAGMA busy_timeout = {busy_ms}")  # constant int
                    if use_wal:
                        cur.execute("PRAGMA journal_mode=WAL")
                        cur.execute("PRAGMA synchronous=NORMAL")
                    if readonly:
                        cur.execute("PRAGMA query_only = ON")
                    cur.execute("PRAGMA foreign_keys = ON")
                finally:
                    cur.close()

            @event.listens_for(engine, "begin")
            def _on_begin(conn):
                if conn.get_execution_options().get("af_write"):
                    conn.exec_driver_sql("BEGIN IMMEDIATE")
                else:
                    conn.exec_driver_sql("BEGIN")

        return engine

    def _init_schema(self, conn: Connection, *, create: bool) -> None:
        names = set(inspect(conn).get_table_names())
        version: int | None = None
        if "af_schema" in names:
            row = conn.execute(select(af_schema.c.version).order_by(af_schema.c.version.desc())).first()
            version = None if row is None else int(row[0])
        if version is not None and version > SCHEMA_VERSION:
            raise DBError(
                f"database schema version {version} is newer than this autofuse "
                f"({SCHEMA_VERSION}); upgrade autofuse"
            )
        if version == SCHEMA_VERSION and names.issuperset(AF_TABLES):
            return
        if self.readonly or not create:
            if not names:  # a job creates the file first, then the tables: a reader can come in between
                raise DBError(f"{self._display} has no tables yet (a job may be creating it): no tuned plans")
            if version is None:
                raise DBError(f"{self._display} is not an autofuse database (no af_schema table)")
            if version in (1, 2) and names.issuperset(AF_TABLES):  # 2 added p75_ms, 3 renamed it rank_ms
                self._rank_column = {1: None, 2: "p75_ms"}[version]
                return
            if version < SCHEMA_VERSION:
                raise DBError(
                    f"database schema version {version} is older than this autofuse "
                    f"({SCHEMA_VERSION}); open it read-write once to migrate"
                )
            missing = sorted(set(AF_TABLES) - names)
            raise DBError(f"{self._display} is not a valid autofuse database: missing tables {', '.join(missing)}")
        if version is not None:
            while version < SCHEMA_VERSION:
                step = MIGRATIONS.get(version)
                if step is None:
                    raise DBError(f"no migration from database schema version {version} to {version + 1}")
                step(conn)
                version += 1
        metadata.create_all(conn, checkfirst=True)
        conn.execute(af_schema.delete())
        conn.execute(af_schema.insert().values(version=SCHEMA_VERSION))

    # ---- plumbing ---------------------------------------------------------
    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise DBError("database is closed")
        return self._engine

    @property
    def url(self) -> str:
        return self._display

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    def __enter__(self) -> PlanDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PlanDB({self._display!r}, readonly={self.readonly})"

    def _retry(self, fn: Callable[..., _T], *args: Any, write: bool = True, **kwargs: Any) -> _T:
        """Run ``fn(conn, ...)`` in one short transaction (``BEGIN IMMEDIATE``
        on sqlite when ``write``), retrying on 'database is locked' (and on
        unique races from concurrent inserts)."""
        last: Exception | None = None
        for attempt in range(WRITE_RETRIES):
            try:
                with self.engine.connect() as conn:
                    conn.execution_options(af_write=write)
                    with conn.begin():
                        return fn(conn, *args, **kwargs)
            except sa_exc.OperationalError as e:
                if not _is_locked(e):
                    raise
                last = e
            except sa_exc.IntegrityError as e:
                # A concurrent writer inserted the same unique row first
                # (possible on non-sqlite backends); the re-read finds it.
                if attempt >= 2:
                    raise
                last = e
            time.sleep(min(2.0, 0.05 * 2**attempt) * (0.5 + random.random()))
        raise DBError(f"database {self._display} stayed locked after {WRITE_RETRIES} attempts: {_short(last)}")

    def _write(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        if self.readonly:
            raise DBError("database was opened read-only")
        try:
            return self._retry(fn, *args, **kwargs)
        except DBError:
            raise
        except sa_exc.DBAPIError as e:
            raise DBError(f"write to {self._display} failed: {_short(e)}") from None

    def _read(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        try:
            with self.engine.connect() as conn:
                with conn.begin():
                    return fn(conn, *args, **kwargs)
        except sa_exc.DBAPIError as e:
            raise DBError(f"read from {self._display} failed: {_short(e)}") from None

    def _recs(self, **filters: Any) -> list[_Rec]:
        """Measurements joined with their plan, workload and target (``_fetch_recs`` filters),
        read the way this database's schema version allows."""
        return self._read(_fetch_recs, rank_column=self._rank_column, **filters)

    # ---- writes -----------------------------------------------------------
    def put_workload(self, hash: str, name: str, graph_json: str) -> int:  # noqa: A002 - spec'd name
        """Insert a workload (idempotent on ``hash``); returns its id."""
        _need_str(hash=hash, name=name, graph_json=graph_json)
        return self._write(_put_workload, hash, name, graph_json)

    def put_target(self, target: dict, host: dict) -> int:
        """Insert a (target, host fingerprint) pair (idempotent); returns its id."""
        return self._write(_put_target, target, host)

    def put_plan(
        self,
        workload_hash: str,
        target: dict,
        host: dict,
        plan_hash: str,
        plan_json: str,
        label: str,
    ) -> int:
        """Insert a plan (idempotent on workload/target+host/plan_hash); returns its id.
        The workload must already exist (:meth:`put_workload`).  An existing
        plan keeps its original label and JSON."""
        _need_str(workload_hash=workload_hash, plan_hash=plan_hash, plan_json=plan_json, label=label)
        return self._write(_put_plan, workload_hash, target, host, plan_hash, plan_json, label)

    def add_measurement(
        self,
        plan_id: int,
        *,
        median_ms: float | None,
        min_ms: float | None,
        max_ms: float | None,
        std_ms: float | None,
        repeats: int,
        rank_ms: float | None = None,
        correct: bool,
        max_rel_err: float | None = None,
        error: str | None = None,
        kind: str = "trial",
        tvm_version: str,
        autofuse_version: str,
        study: str | None = None,
        trial_number: int | None = None,
    ) -> int:
        """Record one measurement of a plan; returns its id.  Non-finite
        timings are stored as NULL; a measurement marked correct must have a
        finite median."""
        median = _finite_or_none(median_ms)
        if correct and median is None:
            raise ValueError("a correct measurement needs a finite median_ms")
        if kind not in ("trial", "final"):
            raise ValueError(f"kind must be 'trial' or 'final', not {kind!r}")
        values = dict(
            plan_id=int(plan_id),
            median_ms=median,
            min_ms=_finite_or_none(min_ms),
            max_ms=_finite_or_none(max_ms),
            std_ms=_finite_or_none(std_ms),
            rank_ms=_finite_or_none(rank_ms),
            repeats=int(repeats),
            correct=bool(correct),
            max_rel_err=_finite_or_none(max_rel_err),
            error=None if error is None else str(error),
            kind=kind,
            tvm_version=str(tvm_version),
            autofuse_version=str(autofuse_version),
            study=None if study is None else str(study),
            trial_number=None if trial_number is None else int(trial_number),
            created_at=utc_now_iso(),
        )
        return self._write(_add_measurement, values)

    # ---- reads ------------------------------------------------------------
    def plan_json(self, workload_hash: str, plan_hash: str) -> str | None:
        """The stored JSON of a plan of ``workload_hash`` by its hash (a hash names one plan
        JSON, whatever target it was measured on), or None if it was never stored."""
        query = (select(af_plans.c.plan_json).join(af_workloads, af_plans.c.workload_id == af_workloads.c.id)
                 .where(af_workloads.c.hash == workload_hash, af_plans.c.plan_hash == plan_hash).limit(1))
        return self._read(lambda c: c.execute(query).scalar())

    def best_plan(self, workload_hash: str, target: dict, *, host: dict | None = None) -> BestPlan | None:
        """Fastest verified plan for ``workload_hash`` on ``target``.

        Only correct measurements count; if any ``final`` ones exist, only
        those.  With ``host``, measurements from that exact host fingerprint
        are preferred; if that host has none, all hosts are considered (check
        ``BestPlan.host`` to warn on a mismatch)."""
        tjson = canonical_json(target)
        recs = self._recs(workload_hash=workload_hash, target_json=tjson)
        if host is not None:
            hh = _sha(canonical_json(host))
            mine = [r for r in recs if r.host_hash == hh]
            if any(r.usable for r in mine):
                recs = mine
        ranked = _rank(recs)
        if not ranked.plans:
            return None
        b = ranked.plans[0]
        plan_json = self._read(
            lambda c: c.execute(select(af_plans.c.plan_json).where(af_plans.c.id == b.plan_id)).scalar_one()
        )
        return BestPlan(
            workload_name=b.workload_name,
            workload_hash=b.workload_hash,
            target=json.loads(b.target_json),
            host=json.loads(b.host_json),
            plan_hash=b.plan_hash,
            plan_json=plan_json,
            label=b.label,
            median_ms=b.median_ms,  # type: ignore[arg-type]
            spread_ms=b.spread,
            repeats=b.repeats,
            kind=b.kind,
            tvm_version=b.tvm_version,
            autofuse_version=b.autofuse_version,
            measured_at=b.created_at,
            trials=ranked.trials,
            rank_ms=b.rank_ms,
        )

    def leaderboard(self, workload: str | None = None, target: str | None = None, top: int = 1) -> list[LeaderRow]:
        """Top-``top`` verified plans per (workload, target), ranked like
        :meth:`best_plan` (hosts pooled).  ``workload`` matches a name exactly
        or a hash prefix; ``target`` matches the target ``kind`` or a
        substring of its canonical JSON."""
        recs = self._recs()
        groups: dict[tuple[str, str], list[_Rec]] = {}
        for r in recs:
            if workload is not None and not (r.workload_name == workload or r.workload_hash.startswith(workload)):
                continue
            if target is not None and not _target_matches(r.target_json, target):
                continue
            groups.setdefault((r.workload_hash, r.target_json), []).append(r)

        rows: list[LeaderRow] = []
        for key in sorted(groups, key=lambda k: (groups[k][0].workload_name, k[0], k[1])):
            grecs = groups[key]
            ranked = _rank(grecs)
            base_unfused = _baseline(grecs, ranked, "unfused")
            base_default = _baseline(grecs, ranked, "default")
            for i, b in enumerate(ranked.plans[: max(0, int(top))], start=1):
                med = float(b.median_ms)  # type: ignore[arg-type]
                rows.append(
                    LeaderRow(
                        workload=b.workload_name,
                        workload_hash=b.workload_hash,
                        target=b.target_json,
                        plan_hash=b.plan_hash,
                        label=b.label,
                        median_ms=med,
                        spread_ms=b.spread,
                        speedup_vs_unfused=_ratio(base_unfused, med),
                        speedup_vs_default=_ratio(base_default, med),
                        trials=ranked.trials,
                        tuned_at=b.created_at,
                        tvm_version=b.tvm_version,
                        autofuse_version=b.autofuse_version,
                        rank=i,
                        host=json.loads(b.host_json),
                        rank_ms=b.rank_ms,
                    )
                )
        return rows

    def measurements(self, workload_hash: str, target: dict, *, host: dict | None = None) -> list[MeasurementRow]:
        """Every measurement for workload+target (all hosts unless ``host``),
        oldest first, for history plots."""
        recs = self._recs(workload_hash=workload_hash, target_json=canonical_json(target))
        if host is not None:
            hh = _sha(canonical_json(host))
            recs = [r for r in recs if r.host_hash == hh]
        return [
            MeasurementRow(
                id=r.id,
                plan_hash=r.plan_hash,
                label=r.label,
                kind=r.kind,
                study=r.study,
                trial_number=r.trial_number,
                median_ms=r.median_ms,
                correct=bool(r.correct),
                max_rel_err=r.max_rel_err,
                error=r.error,
                created_at=r.created_at,
            )
            for r in recs
        ]

    def schema_version(self) -> int:
        """Version recorded in ``af_schema``."""
        return self._read(lambda c: int(c.execute(select(af_schema.c.version)).scalar_one()))


# --------------------------------------------------------------------------- #
# transaction bodies (module-level so they are easy to read and test)
# --------------------------------------------------------------------------- #
def _missing_driver(e: ImportError) -> str:
    """What to install when SQLAlchemy cannot import a database's driver."""
    hint = " (pip install 'autofuse[postgres]')" if "psycopg" in str(e.name or e) else ""
    return f"its database driver is not installed: no module {e.name or str(e)!r}{hint}"


def _short(e: BaseException | None) -> str:
    if e is None:
        return "unknown error"
    orig = getattr(e, "orig", None)
    msg = str(orig if orig is not None else e)
    return msg.strip().splitlines()[0] if msg.strip() else type(e).__name__


def _need_str(**kw: Any) -> None:
    for k, v in kw.items():
        if not isinstance(v, str):
            raise TypeError(f"{k} must be str, not {type(v).__name__}")


def _target_matches(target_json: str, needle: str) -> bool:
    try:
        kind = json.loads(target_json).get("kind")
    except (ValueError, AttributeError):
        kind = None
    return kind == needle or needle in target_json


def _get_or_insert(conn: Connection, table: Any, key: dict[str, Any], values: dict[str, Any]) -> int:
    """Id of the row of ``table`` matching ``key``; inserted (key + values + created_at) if none."""
    found = conn.execute(select(table.c.id).where(*(table.c[k] == v for k, v in key.items()))).scalar()
    if found is not None:
        return int(found)
    res = conn.execute(table.insert().values(**key, **values, created_at=utc_now_iso()))
    return int(res.inserted_primary_key[0])


def _put_workload(conn: Connection, hash_: str, name: str, graph_json: str) -> int:
    return _get_or_insert(conn, af_workloads, {"hash": hash_}, {"name": name, "graph_json": graph_json})


def _put_target(conn: Connection, target: dict, host: dict) -> int:
    if not isinstance(target, dict) or not isinstance(host, dict):
        raise TypeError("target and host must be dicts")
    tjson, hjson = canonical_json(target), canonical_json(host)
    thash, hhash = _sha(tjson), _sha(hjson)
    return _get_or_insert(conn, af_targets, {"key": f"{thash}|{hhash}"},
                          {"target_hash": thash, "host_hash": hhash, "target_json": tjson, "host_json": hjson})


def _put_plan(
    conn: Connection, workload_hash: str, target: dict, host: dict, plan_hash: str, plan_json: str, label: str
) -> int:
    wid = conn.execute(select(af_workloads.c.id).where(af_workloads.c.hash == workload_hash)).scalar()
    if wid is None:
        raise DBError(f"unknown workload {workload_hash!r}; call put_workload first")
    tid = _put_target(conn, target, host)
    return _get_or_insert(conn, af_plans, {"workload_id": wid, "target_id": tid, "plan_hash": plan_hash},
                          {"plan_json": plan_json, "label": label})


def _add_measurement(conn: Connection, values: dict[str, Any]) -> int:
    if conn.execute(select(af_plans.c.id).where(af_plans.c.id == values["plan_id"])).scalar() is None:
        raise DBError(f"unknown plan id {values['plan_id']}")
    res = conn.execute(af_measurements.insert().values(**values))
    return int(res.inserted_primary_key[0])


def _fetch_recs(conn: Connection, *, workload_hash: str | None = None, target_json: str | None = None,
                rank_column: str | None = "rank_ms") -> list[_Rec]:
    q = _rec_select(rank_column)
    if workload_hash is not None:
        q = q.where(af_workloads.c.hash == workload_hash)
    if target_json is not None:
        q = q.where(af_targets.c.target_hash == _sha(target_json), af_targets.c.target_json == target_json)
    return [_Rec(**row._mapping) for row in conn.execute(q)]
