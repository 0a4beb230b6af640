"""Run the autofuse CLI as a user would: a subprocess, exit code, stdout, stderr."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, env: dict | None = None, timeout: float = 300, cwd: str | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "TVM_NUM_THREADS": "2", **(env or {})}
    return subprocess.run([sys.executable, "-m", "autofuse", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=cwd or ROOT)


TINY_TUNE = ("--tiny", "--repeats", "2", "--min-repeat-ms", "1", "--top-k", "2")


def spawn_tune(url: str, *args: str, space: str = "ew_chain", env: dict | None = None,
               cwd: str | Path | None = None) -> subprocess.Popen:
    """A tiny tuning job in the background (to kill, or beside another one), JSON on stdout."""
    return subprocess.Popen([sys.executable, "-m", "autofuse", "tune", space, "--db", url, *TINY_TUNE, "--json", *args],
                            cwd=cwd or ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TVM_NUM_THREADS": "2", **(env or {})}, start_new_session=True)


def cli_json(*args: str, **kw) -> dict:
    r = cli(*args, "--json", **kw)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def assert_clean_error(r: subprocess.CompletedProcess, code: int, *fragments: str) -> None:
    """One line on stderr, no traceback, the expected exit code."""
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = [l for l in r.stderr.strip().splitlines() if l.strip()]
    assert "Traceback" not in r.stderr, r.stderr
    assert len(lines) >= 1 and lines[-1].startswith(("autofuse: error:", "Error:", "Usage:")) or "Error" in r.stderr, r.stderr
    for f in fragments:
        assert f.lower() in r.stderr.lower(), (f, r.stderr)
