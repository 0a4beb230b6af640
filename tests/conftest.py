import os

import pytest

os.environ.setdefault("TVM_NUM_THREADS", "2")


@pytest.fixture(scope="session")
def postgres_server():
    """One PostgreSQL server per test process; skipped only where no server binaries exist
    (``.ci/run`` installs them); a server that is present but fails to start fails the test."""
    from pg_server import PostgresServer

    try:
        server = PostgresServer()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def any_db_url(request, tmp_path):
    """A fresh empty database: a SQLite file, or a database on the test PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/t.db"
    return request.getfixturevalue("postgres_server").new_database()
