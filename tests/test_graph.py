"""The graph view: ops, kinds, the workload hash, and TVM's default partition."""

import numpy as np
from tvm import relax

from autofuse.graph import default_partition, space_graph
from autofuse.partition import Kind
from autofuse.space import Space, Tensor
from autofuse.workload import get_workload

R = relax.op


def _two_branch(names=("a", "b"), exp_first=False, n=16):
    a, b = names

    def forward(**v):
        x, y = v[a], v[b]
        if exp_first:
            e = R.exp(y)
            r = R.nn.relu(x)
        else:
            r = R.nn.relu(x)
            e = R.exp(y)
        return R.add(r, e)

    return Space("two", (Tensor(a, (4, n)), Tensor(b, (4, n))), (), forward,
                 lambda **v: np.maximum(v[a], 0) + np.exp(v[b]))


def test_hash_ignores_names_and_definition_order():
    h1 = space_graph(_two_branch(), fold=True).structural_hash()
    h2 = space_graph(_two_branch(names=("p", "q")), fold=True).structural_hash()
    h3 = space_graph(_two_branch(exp_first=True), fold=True).structural_hash()
    assert h1 == h2 == h3


def test_hash_changes_with_shape_and_argument_order():
    base = space_graph(_two_branch(), fold=True).structural_hash()
    assert space_graph(_two_branch(n=32), fold=True).structural_hash() != base
    swapped = Space("two", (Tensor("b", (4, 16)), Tensor("a", (4, 16))), (),
                    lambda b, a: R.add(R.nn.relu(a), R.exp(b)), lambda a, b: a)
    assert space_graph(swapped, fold=True).structural_hash() != base


def test_conv_bn_relu_ops_and_kinds():
    g = get_workload("conv_bn_relu", True).graph(True)
    assert [op.func for op in g.ops] == ["conv2d", "subtract", "divide", "multiply", "add1", "relu"]
    assert g.ops[0].kind == Kind.OUT_EWISE_FUSABLE
    assert all(op.kind == Kind.ELEMWISE for op in g.ops[1:])
    unfolded = get_workload("conv_bn_relu", True).graph(False)
    assert len(unfolded.ops) > len(g.ops)  # BN statistics ops are not folded away
    assert [t.name for t in unfolded.inputs] == ["x", "w", "gamma", "beta", "mean", "var"]


def test_default_partition_is_what_fuseops_does():
    assert default_partition(get_workload("conv_bn_relu", True).graph(True)) == ((0, 1, 2, 3, 4, 5),)
    assert default_partition(get_workload("mlp_gelu", True).graph(True)) == ((0, 1, 2), (3, 4, 5))
    # FuseOps does not fuse the transpose of k into the matmul (an injective prologue)
    assert default_partition(get_workload("attention", True).graph(True)) == ((0,), (1, 2), (3,), (4,))


def test_duplicate_relax_names_get_unique_op_names():
    g = get_workload("resnet_block", True).graph(True)
    names = [op.name for op in g.ops]
    assert len(set(names)) == len(names)
    g.dag()  # validates topological order of preds
