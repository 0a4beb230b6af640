"""Soak variants of the hardening checks (``make soak``; a few minutes).

More faults (every kind, several times, across workers that already measured correct plans),
10+ SIGKILLs with resume, and 4 workers plus a polling reader for a few minutes.
"""

from __future__ import annotations

import json
import os

import pytest

from test_hardening import concurrency_scenario, fault_scenario, kill_scenario

pytestmark = pytest.mark.soak

SOAK_FAULTS = {2: "wrong", 3: "segfault", 4: "wrong", 6: "hang", 7: "oom", 9: "raise", 10: "wrong", 12: "exit",
               13: "wrong", 15: "oom", 16: "segfault", 18: "wrong", 19: "raise", 21: "wrong"}


def test_soak_many_faults_all_contained(tmp_path):
    fig = fault_scenario(tmp_path, SOAK_FAULTS, trials=24, seed=5)
    assert fig["job_rc"] == 0, fig.get("stderr")
    assert fig["contained"] == fig["injected"], json.dumps(fig["faults"], indent=1)
    assert not fig["wrong_plan_best"] and fig["integrity"] == "ok"


def test_soak_wrong_kernels_never_pass_after_correct_ones(monkeypatch):
    """Every tiny space, correct and corrupted builds interleaved in one process."""
    from autofuse.runner import run_task
    from autofuse.space import space_names
    from autofuse.workload import get_workload

    monkeypatch.setenv("AUTOFUSE_FAULT_INJECTION", "1")
    escaped = []
    for space in space_names():
        w = get_workload(space, True)
        for label in ("default", "unfused"):
            task = {"space": space, "tiny": True, "plan": w.reference_plan(label).to_json(), "target": "llvm",
                    "timing": {"repeats": 2, "min_repeat_ms": 1, "warmup": 1}}
            good = run_task(task)
            bad = run_task({**task, "inject": "wrong"})
            if good["status"] == "ok" and bad["status"] != "wrong":
                escaped.append((space, label, bad["status"], bad.get("error")))
    assert not escaped, escaped


def test_soak_twelve_kills_and_resumes(tmp_path):
    fig = kill_scenario(tmp_path, kills=int(os.environ.get("AUTOFUSE_SOAK_KILLS", "12")), seed=7)
    assert fig["final_rc"] == 0, fig["final_stderr"]
    assert fig["completed_trials_lost"] == 0, fig["log"]
    assert fig["integrity_all_ok"], fig["integrity"]
    assert fig["stuck_running"] == 0 and fig["best_regressions"] == 0, \
        f"stuck RUNNING trials {fig['stuck_trials']}, best regressions {fig['best_regressions']}, log {fig['log']}"


def test_soak_four_workers_and_reader_for_minutes(tmp_path):
    fig = concurrency_scenario(tmp_path, trials=int(os.environ.get("AUTOFUSE_SOAK_TRIALS", "80")), poll_s=0.2)
    assert fig["job_rc"] == 0, fig.get("stderr")
    assert fig["finished"] >= fig["expected_trials"] and fig["running_left"] == 0
    assert fig["locked_errors_seen_by_user"] == 0 and fig["reader_errors"] == 0, fig["reader"]
    assert fig["integrity"] == "ok"
