"""An exported model library vs onnxruntime: same output on random inputs, and latency side by side.

    .venv/bin/python -m autofuse export tests/models/resnet18.onnx --db sqlite:///DB -o /tmp/resnet18.so
    .venv/bin/python benchmarks/check_export.py tests/models/resnet18.onnx /tmp/resnet18.so

Loads the library with ``autofuse.deploy.load_library`` (what a deployment does), checks
it against the model's reference output (onnxruntime) within the model's tolerance, then
times both interleaved: ``--rounds`` rounds of ``--repeats`` calls each after a warm-up,
onnxruntime with as many threads as TVM uses (the bench's session settings).  Prints the median per round (ms).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnx

from autofuse import deploy
from autofuse.onnx_import import model_spec
from autofuse.peers import onnxruntime_session
from autofuse.target import num_threads
from autofuse.workload import get_workload


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("library")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=50)
    args = ap.parse_args()
    w = get_workload(model_spec(args.model))
    acts, expected = w.check_data()
    model = deploy.load_library(args.library)
    out = model(**acts)
    err = float(np.max(np.abs(out - expected)) / (np.max(np.abs(expected)) or 1.0))
    ok = bool(np.all(np.abs(out - expected) <= w.space.atol + w.space.rtol * np.abs(expected)))
    print(f"{args.library}: output {'matches' if ok else 'DOES NOT match'} onnxruntime "
          f"(max error {err:.2e} of the output's range)")
    if not ok:
        raise SystemExit(1)
    sess = onnxruntime_session(onnx.load(args.model), num_threads())
    feeds = {k: np.asarray(v, np.float32) for k, v in acts.items()}
    runs = {"autofuse library": lambda: model(**acts), "onnxruntime": lambda: sess.run(None, feeds)}
    for fn in runs.values():  # warm-up
        for _ in range(5):
            fn()
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.rounds):
        for name, fn in runs.items():
            times[name].append(_median_ms(fn, args.repeats))
    for name, ts in times.items():
        print(f"{name:18s} " + " ".join(f"{t:.3f}" for t in ts) + " ms (median per round)")


if __name__ == "__main__":
    main()
