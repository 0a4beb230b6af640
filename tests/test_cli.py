"""The command line as users run it: JSON outputs, and clean errors for bad input."""

import json

from helpers import assert_clean_error, cli, cli_json


def test_spaces_json_lists_inputs_and_ops():
    out = cli_json("spaces", "--tiny")
    by_name = {s["name"]: s for s in out["spaces"]}
    assert len(by_name) >= 8
    ew = by_name["ew_chain"]
    assert [i["name"] for i in ew["activations"]] == ["a", "b", "c", "d"]
    assert all(i["dtype"] == "float32" and len(i["shape"]) == 2 for i in ew["activations"])
    assert ew["ops"] == ["add", "relu", "multiply", "add"]


def test_partitions_json_counts():
    out = cli_json("partitions", "conv_bn_relu", "--tiny", "--list", "--limit", "3")
    assert out["space"] == "conv_bn_relu"
    # a conv followed by a 5-op element-wise chain: every cut pattern of the chain is legal
    assert out["count"] == 2 ** 5 and out["exact"]
    assert len(out["partitions"]) == 3
    assert out["default"] == [[op for grp in out["unfused"] for op in grp]]


def test_run_json_has_the_documented_fields():
    out = cli_json("run", "ew_chain", "--tiny", "--plan", "unfused", "--repeats", "3", "--min-repeat-ms", "1")
    for key in ("space", "plan", "target", "groups", "correct", "max_rel_err", "median_ms", "spread_ms"):
        assert key in out
    assert out["correct"] is True and out["groups"] == 4 and out["median_ms"] > 0


def test_run_a_plan_file(tmp_path):
    plan = cli_json("run", "mlp_gelu", "--tiny", "--plan", "default", "--repeats", "2", "--min-repeat-ms", "1")
    assert plan["groups"] == 2
    from autofuse.workload import get_workload

    w = get_workload("mlp_gelu", True)
    p = w.reference_plan("default")
    f = tmp_path / "p.json"
    f.write_text(p.to_json())
    out = cli_json("run", "mlp_gelu", "--tiny", "--plan", str(f), "--repeats", "2", "--min-repeat-ms", "1")
    assert out["plan"] == p.hash and out["correct"]


def test_build_for_cuda_writes_library_and_sidecar(tmp_path):
    lib = tmp_path / "cbr_cuda.so"
    out = cli_json("build", "conv_bn_relu", "--tiny", "--plan", "default",
                   "--target", '{"kind":"cuda","arch":"sm_90"}', "-o", str(lib))
    assert "cuda" in out["device_modules"]
    assert lib.stat().st_size > 0
    meta = json.loads((tmp_path / "cbr_cuda.so.json").read_text())
    assert meta["target"]["kind"] == "cuda" and meta["plan_hash"] == out["plan"]


def test_bad_inputs_give_one_line_and_exit_2(tmp_path):
    assert_clean_error(cli("run", "nope"), 2, "unknown space")
    assert_clean_error(cli("run", "ew_chain", "--tiny", "--target", "{not json"), 2, "target")
    assert_clean_error(cli("run", "ew_chain", "--tiny", "--target", '{"kind":"vulkan"}'), 2, "not supported")
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 1, "groups": [{"ops": ["lv"], "schedule": {"t0": 99999}}]}')
    assert_clean_error(cli("run", "ew_chain", "--tiny", "--plan", str(bad)), 2)
    assert_clean_error(cli("run", "ew_chain", "--tiny", "--plan", str(tmp_path / "missing.json")), 2, "plan")
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{{{")
    assert_clean_error(cli("run", "ew_chain", "--tiny", "--plan", str(garbage)), 2, "not valid json")


def test_the_tune_progress_line_shows_what_the_best_runs_at_side_by_side_beside_its_score():
    """On a noisy host a score can stand far from what its plan runs at (2.93 ms for a plan
    the final timed at 7.06, NOTES 56): the progress line says both."""
    from types import SimpleNamespace

    import optuna

    from autofuse.cli import _tune_progress, best_text
    from autofuse.runner import OK

    assert best_text(None, None) == "-" and best_text(4.03, None) == "4.0300 ms"
    assert best_text(4.03, 4.031) == "4.0300 ms"  # the same to half a percent: said once
    study = optuna.create_study()

    def trial(h, value, confirm=None):
        t = study.ask()
        for k, v in {"plan": f"plan {h}", "plan_hash": h, "status": OK, "seconds": 0.5, "confirm": confirm}.items():
            if v is not None:
                t.set_user_attr(k, v)
        study.tell(t, value)

    progress = _tune_progress(SimpleNamespace(trials=10, space="gemm_bn"), 0)
    with progress as update:
        trial("a", 4.0)
        update(study)
        fields = progress.progress.tasks[0].fields
        assert fields["best"] == "4.0000 ms"  # no comparison yet: its one timing
        trial("b", 3.6, {"vs": "a", "candidate_ms": 3.6, "incumbent_ms": 4.0, "faster": True})
        trial("c", 3.7, {"vs": "b", "candidate_ms": 2.7, "incumbent_ms": 2.6, "faster": False})
        trial("d", 3.7, {"vs": "b", "candidate_ms": 2.7, "incumbent_ms": 2.6, "faster": False})
        update(study)
        assert progress.progress.tasks[0].fields["best"] == "3.6000 ms (runs 2.6000 side by side)"
