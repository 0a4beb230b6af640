"""Real models: ONNX import, regions, whole-model tune + export (autofuse.onnx_import/regions/model_job).

The three test models in tests/models/ were exported from torchvision / torch.nn code by
benchmarks/make_test_models.py with their weights stripped; autofuse regenerates seeded weights on
load.  Every comparison is against onnxruntime with rtol=1e-3 and atol=1e-3*max|reference|
(the model spaces' tolerances; what ``evaluate_plan``/``measure`` check).
"""

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from helpers import assert_clean_error, cli
from autofuse.measure import QUICK
from autofuse.onnx_import import model_spec
from autofuse.runner import evaluate_plan
from autofuse.target import parse_target
from autofuse.workload import get_workload

MODELS = Path(__file__).resolve().parent / "models"
LLVM = parse_target("llvm")


def _w(name: str):
    return get_workload(model_spec(MODELS / f"{name}.onnx"))


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_small", "transformer_encoder"])
def test_import_default_plan_matches_onnxruntime(name):
    w = _w(name)
    assert (MODELS / f"{name}.onnx").stat().st_size < 1 << 20
    res = evaluate_plan(w, w.reference_plan("default"), LLVM, QUICK)
    assert res["status"] == "ok", res
    assert res["max_rel_err"] < 1e-3


def _helper_model(path: Path, nodes, inputs, output, inits=()):
    g = helper.make_graph(nodes, "g", inputs, [output], initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, str(path))
    return path


def test_split_concat_and_pooling_ops_import(tmp_path):
    """Tuple outputs (Split) and a few ops the three models lack: Split, Sigmoid, Tanh, HardSigmoid, AveragePool, ReduceMean."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4, 1])
    nodes = [
        helper.make_node("Split", ["x"], ["a", "b"], axis=1, name="split0"),
        helper.make_node("Sigmoid", ["a"], ["a2"]), helper.make_node("Tanh", ["b"], ["b2"]),
        helper.make_node("Concat", ["a2", "b2"], ["c"], axis=1),
        helper.make_node("HardSigmoid", ["c"], ["d"]),
        helper.make_node("AveragePool", ["d"], ["e"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("ReduceMean", ["e"], ["y"], axes=[3], keepdims=1),
    ]
    p = _helper_model(tmp_path / "split.onnx", nodes, [x], y)
    w = get_workload(model_spec(p))
    res = evaluate_plan(w, w.reference_plan("default"), LLVM, QUICK)
    assert res["status"] == "ok", res


def test_clip_with_scalar_initializers_and_elementwise_ops(tmp_path):
    """Clip's min/max as 0-d initializers (what PyTorch's ReLU6/hardtanh export) stay 0-d
    through import and weight binding, and build fused and unfused; with Erf, HardSwish, Sub, Div."""
    from onnx import numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])
    inits = [numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
             numpy_helper.from_array(np.array(6.0, np.float32), "hi"),
             numpy_helper.from_array(np.full((1, 4, 1, 1), 2.0, np.float32), "s")]
    nodes = [
        helper.make_node("Mul", ["x", "s"], ["m"]),
        helper.make_node("Clip", ["m", "lo", "hi"], ["c"], name="relu6"),
        helper.make_node("Erf", ["c"], ["e"]), helper.make_node("HardSwish", ["e"], ["h"]),
        helper.make_node("Sub", ["h", "x"], ["d"]), helper.make_node("Div", ["d", "s"], ["y"]),
    ]
    p = _helper_model(tmp_path / "clip.onnx", nodes, [x], y, inits)
    w = get_workload(model_spec(p))
    assert w.space.param_values["lo"].shape == ()
    for label in ("unfused", "default"):
        res = evaluate_plan(w, w.reference_plan(label), LLVM, QUICK)
        assert res["status"] == "ok" and res["correct"], (label, res)


def test_op_without_a_schedule_runs_as_an_opaque_group(tmp_path):
    """CumSum has no LegalizeOps rule and its TVM kernel has no blocks to tile: it becomes an
    opaque group (alone, no knobs, run as TVM wrote it) and the model still builds, tunes and
    matches onnxruntime; TopK (two outputs) is refused in one line naming the op."""
    from onnx import numpy_helper

    from autofuse.build import group_anchor
    from autofuse.partition import Kind
    from autofuse.search import PlanSpace

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 16])
    axis = numpy_helper.from_array(np.array(1, np.int64), "axis")
    p = _helper_model(tmp_path / "cumsum.onnx", [helper.make_node("Relu", ["x"], ["r"]),
                                                 helper.make_node("CumSum", ["r", "axis"], ["y"], name="scan0")],
                      [x], y, [axis])
    w = get_workload(model_spec(p))
    g = w.graph(True)
    assert [op.kind for op in g.ops] == [Kind.ELEMWISE, Kind.OPAQUE]
    assert group_anchor(g, (1,))[0] < 0
    assert PlanSpace(w)._group_space(g, (1,))[2] == {}
    for label in ("unfused", "default"):
        res = evaluate_plan(w, w.reference_plan(label), LLVM, QUICK)
        assert res["status"] == "ok" and res["correct"], (label, res)
    r = cli("tune", str(p), "--target", "llvm", "--db", f"sqlite:///{tmp_path / 'o.db'}", "--trials", "4")
    assert r.returncode == 0, r.stderr

    k = numpy_helper.from_array(np.array([4], np.int64), "k")
    yk = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 4])
    p2 = _helper_model(tmp_path / "topk.onnx", [helper.make_node("TopK", ["x", "k"], ["y", "i"], axis=-1)], [x], yk, [k])
    assert_clean_error(cli("import", str(p2), "--db", f"sqlite:///{tmp_path / 'o.db'}"), 2, "topk")


def test_regions_dedup_resnet_and_stitch_default():
    from autofuse.regions import model_regions, stitch

    w = _w("resnet18")
    rs = model_regions(w)
    assert len(rs.distinct) < len(rs.instances)  # repeated BasicBlocks are tuned once
    assert max(rs.count(h) for h in rs.distinct) >= 2
    covered = sorted(i for r in rs.instances for i in r.ops)
    assert covered == list(range(len(w.graph(True).ops)))
    plan = stitch(rs, {})
    assert sorted(o for g in plan.groups for o in g) == sorted(op.name for op in w.graph(True).ops)


def test_tiny_whole_model_tune_export_load(tmp_path):
    """1 trial per region, stitch, verify vs onnxruntime, deploy.load by file, export, load_library."""
    from autofuse import deploy
    from autofuse.model_job import ModelTuneConfig, tune_model
    from autofuse.regions import model_regions

    path = MODELS / "transformer_encoder.onnx"
    spec = model_spec(path)
    w = get_workload(spec)
    n = len(model_regions(w).distinct)
    url = f"sqlite:///{tmp_path / 'm.db'}"
    res = tune_model(ModelTuneConfig(spec, db_url=url, trials=n, timing=QUICK, final_timing=QUICK))
    assert res["trials"] == n and all(r["trials"] == 1 for r in res["regions_detail"])
    assert res["final"]["stitched"]["status"] == "ok", res["final"]
    acts, expected = w.check_data()
    model = deploy.load(url, str(path), target="llvm")
    tol = w.space.atol + w.space.rtol * np.abs(expected)
    assert np.all(np.abs(model(**acts) - expected) <= tol)
    lib = model.export(tmp_path / "enc.so")
    again = deploy.load_library(lib)
    assert np.all(np.abs(again(**acts) - expected) <= tol)


def test_model_tune_with_only_a_timeout_runs_until_the_timeout(tmp_path):
    """`tune model.onnx --timeout T` keeps tuning regions until T (no hidden trial cap)."""
    from onnx import numpy_helper

    from autofuse.model_job import ModelTuneConfig, tune_model

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])
    s = numpy_helper.from_array(np.full((1, 4, 1, 1), 2.0, np.float32), "s")
    p = _helper_model(tmp_path / "small.onnx", [helper.make_node("Mul", ["x", "s"], ["m"]),
                                                helper.make_node("Sigmoid", ["m"], ["y"])], [x], y, [s])
    res = tune_model(ModelTuneConfig(model_spec(p), db_url=f"sqlite:///{tmp_path / 's.db'}", timeout_s=6,
                                     timing=QUICK, final_timing=QUICK))
    assert res["budget"] is None
    assert res["wall_s"] >= 6
    assert res["final"]["stitched"]["status"] == "ok"


def test_model_rerun_continues_each_region_study(tmp_path):
    """A second `tune model.onnx` (after a crash, or simply more budget) continues every region's
    Optuna study: its trials add up, the default plan is not measured again, and the region's
    best so far carries over into the scheduler's priorities."""
    import optuna

    from autofuse.model_job import ModelTuneConfig, region_study_name, tune_model
    from autofuse.regions import model_regions

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])
    p = _helper_model(tmp_path / "chain.onnx", [helper.make_node("Sigmoid", ["x"], ["s"]),
                                                helper.make_node("Mul", ["x", "s"], ["y"])], [x], y, [])
    spec, url = model_spec(p), f"sqlite:///{tmp_path / 'r.db'}"
    w = get_workload(spec)
    (rw,) = model_regions(w).workloads.values()
    first = tune_model(ModelTuneConfig(spec, db_url=url, trials=3, timing=QUICK, final_timing=QUICK))
    second = tune_model(ModelTuneConfig(spec, db_url=url, trials=3, timing=QUICK, final_timing=QUICK))
    assert first["trials"] == second["trials"] == 3
    study = optuna.load_study(study_name=region_study_name(rw, LLVM), storage=url)
    finished = [t for t in study.trials if t.state.is_finished()]
    assert len(finished) == 6
    assert [t.user_attrs.get("label") for t in finished].count("default") == 1
    assert second["regions_detail"][0]["trials"] == 6
    assert second["regions_detail"][0]["best_ms"] <= first["regions_detail"][0]["best_ms"]
    log = Path(second["log"])  # one log per model study, beside its database, continued by the rerun
    assert log == Path(first["log"]) and log.parent == tmp_path
    text = log.read_text()
    assert text.count("model job start") == 2 and text.count("model job end") == 2 and "model tune" in text
    values = [v for _, v in second["curve"]]  # the model's estimated latency over the job
    assert values and values == sorted(values, reverse=True) and values[-1] == second["estimate_ms"]


def test_cli_import_then_tune_and_export_by_name(tmp_path):
    db = f"sqlite:///{tmp_path / 'c.db'}"
    model = str(MODELS / "transformer_encoder.onnx")
    r = cli("import", model, "--name", "enc", "--db", db, "--json")
    assert r.returncode == 0, r.stderr
    assert '"distinct_regions"' in r.stdout
    r = cli("tune", "enc", "--db", db, "--trials", "3", "--repeats", "1", "--min-repeat-ms", "1", "--json")
    assert r.returncode == 0, r.stderr
    r = cli("export", "enc", "--target", "llvm", "--db", db, "-o", str(tmp_path / "enc.so"), "--json")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "enc.so").is_file()


def test_cli_errors_are_one_line_exit_2(tmp_path):
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x08\x07garbage, not a protobuf \xff\xfe" * 3)
    assert_clean_error(cli("import", str(garbage)), 2, "not a valid ONNX model")
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes((MODELS / "resnet18.onnx").read_bytes()[:5000])
    assert_clean_error(cli("import", str(truncated)), 2, "not a valid ONNX model")

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [])
    p = _helper_model(tmp_path / "det.onnx", [helper.make_node("Det", ["x"], ["y"], name="det0")], [x], y)
    assert_clean_error(cli("import", str(p)), 2, "unsupported ONNX op Det", "det0")

    xs = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])
    ys = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])
    p = _helper_model(tmp_path / "sym.onnx", [helper.make_node("Relu", ["x"], ["y"])], [xs], ys)
    assert_clean_error(cli("import", str(p)), 2, "symbolic dim 'batch'", "--shape")
    r = cli("import", str(p), "--shape", "x=2,8", "--db", f"sqlite:///{tmp_path / 's.db'}")
    assert r.returncode == 0, r.stderr


def _two_alike_layers(tmp_path):
    """x -> MatMul(8x32) -> Relu -> MatMul(32x64) -> Relu: two regions of one structure, other shapes."""
    from onnx import numpy_helper

    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 64])
    w1 = numpy_helper.from_array(rng.standard_normal((8, 32)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((32, 64)).astype(np.float32), "w2")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    return _helper_model(tmp_path / "alike.onnx", nodes, [x], y, [w1, w2])


def test_alike_regions_hand_each_other_their_best_plan(tmp_path):
    """Two regions of one structure (other shapes): the best plan of one is queued in the other's
    study, op names mapped by position, knobs kept where they fit, tiles shrunk where they do
    not; each plan is offered once."""
    import optuna

    from autofuse.model_job import _offer_similar, _RegionState
    from autofuse.regions import model_regions, structure
    from autofuse.search import PlanSpace

    w = get_workload(model_spec(_two_alike_layers(tmp_path)))
    (ha, wa), (hb, wb) = model_regions(w).workloads.items()
    assert ha != hb and structure(wa) == structure(wb)
    states = [_RegionState(h, rw, 1, optuna.create_study(), PlanSpace(rw), structure=structure(rw))
              for h, rw in ((ha, wa), (hb, wb))]
    donor, taker = states
    if donor.w.graph(True).ops[0].shape[-1] < taker.w.graph(True).ops[0].shape[-1]:
        donor, taker = taker, donor  # the donor is the wider layer: its 64-column tile must shrink
    default = donor.w.reference_plan("default")
    donor.best_plan = donor.w.partition_plan(tuple(tuple(range(len(donor.w.graph(True).ops))) for _ in [0]), True,
                                             "tuned", [{"t1": 64, "unroll": 16, "vector": False}])
    donor.best_ms, donor.default_ms = 1.0, 2.0
    assert donor.best_plan.groups == default.groups
    _offer_similar(taker, states)
    (queued,) = taker.study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert queued.user_attrs["label"] == "similar" and taker.queued == 1
    params = queued.system_attrs["fixed_params"]
    matmul = taker.w.graph(True).ops[0].name
    assert params[f"F:{matmul}:unroll"] == 16 and params[f"F:{matmul}:vector"] is False
    assert params[f"F:{matmul}:t1"] == 32  # 64 does not fit the 32 columns here
    _offer_similar(taker, states)
    assert len(taker.study.get_trials(states=(optuna.trial.TrialState.WAITING,))) == 1  # offered once


def test_model_tune_with_alike_regions_runs_end_to_end(tmp_path):
    from autofuse.model_job import ModelTuneConfig, tune_model

    spec = model_spec(_two_alike_layers(tmp_path))
    res = tune_model(ModelTuneConfig(spec, db_url=f"sqlite:///{tmp_path / 'a.db'}", trials=14, timing=QUICK,
                                     final_timing=QUICK))
    assert res["trials"] == 14 and res["final"]["stitched"]["status"] == "ok", res["final"]


def test_bench_of_a_model_file_tunes_its_regions_and_checks_every_column(tmp_path):
    """`autofuse bench model.onnx`: the whole model against its peers, each column checked
    against onnxruntime; the report counts the trials of all regions."""
    import json

    from onnx import numpy_helper

    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])
    w1 = numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w1")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Softmax", ["h"], ["s"], axis=-1),
             helper.make_node("Relu", ["s"], ["y"])]
    p = _helper_model(tmp_path / "softmax.onnx", nodes, [x], y, [w1])
    out = tmp_path / "bench"
    r = cli("bench", str(p), "--budget", "6s", "--columns", "unfused,tvm-default,onnxruntime,autofuse", "--rounds", "1",
            "--repeats", "1", "--min-repeat-ms", "1", "-o", str(out), "--json", timeout=600)
    assert r.returncode == 0, r.stderr
    (space,) = json.loads(r.stdout)["spaces"]
    assert set(space["columns"]) == {"unfused", "tvm-default", "onnxruntime", "autofuse"}
    for name, col in space["columns"].items():
        assert col["correct"] is True and col["median_ms"] > 0, (name, col)
    trials = space["autofuse_model_job"]["trials"]
    assert trials > 0 and f"{trials} (all regions)" in (out / "bench.md").read_text()


def test_gelu_op_imports_and_is_correct_with_and_without_fast_math(tmp_path):
    """ONNX Gelu (opset 20, erf form) after a MatMul: the default plan and the same plan with
    ``fast_math`` (erf as a polynomial) both match onnxruntime."""
    from dataclasses import replace

    from onnx import numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])
    w1 = numpy_helper.from_array(np.random.default_rng(1).standard_normal((16, 32)).astype(np.float32), "w1")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Gelu", ["h"], ["y"])]
    g = helper.make_graph(nodes, "g", [x], [y], initializer=[w1])
    p = tmp_path / "gelu.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)]), str(p))
    w = get_workload(model_spec(p))
    assert w.graph(True).uses_transcendentals
    for plan in (w.reference_plan("default"), replace(w.reference_plan("default"), fast_math=True)):
        res = evaluate_plan(w, plan, LLVM, QUICK)
        assert res["status"] == "ok" and res["correct"], (plan.fast_math, res)
