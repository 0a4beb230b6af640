"""The bundled search spaces: names, exact input signatures, and tiny-variant correctness."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from autofuse.relax_module import space_to_relax
from autofuse.space import Space, SpaceError, load_space, space_names


def _bn(prefix: str, c: int) -> list[tuple[str, tuple[int, ...]]]:
    return [(f"{prefix}_{p}", (c,)) for p in ("gamma", "beta", "mean", "var")]


# name -> (activations, params, output shape) of the FULL variant, in order.
EXPECTED: dict[str, tuple[list, list, tuple[int, ...]]] = {
    "mlp_gelu": (
        [("x", (128, 768))],
        [("w1", (3072, 768)), ("b1", (3072,)), ("w2", (768, 3072)), ("b2", (768,))],
        (128, 768),
    ),
    "conv_bn_relu": (
        [("x", (1, 64, 56, 56))],
        [("w", (64, 64, 3, 3)), ("gamma", (64,)), ("beta", (64,)), ("mean", (64,)), ("var", (64,))],
        (1, 64, 56, 56),
    ),
    "ew_chain": (
        [("a", (1024, 4096)), ("b", (1024, 4096)), ("c", (1024, 4096)), ("d", (1024, 4096))],
        [],
        (1024, 4096),
    ),
    "layernorm_residual": (
        [("x", (512, 768)), ("r", (512, 768))],
        [("gamma", (768,)), ("beta", (768,))],
        (512, 768),
    ),
    "attention": (
        [("q", (12, 128, 64)), ("k", (12, 128, 64)), ("v", (12, 128, 64))],
        [],
        (12, 128, 64),
    ),
    "resnet_block": (
        [("x", (1, 64, 56, 56))],
        [("w1", (64, 64, 3, 3)), *_bn("bn1", 64), ("w2", (64, 64, 3, 3)), *_bn("bn2", 64)],
        (1, 64, 56, 56),
    ),
    "gemm_bn": (
        [("x", (256, 1024))],
        [("w", (1024, 1024)), ("b", (1024,)), ("gamma", (1024,)), ("beta", (1024,)),
         ("mean", (1024,)), ("var", (1024,))],
        (256, 1024),
    ),
    "mobilenet_block": (
        [("x", (1, 32, 112, 112))],
        [("dw", (32, 1, 3, 3)), *_bn("bn1", 32), ("pw", (64, 32, 1, 1)), *_bn("bn2", 64)],
        (1, 64, 112, 112),
    ),
}
NAMES = sorted(EXPECTED)
VAR_NAMES = {"var", "bn1_var", "bn2_var"}


@pytest.fixture(autouse=True)
def _fresh_cache():
    load_space.cache_clear()
    yield
    load_space.cache_clear()


def _sig(tensors) -> list[tuple[str, tuple[int, ...]]]:
    return [(t.name, tuple(t.shape)) for t in tensors]


def _shape(sinfo) -> tuple[int, ...]:
    return tuple(int(d) for d in sinfo.shape)


def _op_names(mod: tvm.IRModule) -> list[str]:
    out = []
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            v = b.value
            out.append(v.op.name if isinstance(v, relax.Call) else type(v).__name__)
    return out


def test_all_bundled_spaces_present():
    assert set(NAMES) <= set(space_names())


@pytest.mark.parametrize("name", NAMES)
def test_full_variant_signature(name):
    acts, params, out_shape = EXPECTED[name]
    space = load_space(name)
    assert isinstance(space, Space)
    assert space.name == name
    assert space.description and "\n" not in space.description
    assert _sig(space.activations) == acts
    assert _sig(space.params) == params
    assert all(t.dtype == "float32" for t in space.inputs)
    for t in space.params:
        if t.name in VAR_NAMES:
            assert t.init == "positive", t.name
    mod = space_to_relax(space)  # built, not run
    main = mod["main"]
    assert [p.name for p in main.params] == [n for n, _ in acts + params]
    assert [_shape(p.ty) for p in main.params] == [s for _, s in acts + params]
    assert _shape(main.ret_ty) == out_shape
    assert main.ret_ty.dtype == "float32"


@pytest.mark.parametrize("name", NAMES)
def test_tiny_variant_is_same_graph(name):
    full, tiny = load_space(name), load_space(name, tiny=True)
    assert [t.name for t in tiny.activations] == [t.name for t in full.activations]
    assert [t.name for t in tiny.params] == [t.name for t in full.params]
    assert [len(t.shape) for t in tiny.inputs] == [len(t.shape) for t in full.inputs]
    assert all(int(np.prod(t.shape)) <= 64 * 64 for t in tiny.inputs)
    assert _op_names(space_to_relax(tiny)) == _op_names(space_to_relax(full))


@pytest.mark.parametrize("name", NAMES)
def test_tiny_variant_matches_reference(name):
    space = load_space(name, tiny=True)
    arrays = {**space.random_activations(), **space.default_params()}
    assert list(arrays) == [t.name for t in space.inputs]
    ex = tvm.compile(space_to_relax(space), tvm.target.Target({"kind": "llvm"}))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(arrays[t.name]) for t in space.inputs]).numpy()
    ref = space.reference(**arrays)
    assert ref.dtype == np.float32 and out.shape == ref.shape
    assert np.isfinite(out).all()
    assert np.any(out != 0)
    np.testing.assert_allclose(out, ref, rtol=space.rtol, atol=space.atol)


def test_unknown_space_lists_known_ones():
    with pytest.raises(SpaceError) as ei:
        load_space("no_such_space")
    msg = str(ei.value)
    assert "no_such_space" in msg
    for name in NAMES:
        assert name in msg


USER_SPACE = '''
import numpy as np
from tvm import relax
from autofuse.space import Space, Tensor


def define(tiny: bool = False) -> Space:
    n = 8 if tiny else 64
    return Space(
        name="my_scale_add",
        description="user space: x * s + x",
        activations=(Tensor("x", (n, n)),),
        params=(Tensor("s", (n,), init="positive"),),
        forward=lambda x, s: relax.op.add(relax.op.multiply(x, s), x),
        reference=lambda x, s: (x.astype(np.float64) * s + x).astype(np.float32),
    )
'''


def test_user_space_dir_from_env(tmp_path, monkeypatch):
    (tmp_path / "my_scale_add.py").write_text(USER_SPACE)
    (tmp_path / "_helper.py").write_text("raise RuntimeError('private files are not spaces')\n")
    monkeypatch.setenv("AUTOFUSE_SPACES", str(tmp_path))
    load_space.cache_clear()
    names = space_names()
    assert "my_scale_add" in names and "_helper" not in names
    assert set(NAMES) <= set(names)  # bundled spaces stay visible
    space = load_space("my_scale_add", tiny=True)
    assert _sig(space.inputs) == [("x", (8, 8)), ("s", (8,))]
    arrays = {**space.random_activations(), **space.default_params()}
    ex = tvm.compile(space_to_relax(space), tvm.target.Target({"kind": "llvm"}))
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(arrays[t.name]) for t in space.inputs])
    np.testing.assert_allclose(out.numpy(), space.reference(**arrays), rtol=space.rtol, atol=space.atol)

    monkeypatch.delenv("AUTOFUSE_SPACES")
    load_space.cache_clear()
    with pytest.raises(SpaceError, match="my_scale_add"):
        load_space("my_scale_add")
