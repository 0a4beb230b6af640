"""An exported model library vs onnxruntime: same output on random inputs, and latency side by side.

    .venv/bin/python -m autofuse export tests/models/resnet18.onnx --db sqlite:///DB -o /tmp/resnet18.so
    .venv/bin/python benchmarks/check_export.py tests/models/resnet18.onnx /tmp/resnet18.so

Loads the library with ``autofuse.deploy.load_library`` (what a deployment does), checks
it against the model's reference output (onnxruntime) within the model's tolerance, then
times, interleaved, ``--rounds`` rounds of ``--repeats`` calls each after a warm-up: the
library called from Python (``model(**inputs)``: NumPy in, NumPy out), the same kernels
timed by TVM's ``time_evaluator`` (what ``bench`` measures), and onnxruntime with as many
threads as TVM uses (the bench's session settings).  Prints the median per round (ms).
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
        res = fn()
        ms = (time.perf_counter() - t0) * 1e3
        if hasattr(res, "results"):  # a TVM time_evaluator result: its own per-call time, in seconds
            ms = float(res.results[0]) * 1e3
        times.append(ms)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("library")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=30)
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
    ref = w.space.reference  # the model with the weights the workload uses (test models ship without them)
    sess = onnxruntime_session(onnx.load_from_string(ref.model_bytes), num_threads())
    feeds = {o: np.asarray(acts[r], np.float32) for r, o in ref.relax_to_onnx.items()}
    runs = {"autofuse library": lambda: model(**acts), "onnxruntime": lambda: sess.run(None, feeds)}
    if not model.runtime_param_names:  # the kernels alone, timed by TVM (no Python call, no copies)
        import tvm

        tensors = [tvm.runtime.tensor(np.asarray(acts[n], np.float32), model.device) for n in model.input_names]
        timer = model.vm.time_evaluator("main", model.device, number=10, repeat=1, min_repeat_ms=20)
        runs["  (TVM time_evaluator)"] = lambda: timer(*tensors)
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
