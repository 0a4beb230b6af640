import os

import pytest

os.environ.setdefault("TVM_NUM_THREADS", "2")


@pytest.fixture(scope="session")
def postgres_server():
    """One PostgreSQL server per test process (``pg_server.start_or_skip``)."""
    from pg_server import start_or_skip

    server = start_or_skip()
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def any_db_url(request, tmp_path):
    """A fresh empty database: a SQLite file, or a database on the test PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/t.db"
    return request.getfixturevalue("postgres_server").new_database()
