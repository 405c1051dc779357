"""Element casts (gpu/cast.h) against independent oracles: torch's
``.to(dtype)`` for every pair of float32, bfloat16, float16, float64,
float8_e4m3fn and float8_e5m2, and numpy with ml_dtypes where it agrees.

build/cast_tool converts with the same rs_cast_run the CPU executor uses
(and the same per-element code the CUDA kernels compile).  Inputs: every
16- and 8-bit pattern, and for f32 and f64 sources a few million values:
random bits, random values near every target's range, rounding ties of
every target (exact and one ulp either side, subnormal results included),
and specials.

Compared: exact bits where the oracle's result is not NaN; NaN where it is
NaN.  Two documented rules make the oracle's input differ:

* fp8 targets saturate (past the largest finite value, Inf too, gives
  +-448 or +-57344) where torch and ml_dtypes give NaN or Inf, so the
  oracle converts the input clamped to +-max: the saturating answer.
* f64 narrows through f32, rounding twice, as torch does (checked below);
  numpy rounds f64 to float16 directly, so it is no oracle for f64
  sources except to float32.
"""

import os
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from mcore import needs_mcore, run_py

REPO = Path(__file__).resolve().parents[2]

DTYPES = ["float32", "bfloat16", "float16", "float64", "float8_e4m3fn",
          "float8_e5m2"]
BITS = {"float32": np.uint32, "bfloat16": np.uint16, "float16": np.uint16,
        "float64": np.uint64, "float8_e4m3fn": np.uint8,
        "float8_e5m2": np.uint8}
FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}
PAIRS = [(a, b) for a in DTYPES for b in DTYPES if a != b]
# Mantissa bits each target drops from f32: where its ties are.
CUTS = {"bfloat16": 16, "float16": 13, "float8_e4m3fn": 20,
        "float8_e5m2": 21}


def cast_tool():
    b = os.environ.get("RESHARDFS_BIN")
    tool = Path(b).parent / "cast_tool" if b else REPO / "build" / "cast_tool"
    if not tool.exists():
        pytest.skip(f"cast_tool not found at {tool} (build it: scripts/build)")
    return tool


def is_nan(dtype, v):
    v = v.astype(np.uint64)
    if dtype == "float32":
        return (v & 0x7fffffff) > 0x7f800000
    if dtype == "float64":
        return (v & 0x7fffffffffffffff) > 0x7ff0000000000000
    if dtype == "bfloat16":
        return (v & 0x7fff) > 0x7f80
    if dtype == "float16":
        return (v & 0x7fff) > 0x7c00
    if dtype == "float8_e4m3fn":
        return (v & 0x7f) == 0x7f
    return (v & 0x7f) > 0x7c                   # float8_e5m2


# ------------------------------------------------------------------ inputs

def f32_near(rng, n):
    """Random f32 bits from 2^-30 to 2^20: every target's range and its
    subnormals."""
    u64 = np.uint64
    return ((rng.integers(0, 2, n, dtype=u64) << u64(31)) |
            (rng.integers(127 - 30, 127 + 20, n, dtype=u64) << u64(23)) |
            rng.integers(0, 1 << 23, n, dtype=u64)).astype(np.uint32)


def f32_ties(rng):
    """Exact ties at every cut from 13 to 23 bits (bf16 cuts 16, f16 13,
    fp8 20 and 21; subnormal results cut higher up)."""
    u32 = np.uint32
    ties = []
    for cut in range(13, 24):
        t = f32_near(rng, 60_000)
        ties.append((t & u32(~((1 << cut) - 1) & 0xffffffff)) |
                    u32(1 << (cut - 1)))
    return np.concatenate(ties)


def f32_inputs(rng):
    u32 = np.uint32
    specials = np.array([
        0, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000,
        0x7f800001, 0x7fbfffff, 0xff800001, 0x7fffffff, 1, 0x80000001,
        0x007fffff, 0x00800000, 0x7f7fffff, 0xff7fffff, 0x3f800000,
        0x477fe000, 0x477fefff, 0x477ff000, 0x47800000,      # f16 top
        0x43e00000, 0x43e80000, 0x43f00000, 0x47600000,      # fp8 top
        0x47700000, 0x33000000, 0x33000001, 0x33800000, 0x38800000,
        0x387fe000, 0x3b000000, 0x3a800000, 0x37800000, 0x37000000,
    ], dtype=u32)
    bits = rng.integers(0, 2**32, 1_500_000, dtype=np.uint64).astype(u32)
    ties = f32_ties(rng)
    return np.concatenate([specials, bits, f32_near(rng, 1_000_000),
                           ties, ties + u32(1), ties - u32(1)])


def f64_inputs(rng):
    u64 = np.uint64
    specials = np.array([
        0, 1 << 63, 0x7ff0000000000000, 0xfff0000000000000,
        0x7ff8000000000000, 0xfff8000000000000, 0x7ff0000000000001,
        0x7ff8000020000000, 0x7fefffffffffffff, 1, 0x8000000000000001,
        0x000fffffffffffff, 0x36a0000000000000, 0x3690000000000000,
        0x3690000000000001, 0x47efffffe0000000, 0x47effffff0000000,
        0x47efffffefffffff, 0x3ff0000000000000, 0x7e37e43c8800759c,
        0x3e60000000000000, 0xbe60000000000000,              # 2^-25
        0x40effc0000000000, 0x40effe0000000000,              # f16 top
        0x407c000000000000, 0x40ec000000000000,              # fp8 top
    ], dtype=u64)
    bits = rng.integers(0, 2**64, 500_000, dtype=u64)
    n = 1_000_000
    near = ((rng.integers(0, 2, n, dtype=u64) << u64(63)) |
            (rng.integers(1023 - 160, 1023 + 130, n, dtype=u64) << u64(52)) |
            rng.integers(0, 1 << 52, n, dtype=u64))
    # Ties of the first rounding (to f32), and f32 ties of the second
    # moved one f64 ulp either way: where rounding twice differs from
    # rounding once.
    t = near[:200_000] & u64(~((1 << 29) - 1) & (2**64 - 1)) | u64(1 << 28)
    t2 = f32_ties(rng).view(np.float32).astype(np.float64).view(u64)
    return np.concatenate([specials, bits, near, t, t + u64(1), t - u64(1),
                           t2 + u64(1), t2 - u64(1)])


def all_patterns(dtype):
    return np.arange(2 ** (8 * np.dtype(BITS[dtype]).itemsize),
                     dtype=np.uint64).astype(BITS[dtype])


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """{dtype: bit patterns}, also written to DIR/<dtype>.bin."""
    d = tmp_path_factory.mktemp("cast_in")
    rng = np.random.default_rng(20240611)
    ins = {t: all_patterns(t) for t in DTYPES if t not in
           ("float32", "float64")}
    ins["float32"] = f32_inputs(rng)
    ins["float64"] = f64_inputs(rng)
    for t, v in ins.items():
        v.tofile(d / f"{t}.bin")
    return d, ins


@pytest.fixture(scope="module")
def ours(inputs, tmp_path_factory):
    """{(from, to): cast_tool's result bits}."""
    d, ins = inputs
    tool = cast_tool()
    out = {}
    for a, b in PAIRS:
        with open(d / f"{a}.bin", "rb") as f:
            r = subprocess.run([str(tool), a, b], stdin=f,
                               stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=120)
        assert r.returncode == 0, r.stderr.decode()
        out[a, b] = np.frombuffer(r.stdout, dtype=BITS[b])
        assert len(out[a, b]) == len(ins[a])
    return out


def compare(a, b, src, got, want, oracle):
    nan_got, nan_want = is_nan(b, got), is_nan(b, want)
    bad = np.flatnonzero((nan_got != nan_want) |
                         (~nan_want & (got != want)))
    if len(bad):
        w = 2 * np.dtype(BITS[a]).itemsize
        v = 2 * np.dtype(BITS[b]).itemsize
        lines = [f"{int(src[i]):0{w}x} -> ours {int(got[i]):0{v}x}, "
                 f"{oracle} {int(want[i]):0{v}x}" for i in bad[:8]]
        pytest.fail(f"{a} -> {b}: {len(bad)} of {len(src)} differ from "
                    f"{oracle}:\n" + "\n".join(lines))


# ------------------------------------------------------------------ torch

TORCH_ORACLE = r'''
import sys
from pathlib import Path
import numpy as np
import torch

src, out = Path(sys.argv[1]), Path(sys.argv[2])
DTYPES = ["float32", "bfloat16", "float16", "float64", "float8_e4m3fn",
          "float8_e5m2"]
INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
NP = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}


def load(name):
    t = getattr(torch, name)
    size = torch.empty(0, dtype=t).element_size()
    a = np.fromfile(src / f"{name}.bin", dtype=NP[size])
    return torch.from_numpy(a.view({1: np.uint8, 2: np.int16, 4: np.int32,
                                    8: np.int64}[size])).view(t)


def bits(x):
    return x.view(INT[x.element_size()]).numpy()


for a in DTYPES:
    x = load(a)
    for b in DTYPES:
        if a == b:
            continue
        y = x
        if b in FP8_MAX:
            if a.startswith("float8"):
                y = y.float()           # exact; clamp has no fp8 kernel
            y = y.clamp(-FP8_MAX[b], FP8_MAX[b])
        bits(y.to(getattr(torch, b))).tofile(out / f"{a}-{b}.bin")

# torch narrows f64 through f32 (our rule): the two agree on every input.
x = load("float64")
for b in DTYPES[1:3]:
    direct = bits(x.to(getattr(torch, b)))
    via = bits(x.to(torch.float32).to(getattr(torch, b)))
    nan = np.isnan(x.numpy())
    print(b, "f64 via f32 differs at", int(((direct != via) & ~nan).sum()))
'''


@pytest.fixture(scope="module")
def torch_results(inputs, tmp_path_factory):
    d, _ = inputs
    out = tmp_path_factory.mktemp("cast_torch")
    log = run_py("-c", TORCH_ORACLE, d, out)
    return out, log


@needs_mcore
def test_torch_narrows_f64_through_f32(torch_results):
    """The rule we copy: torch's f64 -> bf16/f16 equals f64 -> f32 -> ..."""
    _, log = torch_results
    lines = [ln for ln in log.splitlines() if "f64 via f32" in ln]
    assert len(lines) == 2, log
    for ln in lines:
        assert ln.endswith(" 0"), log


@needs_mcore
@pytest.mark.parametrize("a,b", PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_against_torch(a, b, inputs, ours, torch_results):
    _, ins = inputs
    out, _ = torch_results
    want = np.fromfile(out / f"{a}-{b}.bin", dtype=BITS[b])
    compare(a, b, ins[a], ours[a, b], want, "torch")


# ------------------------------------------------------- numpy, ml_dtypes

NUMPY = {"float32": np.float32, "float64": np.float64,
         "float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
         "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
         "float8_e5m2": ml_dtypes.float8_e5m2}
# f64 sources: numpy rounds f64 -> f16 (and ml_dtypes may) directly.
NUMPY_PAIRS = [(a, b) for a, b in PAIRS
               if a != "float64" or b == "float32"]


@pytest.mark.parametrize("a,b", NUMPY_PAIRS,
                         ids=[f"{a}-{b}" for a, b in NUMPY_PAIRS])
def test_against_numpy(a, b, inputs, ours):
    _, ins = inputs
    x = ins[a].view(NUMPY[a])
    if b in FP8_MAX:
        x = np.clip(x.astype(np.float32), -FP8_MAX[b], FP8_MAX[b])
    with np.errstate(all="ignore"):
        want = x.astype(NUMPY[b]).view(BITS[b])
    compare(a, b, ins[a], ours[a, b], want, "numpy")
