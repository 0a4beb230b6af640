"""Does TVM's thread pool keep a core busy after a parallel kernel, and does onnxruntime,
timed right then, run slower?  (NOTES 53: why the bench waits for quiet threads between
runtimes.)

    TVM_NUM_THREADS=2 python benchmarks/pool_spin.py
    TVM_THREAD_POOL_SPIN_COUNT=0 TVM_NUM_THREADS=2 python benchmarks/pool_spin.py

First the share of a core the process uses while its main thread sleeps right after one
run of a parallel TVM copy (16 MiB); then an onnxruntime MatMul (512x1024 @ 1024x1024, the
bench's session options) timed in 50 ms repeats, six rounds: after itself, right after three
repeats of the TVM copy, and after the copy and a 0.5 s sleep.  Printed: the median and range
of each round's first repeat, and of the later ones."""

import os
import statistics
import time

import numpy as np
from onnx import TensorProto
from onnx import helper as h

from autofuse.bench.columns import cores_busy_while_sleeping, time_python
from autofuse.bench.roofline import copy_kernel
from autofuse.peers import onnxruntime_session
from autofuse.target import num_threads


def main() -> None:
    print("TVM_THREAD_POOL_SPIN_COUNT =", os.environ.get("TVM_THREAD_POOL_SPIN_COUNT", "(TVM's default, 300000)"))
    copy = copy_kernel(4 << 20, num_threads())
    copy.run_s(3, 50)
    for nap in (0.01, 0.05, 0.1, 0.2, 0.5, 1.0):
        shares = []
        for _ in range(3):
            copy.run_s(1, 0)
            shares.append(cores_busy_while_sleeping(nap))
        print(f"sleep {nap:4.2f} s right after a TVM run: cores used {' '.join(f'{v:.2f}' for v in shares)}")
    m, k, n = 512, 1024, 1024
    w = np.random.default_rng(0).standard_normal((k, n)).astype(np.float32)
    graph = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"])], "g",
                         [h.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
                         [h.make_tensor("w", TensorProto.FLOAT, [k, n], w.ravel())])
    sess = onnxruntime_session(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), num_threads())
    x = np.ones((m, k), np.float32)

    def matmul() -> None:
        sess.run(None, {"x": x})

    def tvm_then_sleep() -> None:
        copy.run_s(3, 50)
        time.sleep(0.5)

    before = {"after onnxruntime": lambda: time_python(matmul, 50, 1), "right after TVM": lambda: copy.run_s(3, 50),
              "after TVM and 0.5 s": tvm_then_sleep}
    time_python(matmul, 50, 3)
    rounds: dict[str, list[list[float]]] = {what: [] for what in before}
    for _ in range(6):
        for what, timings in rounds.items():
            before[what]()
            timings.append(time_python(matmul, 50, 3))
    for what, timings in rounds.items():
        first, later = [t[0] for t in timings], [ms for t in timings for ms in t[1:]]
        print(f"onnxruntime {what:20s}: first repeat {statistics.median(first):.3f} ms ({min(first):.3f}-{max(first):.3f}), "
              f"later repeats {statistics.median(later):.3f} ms ({min(later):.3f}-{max(later):.3f})")


if __name__ == "__main__":
    main()
