"""autofuse.deploy: load the best verified plan from the DB, call it, export and reload it.

The test DB is built the way a tuning job fills it: the reference plans and one
"tuned" plan (the default partition with different schedule knobs) are measured
for real with ``evaluate_plan`` and stored as trials, plus one final measurement.
"""

from __future__ import annotations

import json
import shutil
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import tvm

import autofuse
from autofuse import deploy
from autofuse.db import PlanDB
from autofuse.deploy import DeployError, StalePlanWarning
from autofuse.measure import QUICK
from autofuse.plan import Plan
from autofuse.runner import evaluate_plan
from autofuse.space import SpaceError
from autofuse.target import host_fingerprint, parse_target
from autofuse.workload import get_workload

SPACES = ("mlp_gelu", "ew_chain")
STUDY = "test-study"
VERSIONS = {"tvm_version": tvm.__version__, "autofuse_version": autofuse.__version__}

_MEASURED: dict = {}


def tuned_plan(w, fold: bool = True) -> Plan:
    """The default partition with a non-default schedule knob: a third, distinct plan."""
    p = w.reference_plan("default", fold)
    return replace(p, schedules=tuple({"unroll": 16} for _ in p.groups), label="tuned")


def measured(space: str) -> list[tuple[Plan, dict]]:
    """(plan, evaluate_plan result) for unfused, default and tuned (cached per process)."""
    if space not in _MEASURED:
        w = get_workload(space, True)
        target = parse_target("llvm")
        plans = [w.reference_plan("unfused"), w.reference_plan("default"), tuned_plan(w)]
        _MEASURED[space] = [(p, evaluate_plan(w, p, target, QUICK)) for p in plans]
    return _MEASURED[space]


def store(db: PlanDB, space: str, plan: Plan, res: dict, *, kind: str = "trial", trial: int | None = None,
          study: str | None = STUDY, host: dict | None = None, target: dict | None = None, **versions) -> int:
    """Store one measurement as the tuning job does; returns the plan id."""
    w = get_workload(space, True)
    target = target or parse_target("llvm").spec
    db.put_workload(w.hash, w.name, w.graph_json())
    pid = db.put_plan(w.hash, target, host or host_fingerprint(), plan.hash, plan.to_json(), plan.label)
    db.add_measurement(
        pid, median_ms=res.get("median_ms"), min_ms=res.get("min_ms"), max_ms=res.get("max_ms"),
        std_ms=res.get("std_ms"), repeats=res.get("repeats", 0), correct=res["correct"],
        max_rel_err=res.get("max_rel_err"), error=res.get("error"), kind=kind, study=study, trial_number=trial,
        **{**VERSIONS, **versions},
    )
    return pid


def build_db(url: str, spaces=SPACES) -> dict:
    """Fill a DB at ``url``; returns {space: {label: median_ms}} of what was stored."""
    medians: dict = {}
    with PlanDB(url) as db:
        for space in spaces:
            results = measured(space)
            for n, (plan, res) in enumerate(results):
                assert res["correct"], (space, plan.label, res)
                store(db, space, plan, res, trial=n)
            # one failed trial (as a job records a rejected candidate)
            store(db, space, results[2][0], {"correct": False, "error": "rejected"}, trial=len(results))
            # a final re-measurement of the tuned plan: finals decide the ranking
            tuned, res = results[2]
            store(db, space, tuned, res, kind="final", study=STUDY)
            medians[space] = {p.label: r["median_ms"] for p, r in results}
    return medians


@pytest.fixture(scope="module")
def db_url(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("deploydb") / "t.db"
    url = f"sqlite:///{path}"
    build_db(url)
    return url


def _reference(w, acts, params=None) -> np.ndarray:
    return np.asarray(w.space.reference(**acts, **(params if params is not None else w.params)))


def _assert_matches(out, ref, space) -> None:
    np.testing.assert_allclose(out.astype(np.float64), ref.astype(np.float64), rtol=space.rtol, atol=space.atol)


# --------------------------------------------------------------------------- #
def test_load_calls_the_tuned_plan_and_matches_numpy(db_url):
    w = get_workload("mlp_gelu", True)
    model = deploy.load(db_url, "mlp_gelu", target="llvm", tiny=True)
    assert model.plan_hash == tuned_plan(w).hash  # the final-measured plan wins
    assert model.plan.label == "tuned"
    assert model.input_names == ["x"]
    assert model.param_names == ["w1", "b1", "w2", "b2"]
    assert model.runtime_param_names == []
    info = model.info
    assert info["workload"] == "mlp_gelu:tiny" and info["workload_hash"] == w.hash
    assert info["plan_hash"] == model.plan_hash and info["median_ms"] > 0
    assert info["tvm_version"] == tvm.__version__ and info["host"] == host_fingerprint()
    acts = w.activations(seed=7)
    out = model(**acts)
    assert isinstance(out, np.ndarray) and out.shape == model.output_shape == (32, 32)
    _assert_matches(out, _reference(w, acts), w.space)
    # positional in input_names order gives the same
    np.testing.assert_array_equal(model(acts["x"]), out)


def test_custom_params_change_the_output_and_match_reference(db_url):
    w = get_workload("mlp_gelu", True)
    rng = np.random.default_rng(3)
    params = {k: (rng.standard_normal(v.shape) * 0.2).astype(np.float32) for k, v in w.params.items()}
    model = deploy.load(db_url, "mlp_gelu", target="llvm", tiny=True, params=params)
    default = deploy.load(db_url, "mlp_gelu", target="llvm", tiny=True)
    assert model.plan_hash == default.plan_hash  # values don't change the workload
    acts = w.activations(seed=2)
    out = model(**acts)
    _assert_matches(out, _reference(w, acts, params), w.space)
    assert not np.allclose(out, default(**acts))
    with pytest.raises(SpaceError, match="shape"):
        deploy.load(db_url, "mlp_gelu", target="llvm", tiny=True, params={"w1": np.zeros((2, 2), np.float32)})


def test_missing_workload_or_db(db_url, tmp_path):
    with PlanDB(f"sqlite:///{tmp_path}/other.db") as db:  # a DB without ew_chain
        plan, res = measured("mlp_gelu")[1]
        store(db, "mlp_gelu", plan, res, trial=0)
    with pytest.raises(DeployError, match=r"no tuned plan for ew_chain:tiny on llvm .*autofuse tune ew_chain"):
        deploy.load(f"sqlite:///{tmp_path}/other.db", "ew_chain", target="llvm", tiny=True)
    with pytest.raises(DeployError, match="no tuned plan for mlp_gelu on llvm"):  # full size was never tuned
        deploy.load(db_url, "mlp_gelu", target="llvm", tiny=False)
    with pytest.raises(DeployError, match="no tuned plan .* on cuda"):
        deploy.load(db_url, "mlp_gelu", target="cuda", tiny=True)
    with pytest.raises(SpaceError, match="unknown space"):
        deploy.load(db_url, "no_such_space", target="llvm", tiny=True)
    missing = tmp_path / "absent.db"
    with pytest.raises(DeployError, match="does not exist"):
        deploy.load(f"sqlite:///{missing}", "mlp_gelu", target="llvm", tiny=True)
    assert not missing.exists()


def test_bad_inputs_are_deploy_errors(db_url):
    model = deploy.load(db_url, "ew_chain", target="llvm", tiny=True)
    w = get_workload("ew_chain", True)
    acts = w.activations()
    _assert_matches(model(**acts), _reference(w, acts), w.space)
    with pytest.raises(DeployError, match="missing input.*d"):
        model(a=acts["a"], b=acts["b"], c=acts["c"])
    with pytest.raises(DeployError, match="unknown input.*zz"):
        model(**acts, zz=acts["a"])
    with pytest.raises(DeployError, match=r"a: shape \(3, 4\), expected \(16, 32\)"):
        model(**{**acts, "a": np.zeros((3, 4), np.float32)})
    with pytest.raises(DeployError, match="b: dtype float64, expected float32"):
        model(**{**acts, "b": acts["b"].astype(np.float64)})


def test_export_and_load_library_round_trip(db_url, tmp_path):
    w = get_workload("mlp_gelu", True)
    model = deploy.load(db_url, "mlp_gelu", target="llvm", tiny=True)
    lib = model.export(tmp_path / "out" / "mlp.so")
    assert lib.is_file() and lib.stat().st_size > 0
    meta = json.loads(Path(str(lib) + ".json").read_text())
    assert meta["plan_hash"] == model.plan_hash
    assert Plan.from_dict(meta["plan"]).hash == model.plan_hash
    assert meta["workload_hash"] == w.hash and meta["workload"] == "mlp_gelu:tiny"
    assert meta["inputs"] == [{"name": "x", "shape": [32, 32], "dtype": "float32"}]
    assert meta["output"]["shape"] == [32, 32] and meta["target"]["kind"] == "llvm"
    assert meta["tvm_version"] == tvm.__version__ and meta["autofuse_version"] == autofuse.__version__
    assert not Path(str(lib) + ".params.npz").exists()  # folded: parameters are in the library
    m2 = deploy.load_library(lib)
    acts = w.activations(seed=5)
    np.testing.assert_array_equal(m2(**acts), model(**acts))
    assert m2.plan_hash == model.plan_hash and m2.input_names == ["x"]
    with pytest.raises(DeployError, match="shape"):
        m2(x=np.zeros((1, 32), np.float32))


def test_unfolded_plan_passes_params_and_exports_them(tmp_path):
    """A plan with fold_params=False gets the parameters as trailing inputs, and exports them to .npz."""
    w = get_workload("mlp_gelu", True)
    plan = w.reference_plan("default", fold=False)
    res = evaluate_plan(w, plan, parse_target("llvm"), QUICK)
    url = f"sqlite:///{tmp_path}/u.db"
    with PlanDB(url) as db:
        store(db, "mlp_gelu", plan, res, trial=0)
    rng = np.random.default_rng(11)
    params = {k: (rng.standard_normal(v.shape) * 0.1).astype(np.float32) for k, v in w.params.items()}
    model = deploy.load(url, "mlp_gelu", target="llvm", tiny=True, params=params)
    assert not model.plan.fold_params and model.runtime_param_names == ["w1", "b1", "w2", "b2"]
    acts = w.activations(seed=4)
    out = model(**acts)
    _assert_matches(out, _reference(w, acts, params), w.space)
    lib = model.export(tmp_path / "u.so")
    npz = Path(str(lib) + ".params.npz")
    assert npz.is_file()
    with np.load(npz, allow_pickle=False) as z:
        np.testing.assert_array_equal(z["w1"], params["w1"])
    m2 = deploy.load_library(lib)
    np.testing.assert_array_equal(m2(**acts), out)
    npz.unlink()
    with pytest.raises(DeployError, match="params.npz is missing"):
        deploy.load_library(lib)


def test_stale_plan_warns_or_raises_when_strict(tmp_path):
    url = f"sqlite:///{tmp_path}/stale.db"
    plan, res = measured("ew_chain")[2]
    with PlanDB(url) as db:
        store(db, "ew_chain", plan, res, trial=0, tvm_version="0.0.1")
    with pytest.warns(StalePlanWarning, match="TVM 0.0.1"):
        model = deploy.load(url, "ew_chain", target="llvm", tiny=True)
    assert model.info["stale"]
    with pytest.raises(DeployError, match="stale.*TVM 0.0.1"):
        deploy.load(url, "ew_chain", target="llvm", tiny=True, strict=True)

    other_host = {**host_fingerprint(), "cpu": "Some Other CPU", "cores": 999}
    url2 = f"sqlite:///{tmp_path}/host.db"
    with PlanDB(url2) as db:
        store(db, "ew_chain", plan, res, trial=0, host=other_host)
    with pytest.warns(StalePlanWarning, match="another host"):
        deploy.load(url2, "ew_chain", target="llvm", tiny=True)
    with pytest.raises(DeployError, match="another host"):
        deploy.load(url2, "ew_chain", target="llvm", tiny=True, strict=True)


def test_fresh_plan_does_not_warn(db_url):
    with warnings.catch_warnings():
        warnings.simplefilter("error", StalePlanWarning)
        deploy.load(db_url, "ew_chain", target="llvm", tiny=True, strict=True)


def test_plan_for_another_workload_is_never_applied(tmp_path):
    """A stored plan whose own workload hash differs from the row it is filed under is refused."""
    url = f"sqlite:///{tmp_path}/mismatch.db"
    plan, res = measured("ew_chain")[1]
    foreign = replace(plan, workload="0123456789abcdef")
    with PlanDB(url) as db:
        store(db, "ew_chain", foreign, res, trial=0)
    with pytest.raises(DeployError, match="cannot be applied"):
        deploy.load(url, "ew_chain", target="llvm", tiny=True)


def test_corrupt_or_missing_sidecar(db_url, tmp_path):
    model = deploy.load(db_url, "ew_chain", target="llvm", tiny=True)
    lib = model.export(tmp_path / "ew.so")
    side = Path(str(lib) + ".json")
    good = side.read_text()

    side.write_text("{not json")
    with pytest.raises(DeployError, match="corrupt"):
        deploy.load_library(lib)
    side.write_text(json.dumps({**json.loads(good), "inputs": "x"}))
    with pytest.raises(DeployError, match="corrupt"):
        deploy.load_library(lib)
    meta = json.loads(good)
    del meta["plan"]
    side.write_text(json.dumps(meta))
    with pytest.raises(DeployError, match="missing field 'plan'"):
        deploy.load_library(lib)
    side.write_text(json.dumps({**json.loads(good), "plan_hash": "ffffffffffffffff"}))
    with pytest.raises(DeployError, match="does not match"):
        deploy.load_library(lib)
    side.unlink()
    with pytest.raises(DeployError, match="missing"):
        deploy.load_library(lib)
    # restored sidecar: loads again; a copy under another name works too (sidecar follows the name)
    side.write_text(good)
    shutil.copy(lib, tmp_path / "copy.so")
    shutil.copy(side, tmp_path / "copy.so.json")
    w = get_workload("ew_chain", True)
    acts = w.activations()
    np.testing.assert_array_equal(deploy.load_library(tmp_path / "copy.so")(**acts), model(**acts))
