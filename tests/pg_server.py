"""A throwaway PostgreSQL server for the tests: its own data folder, 127.0.0.1 only, a free port.

Several machines tuning one study share a PostgreSQL database, so the tests run the job,
the leaderboard and deployment against a real server.  The server binaries come from the
system (Debian's ``postgresql`` package: ``.ci/run`` installs it when it is missing)."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

import sqlalchemy as sa


def _bin_dir() -> Path | None:
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).resolve().parent
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(Path(d).parent.name))
    return Path(dirs[-1]) if dirs and (Path(dirs[-1]) / "pg_ctl").exists() else None


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (free when asked)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """initdb + pg_ctl start in a temporary folder; ``new_database()`` gives a fresh URL."""

    def __init__(self) -> None:
        bins = _bin_dir()
        if bins is None:
            raise FileNotFoundError("no PostgreSQL server binaries (pg_ctl) on this machine")
        self._bins = bins
        self._dir = Path(tempfile.mkdtemp(prefix="autofuse-pg-"))
        # initdb refuses to run as root: the server then runs as the system's postgres user.
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as:
            user = pwd.getpwnam("postgres")
            os.chown(self._dir, user.pw_uid, user.pw_gid)
        self.port = free_port()
        data = self._dir / "data"
        self._run("initdb", "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
        # -F: no fsync (a test server); sockets only on 127.0.0.1 and in our own folder.
        self._run("pg_ctl", "-D", str(data), "-l", str(self._dir / "server.log"), "-w", "-t", "60",
                  "-o", f"-F -h 127.0.0.1 -p {self.port} -k {self._dir}", "start")
        self._data = data

    def _run(self, tool: str, *args: str) -> None:
        r = subprocess.run([*self._as, str(self._bins / tool), *args], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"{tool} failed: {r.stdout[-500:]} {r.stderr[-500:]}")

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        name = f"t_{uuid.uuid4().hex[:12]}"
        engine = sa.create_engine(self.url("postgres"), isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql(f"CREATE DATABASE {name}")
        finally:
            engine.dispose()
        return self.url(name)

    def kill(self) -> None:
        """Stop the server at once, as a crash or a lost host would (its data folder stays)."""
        self._run("pg_ctl", "-D", str(self._data), "-m", "immediate", "stop")

    def stop(self) -> None:
        try:
            self.kill()
        except RuntimeError:
            pass  # killed already
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)


def start_or_skip() -> PostgresServer:
    """A new server; the test is skipped only where no server binaries exist (``.ci/run``
    installs them), while a server that is there but fails to start fails the test."""
    import pytest

    try:
        return PostgresServer()
    except FileNotFoundError as e:
        pytest.skip(str(e))
