"""Export the ONNX test models under tests/models/ (ResNet-18, MobileNetV3-small, a Transformer encoder layer).

Needs torch + torchvision, which are NOT dependencies of autofuse; run it from a throwaway venv:

    python3.11 -m venv /tmp/tv-venv
    /tmp/tv-venv/bin/pip install torch==2.14.1 torchvision==0.29.1 onnx
    /tmp/tv-venv/bin/python benchmarks/make_test_models.py [--out tests/models]

The models come from real model code (torchvision.models, torch.nn.TransformerEncoderLayer),
exported with the legacy TorchScript exporter (opset 17), static shapes.  The weights are then
*stripped* to keep the committed files small: every initializer keeps its name, dtype and dims
but loses its data, and the model's metadata says so (``autofuse.stripped_weights``).
``autofuse.onnx_import`` regenerates deterministic seeded weights for such a model on load
(BatchNorm variances positive), so the committed files still import, run and tune.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import onnx
import torch
import torchvision

# name -> (module factory, example input shape, constant folding)
# CNNs are exported without constant folding so that BatchNormalization stays a node (folding merges it
# into the Conv weights); the encoder layer with it (it folds the shape arithmetic).
MODELS = {
    "resnet18": (lambda: torchvision.models.resnet18(weights=None), (1, 3, 64, 64), False),
    "mobilenet_v3_small": (lambda: torchvision.models.mobilenet_v3_small(weights=None), (1, 3, 64, 64), False),
    "transformer_encoder": (lambda: _EncoderLayer(), (1, 16, 128), True),
}


class _EncoderLayer(torch.nn.Module):
    """torch.nn.TransformerEncoderLayer called with an explicit ``is_causal=False`` (the legacy
    tracer otherwise passes it on as a Tensor and F.scaled_dot_product_attention rejects that)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=256, dropout=0.0,
                                                      batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x, is_causal=False)


def _fill_recipes(model: onnx.ModelProto) -> dict[str, str]:
    """How to regenerate each initializer: BatchNorm/LayerNorm scales and variances positive, weights
    He-scaled normal, biases/means small normal (followed through Identity nodes)."""
    alias = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "Identity"}

    def src(name: str) -> str:
        while name in alias:
            name = alias[name]
        return name

    recipes: dict[str, str] = {}
    for n in model.graph.node:
        if n.op_type == "BatchNormalization":
            for i, r in zip(n.input[1:5], ("uniform:0.5:1.5", "normal:0.1", "normal:0.1", "uniform:0.5:1.5")):
                recipes[src(i)] = r
        elif n.op_type == "LayerNormalization":
            for i, r in zip(n.input[1:3], ("uniform:0.5:1.5", "normal:0.1")):
                recipes[src(i)] = r
    for init in model.graph.initializer:
        if init.name not in recipes:
            dims = list(init.dims)
            fan = 1
            for d in dims[1:]:
                fan *= d
            recipes[init.name] = f"normal:{(2.0 / fan) ** 0.5:.6g}" if len(dims) >= 2 else "normal:0.1"
    return recipes


def strip_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """Drop initializer data (name, dtype, dims stay; doc_string = the fill recipe); mark the model."""
    recipes = _fill_recipes(model)
    for init in model.graph.initializer:
        n = 1
        for d in init.dims:
            n *= d
        if init.data_type != onnx.TensorProto.FLOAT or n <= 1:
            continue  # int tensors (shapes, axes) and scalars are structure, not weights: keep them
        for f in ("raw_data", "float_data", "int64_data", "int32_data", "double_data"):
            init.ClearField(f)
        init.doc_string = "autofuse:stripped:" + recipes[init.name]
    meta = model.metadata_props.add()
    meta.key, meta.value = "autofuse.stripped_weights", "seeded-random"
    return model


def export(name: str, out: Path) -> Path:
    factory, shape, fold = MODELS[name]
    torch.manual_seed(0)
    m = factory().eval()
    x = torch.randn(*shape)
    path = out / f"{name}.onnx"
    torch.onnx.export(m, (x,), str(path), opset_version=17, input_names=["input"], output_names=["output"],
                      do_constant_folding=fold, dynamo=False)
    model = strip_weights(onnx.load(str(path)))
    model.producer_name = f"{model.producer_name} via autofuse benchmarks/make_test_models.py ({name})"
    onnx.save(model, str(path))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "tests" / "models"))
    ap.add_argument("models", nargs="*", default=list(MODELS))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.models:
        p = export(name, out)
        print(f"{p}: {p.stat().st_size} bytes")


if __name__ == "__main__":
    main()
