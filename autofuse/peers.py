"""Peers that autofuse is compared with: the same function run by other engines.

``onnx_model(space_name, space, params)`` writes each bundled space as an ONNX
graph (weights as initializers), so onnxruntime runs exactly what the space
computes; ``bench`` checks its output against the NumPy reference like any other
column.  Spaces without an ONNX form simply have no onnxruntime column.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from autofuse.space import Space

EPS = 1e-5


def _bn(nodes, inits, x, prefix, out):
    import onnx.helper as h

    nodes.append(h.make_node("BatchNormalization", [x, f"{prefix}gamma", f"{prefix}beta", f"{prefix}mean", f"{prefix}var"],
                             [out], epsilon=EPS))


def _graphs() -> dict[str, Callable]:
    import onnx.helper as h

    def mlp_gelu(nodes, inits):
        nodes += [h.make_node("Gemm", ["x", "w1", "b1"], ["h1"], transB=1),
                  h.make_node("Gelu", ["h1"], ["g"], approximate="tanh"),
                  h.make_node("Gemm", ["g", "w2", "b2"], ["y0"], transB=1),
                  h.make_node("Add", ["y0", "x"], ["y"])]

    def conv_bn_relu(nodes, inits):
        nodes.append(h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]))
        _bn(nodes, inits, "c", "", "b")
        nodes.append(h.make_node("Relu", ["b"], ["y"]))

    def ew_chain(nodes, inits):
        nodes += [h.make_node("Add", ["a", "b"], ["s"]), h.make_node("Relu", ["s"], ["r"]),
                  h.make_node("Mul", ["r", "c"], ["m"]), h.make_node("Add", ["m", "d"], ["y"])]

    def layernorm_residual(nodes, inits):
        nodes += [h.make_node("Add", ["x", "r"], ["s"]),
                  h.make_node("LayerNormalization", ["s", "gamma", "beta"], ["y"], axis=-1, epsilon=EPS)]

    def attention(nodes, inits):
        inits["scale"] = np.array(0.125, np.float32)
        nodes += [h.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]), h.make_node("MatMul", ["q", "kt"], ["s0"]),
                  h.make_node("Mul", ["s0", "scale"], ["s"]), h.make_node("Softmax", ["s"], ["p"], axis=-1),
                  h.make_node("MatMul", ["p", "v"], ["y"])]

    def resnet_block(nodes, inits):
        nodes.append(h.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]))
        _bn(nodes, inits, "c1", "bn1_", "b1")
        nodes += [h.make_node("Relu", ["b1"], ["r1"]), h.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1])]
        _bn(nodes, inits, "c2", "bn2_", "b2")
        nodes += [h.make_node("Add", ["b2", "x"], ["s"]), h.make_node("Relu", ["s"], ["y"])]

    def gemm_bn(nodes, inits):
        nodes.append(h.make_node("Gemm", ["x", "w", "b"], ["g"], transB=1))
        _bn(nodes, inits, "g", "", "n")
        nodes.append(h.make_node("Relu", ["n"], ["y"]))

    def mobilenet_block(nodes, inits):
        inits["lo"], inits["hi"] = np.array(0, np.float32), np.array(6, np.float32)
        nodes.append(h.make_node("Conv", ["x", "dw"], ["d"], pads=[1, 1, 1, 1], group=32))
        _bn(nodes, inits, "d", "bn1_", "b1")
        nodes += [h.make_node("Clip", ["b1", "lo", "hi"], ["r"]), h.make_node("Conv", ["r", "pw"], ["p"])]
        _bn(nodes, inits, "p", "bn2_", "y")

    return {f.__name__: f for f in (mlp_gelu, conv_bn_relu, ew_chain, layernorm_residual, attention, resnet_block,
                                    gemm_bn, mobilenet_block)}


def has_onnx(space_name: str) -> bool:
    return space_name in _graphs()


def onnx_model(space: Space, params: dict[str, np.ndarray], output_shape: tuple[int, ...]):
    """The space as an ONNX ModelProto (opset 20), parameters as initializers."""
    import onnx
    import onnx.helper as h
    from onnx import numpy_helper

    nodes: list = []
    inits: dict[str, np.ndarray] = dict(params)
    _graphs()[space.name](nodes, inits)
    if space.name == "mobilenet_block" and space.params[0].shape[0] != 32:  # tiny variant: group = channels
        nodes[0] = h.make_node("Conv", ["x", "dw"], ["d"], pads=[1, 1, 1, 1], group=space.params[0].shape[0])
    inputs = [h.make_tensor_value_info(t.name, onnx.TensorProto.FLOAT, list(t.shape)) for t in space.activations]
    output = h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, list(output_shape))
    graph = h.make_graph(nodes, space.name, inputs, [output],
                         [numpy_helper.from_array(np.asarray(v), name=k) for k, v in inits.items()])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 20)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def onnxruntime_session(model, threads: int):
    """An onnxruntime CPU session with every graph optimization on and ``threads`` intra-op threads."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    # no busy-waiting after a run: its spinning threads would steal the cores of whatever
    # the benchmark times next (the columns are interleaved in one process)
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
