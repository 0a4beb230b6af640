"""Targets: canonical dicts for TVM, plus a fingerprint of the host that measured."""

from __future__ import annotations

import json
import os
import platform
from dataclasses import dataclass
from functools import cache
from typing import Any

import tvm


class TargetError(Exception):
    """A target string/JSON that autofuse cannot use."""


@dataclass(frozen=True)
class Target:
    """A TVM target as canonical JSON; ``kind`` is "llvm" or "cuda"."""

    spec_json: str

    @property
    def spec(self) -> dict[str, Any]:
        return json.loads(self.spec_json)

    @property
    def kind(self) -> str:
        return self.spec["kind"]

    @property
    def tag(self) -> str:
        """Kind and CPU/GPU model, e.g. ``llvm-znver4``: names studies per target."""
        model = self.spec.get("mcpu") or self.spec.get("arch") or ""
        return f"{self.kind}-{model}" if model else self.kind

    def tvm(self) -> tvm.target.Target:
        return tvm.target.Target(self.spec)

    def __str__(self) -> str:
        return self.spec_json


@dataclass(frozen=True)
class VectorUnit:
    """A CPU's float32 SIMD width and register count: what a register tile must fit in."""

    lanes: int
    registers: int

    def tile_registers(self, rows: int, cols: int) -> int:
        """Vector registers a ``rows`` x ``cols`` register tile (``cols`` along the vector
        axis) keeps busy in each reduction step: its accumulators, the row of the other
        operand the step loads, and one for the element it broadcasts."""
        vectors = -(-cols // self.lanes)
        return rows * vectors + vectors + 1

    def fits(self, rows: int, cols: int) -> bool:
        """Whether that tile fits the register file (one that does not spills its
        accumulators to the stack on every step: 2-10x slower, NOTES 36)."""
        return self.tile_registers(rows, cols) <= self.registers


def vector_unit(target: Target) -> VectorUnit | None:
    """The vector unit LLVM compiles for on a CPU target (AVX-512: 32 registers of 16 floats;
    AVX2: 16 of 8; NEON: 32 of 4); None for a GPU or a CPU whose features LLVM cannot tell."""
    if target.kind != "llvm":
        return None
    try:
        tvm_target = target.tvm()

        def has(feature: str) -> bool:
            return bool(tvm.target.codegen.target_has_features(feature, tvm_target))

        if has("avx512f"):
            return VectorUnit(16, 32)
        if has("avx2") or has("avx"):
            return VectorUnit(8, 16)
        if has("neon"):
            return VectorUnit(4, 32)
        if has("sse2"):
            return VectorUnit(4, 16)
    except Exception:  # an mtriple this LLVM was not built for
        return None
    return None


@cache
def host_mcpu() -> str:
    """The host CPU name LLVM sees (e.g. znver4)."""
    try:
        return str(tvm.get_global_func("target.llvm_get_system_cpu")())
    except Exception:
        return ""


def num_threads() -> int:
    """Threads TVM kernels use: $TVM_NUM_THREADS, else every core."""
    return int(os.environ.get("TVM_NUM_THREADS") or os.cpu_count() or 1)


def parse_target(text: str | dict[str, Any]) -> Target:
    """``llvm`` / ``cuda`` shorthands or a target JSON object; returns the canonical form."""
    if isinstance(text, dict):
        spec = dict(text)
    else:
        text = text.strip()
        if text == "llvm":
            spec = {"kind": "llvm"}
        elif text == "cuda":
            spec = {"kind": "cuda", "arch": "sm_90"}
        elif text.startswith("{"):
            try:
                spec = json.loads(text)
            except json.JSONDecodeError as e:
                raise TargetError(f"target is not valid JSON: {e}") from e
            if not isinstance(spec, dict):
                raise TargetError("target JSON must be an object like {\"kind\": \"llvm\"}")
        else:
            raise TargetError(f"unknown target {text!r}: use llvm, cuda or a JSON object such as '{{\"kind\":\"cuda\",\"arch\":\"sm_90\"}}'")
    kind = spec.get("kind")
    if kind not in ("llvm", "cuda"):
        raise TargetError(f"target kind {kind!r} is not supported (llvm or cuda)")
    if kind == "llvm":
        spec.setdefault("mcpu", host_mcpu())  # threads are a runtime setting (TVM_NUM_THREADS), not part of the key
        if not spec["mcpu"]:
            del spec["mcpu"]
    else:
        spec.setdefault("arch", "sm_90")
    try:
        tvm.target.Target(spec)
    except Exception as e:
        raise TargetError(f"TVM rejects target {json.dumps(spec)}: {str(e).strip().splitlines()[-1]}") from e
    return Target(json.dumps(spec, sort_keys=True, separators=(",", ":")))


@cache
def host_fingerprint() -> dict[str, Any]:
    """What identifies the measuring machine: CPU model, cores, GPU name if any."""
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    gpu = ""
    try:
        dev = tvm.cuda(0)
        if dev.exist:
            gpu = str(dev.device_name)
    except Exception:
        pass
    return {"cpu": cpu, "cores": os.cpu_count() or 1, "mcpu": host_mcpu(), "gpu": gpu}
