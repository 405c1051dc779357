"""dtype views (-o dtype=) and the executor options, through the mount.

Every floating-point tensor is shown converted; the oracles are numpy's
float16 and ml_dtypes' bfloat16 conversions (round to nearest even, as the
daemon's), applied to the arrays the numpy model (oracle.py) and torch's
DCP reader (dcp_dump.py) give for the source.  Bits must match exactly,
except that a NaN only has to stay a NaN (NaN payloads differ between
libraries).  Sources with every special value - NaN, Inf, subnormals,
rounding ties - are written by hand; fp8 sources are written by torch's
own DCP writer.  The CPU executor builds every block here; the same
conversions on a GPU are checked by scripts/gpu_check.
"""

import json
import os

import ml_dtypes
import numpy as np
import pytest
import zarr

from conftest import bytes_delivered
from mcore import needs_mcore, run_py
from oracle import ExpectedView
from test_bad_input import assert_refused
from test_torch_dist import dcp_oracle

FLOAT = {"<f4": np.float32, "bfloat16": ml_dtypes.bfloat16,
         "<f2": np.float16, "<f8": np.float64}
OPTION = {"bf16": ("bfloat16", ml_dtypes.bfloat16),
          "f16": ("<f2", np.float16), "f32": ("<f4", np.float32)}
RAW = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def convert(raw, src_type, dst_type):
    """Raw source bits -> raw bits of the converted values."""
    with np.errstate(all="ignore"):     # overflow to Inf is the point
        vals = raw.view(src_type).astype(dst_type)
    return vals.view(RAW[np.dtype(dst_type).itemsize])


def assert_same_bits(got, want, dst_type, what):
    """Equal bits, but any NaN matches any NaN."""
    assert got.shape == want.shape, what
    with np.errstate(all="ignore"):
        g = got.view(dst_type).astype(np.float64)
        w = want.view(dst_type).astype(np.float64)
    nan = np.isnan(w)
    assert np.array_equal(np.isnan(g), nan), what
    bad = (got != want) & ~nan
    assert not bad.any(), (what, got[bad][:5], want[bad][:5])


def read_zarr_raw(path):
    a = zarr.open(str(path), mode="r")[...]
    return a.view(RAW[a.dtype.itemsize])


def stats(m):
    return json.loads((m.mnt / ".reshardfs" / "stats").read_text())


@pytest.mark.parametrize("opt", ["bf16", "f16", "f32"])
def test_zarr_view_converted(sample, mount, opt):
    """bf16 params and fp32 optimizer state at tp=4, shown as `opt`:
    .zarray names the new dtype, chunk files have its size, every value is
    the oracle's, converted; integer arrays are untouched."""
    zname, dst = OPTION[opt]
    src = sample(2)
    exp = ExpectedView(src, 4)
    m = mount(src, ["tp=4", f"dtype={opt}"])
    converted = 0
    for key in exp.array_keys():
        va = exp.view_array(key)
        sdt = va.src.meta["dtype"]
        meta = json.loads((m.mnt / key / ".zarray").read_bytes())
        want_meta = dict(va.src.meta, shape=va.shape, chunks=va.chunks)
        if sdt in FLOAT:
            want_meta["dtype"] = zname
        assert meta == want_meta, key
        got = read_zarr_raw(m.mnt / key)
        want = exp.full_array(key)
        if sdt in FLOAT:
            want = convert(want, FLOAT[sdt], dst)
            assert_same_bits(got, want, dst, key)
            converted += sdt != zname
        else:
            assert np.array_equal(got, want), key
        itemsize = np.dtype(dst if sdt in FLOAT else RAW[va.src.itemsize]).itemsize
        for name in va.chunk_names():
            assert os.path.getsize(m.mnt / key / name) == \
                int(np.prod(va.chunks)) * itemsize, (key, name)
    assert converted > 0
    st = stats(m)
    assert st["dtype"] == {"bf16": "bfloat16", "f16": "float16",
                           "f32": "float32"}[opt]
    es = st["executor_stats"]
    if st["executor"] == "cuda":      # scripts/gpu_check runs this on a GPU
        assert es["cuda"]["bytes"] > 0 and es["cuda_fallbacks"] == 0
        assert es["choice"]["cast"] == "cuda"
    elif not es["cuda_usable"]:
        assert es["cpu"]["bytes"] > 0 and es["cuda"]["bytes"] == 0
        assert es["choice"]["cast"] == "cpu"
    assert st["source_bytes_read"] <= bytes_delivered(st) * 2 + 65536


def _special_f32():
    """Every f32 special: ties at every rounding point of bf16 and f16,
    subnormals of all three, overflow edges, Inf, NaNs with payloads, -0,
    and random bit patterns."""
    rng = np.random.default_rng(5)
    sp = [0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000,
          0xffc00001, 0x7f800001, 0x7fbfffff, 0x00000001, 0x807fffff,
          0x3f808000, 0x3f818000, 0x3f807fff, 0x3f808001,   # bf16 ties
          0x7f7fffff, 0x7f7f8000, 0x7f7f7fff,                # bf16 overflow
          0x477fe000, 0x477fefff, 0x477ff000, 0x47800000,    # f16 max/overflow
          0x33800000, 0x33000000, 0x33000001, 0x387fc000,    # f16 subnormals
          0x38800000, 0x3f801000, 0x3f803000]                # f16 ties
    bits = np.concatenate([np.array(sp, dtype=np.uint32),
                           rng.integers(0, 2**32, 1 << 18, dtype=np.uint32)])
    return bits


def _write_zarr(root, arrays):
    """A minimal Megatron zarr checkpoint: metadata.json plus one
    uncompressed array directory per item, two chunks each."""
    root.mkdir()
    (root / "metadata.json").write_text(json.dumps(
        {"sharded_backend": "zarr", "sharded_backend_version": 1,
         "common_backend": "torch", "common_backend_version": 1}))
    for name, (zdtype, raw) in arrays.items():
        d = root / name
        d.mkdir()
        half = raw.size // 2
        (d / ".zarray").write_text(json.dumps(
            {"chunks": [half], "compressor": None, "dtype": zdtype,
             "fill_value": None, "filters": None, "order": "C",
             "shape": [raw.size], "zarr_format": 2}, indent=4,
            sort_keys=True))
        raw[:half].tofile(d / "0")
        raw[half:].tofile(d / "1")


@pytest.mark.parametrize("opt", ["bf16", "f16", "f32"])
def test_every_special_value(tmp_path, mount, opt):
    """f32 specials and random patterns, and every one of the 2^16 f16 and
    bf16 bit patterns, converted by the daemon as by numpy/ml_dtypes."""
    f32 = _special_f32()
    all16 = np.arange(1 << 16, dtype=np.uint16)
    src = tmp_path / "specials"
    _write_zarr(src, {"f32": ("<f4", f32), "f16": ("<f2", all16),
                      "bf16": ("bfloat16", all16.copy())})
    zname, dst = OPTION[opt]
    m = mount(src, [f"dtype={opt}"])
    for name, sdt, raw in (("f32", "<f4", f32), ("f16", "<f2", all16),
                           ("bf16", "bfloat16", all16)):
        got = read_zarr_raw(m.mnt / name)
        want = convert(raw, FLOAT[sdt], dst)
        assert_same_bits(got, want, dst, (name, opt))
        assert json.loads((m.mnt / name / ".zarray").read_text())[
            "dtype"] == zname


FP8_DCP = r'''
import sys, numpy as np, torch, torch.distributed.checkpoint as dcp
g = torch.Generator().manual_seed(11)
x = torch.randn(64, 48, generator=g) * 64
sd = {
    "e4": x.clamp(-448, 448).to(torch.float8_e4m3fn),
    "e5": x.to(torch.float8_e5m2),
    "w": torch.randn(32, 16, generator=g),
    "ids": torch.arange(12, dtype=torch.int64),
}
sd["e4"][0, :3] = torch.tensor([float("nan"), 0.0, -0.0]).to(torch.float8_e4m3fn)
dcp.save(sd, checkpoint_id=sys.argv[1], no_dist=True)
np.savez(sys.argv[2], **{k: v.to(torch.float32).numpy() if v.is_floating_point()
                         else v.numpy() for k, v in sd.items()})
'''


@pytest.fixture(scope="module")
def fp8_dcp(tmp_path_factory):
    d = tmp_path_factory.mktemp("fp8")
    run_py("-c", FP8_DCP, d / "ckpt", d / "want.npz")
    return d / "ckpt", dict(np.load(d / "want.npz"))


@needs_mcore
def test_fp8_source_as_f32_zarr(fp8_dcp, mount):
    """torch's fp8 tensors (saved with _rebuild_tensor_v3 over untyped
    storage) read exactly as torch widens them."""
    src, want = fp8_dcp
    m = mount(src, ["format=zarr", "dtype=f32"])
    for key, arr in want.items():
        got = zarr.open(str(m.mnt / key), mode="r")[...]
        assert got.dtype == arr.dtype, key
        assert_same_bits(got.view(RAW[got.dtype.itemsize]),
                         arr.view(RAW[arr.dtype.itemsize]),
                         arr.dtype, key)


@needs_mcore
def test_fp8_source_views(fp8_dcp, mount, failing_mount, tmp_path):
    """Kept as fp8, a torch_dist view of it loads in torch's DCP reader
    bit for bit; converted to bf16 it holds torch's widened values; a zarr
    view without dtype= is refused (zarr v2 has no fp8 spelling)."""
    src, want = fp8_dcp
    direct = dcp_oracle(src, tmp_path / "direct")
    m = mount(src, [])
    got = dcp_oracle(m.mnt, tmp_path / "kept")
    for key in direct:
        assert got[key].dtype == direct[key].dtype, key
        assert np.array_equal(got[key].view(np.uint8),
                              direct[key].view(np.uint8)), key
    m2 = mount(src, ["dtype=bf16"])
    got = dcp_oracle(m2.mnt, tmp_path / "bf16")
    for key, arr in want.items():
        if arr.dtype != np.float32:
            assert np.array_equal(got[key], arr), key
            continue
        bits = got[key].view(np.uint16)    # dcp_dump keeps bf16 as int16
        assert_same_bits(bits, convert(arr.view(np.uint32), np.float32,
                                       ml_dtypes.bfloat16),
                         ml_dtypes.bfloat16, key)
    rc, err = failing_mount(src, ["format=zarr"])
    assert_refused(rc, err, "float8_e4m3fn", "no zarr spelling")


@needs_mcore
def test_torch_dist_view_converted(sample, mount, tmp_path):
    """A zarr source shown as torch_dist at tp=4 in f16: .metadata's
    properties name float16 for float tensors and torch's DCP reader loads
    the oracle's values, converted."""
    src = sample(2)
    exp = ExpectedView(src, 4)
    m = mount(src, ["tp=4", "format=torch_dist", "dtype=f16"])
    got = dcp_oracle(m.mnt, tmp_path)
    for key in exp.array_keys():
        sdt = exp.view_array(key).src.meta["dtype"]
        want = exp.full_array(key)
        g = got[key]
        if sdt in FLOAT:
            assert g.dtype == np.float16, key
            assert_same_bits(g.view(np.uint16),
                             convert(want, FLOAT[sdt], np.float16),
                             np.float16, key)
        else:
            assert np.array_equal(g.view(want.dtype), want), key


# ------------------------------------------------------------ options

@pytest.mark.parametrize("opts,needles", [
    (["dtype=int8"], ("dtype=int8", "bf16, f16 or f32")),
    (["dtype="], ("dtype=", "bf16, f16 or f32")),
    (["executor=gpu"], ("executor=gpu", "auto, cpu or cuda")),
    (["gpus=0,0"], ("gpus=0,0", "distinct")),
    (["gpus=0,1,1", "tp=4"], ("gpus=0,1,1", "distinct")),
    (["gpus=a"], ("gpus=a", "device numbers")),
    (["gpus="], ("gpus=", "device numbers")),
    (["gpu_mem=12Q"], ("gpu_mem=12Q", "size")),
    (["executor=cpu", "gpus=0"], ("gpus", "executor=auto or executor=cuda")),
    (["executor=cpu", "gpu_mem=1G"], ("gpu_mem", "executor=auto")),
    (["threads=0"], ("threads=0", "from 1 to 1024")),
    (["threads=1025"], ("threads=1025", "from 1 to 1024")),
    (["threads=two"], ("threads=two", "integer")),
])
def test_bad_executor_options(sample, failing_mount, opts, needles):
    rc, err = failing_mount(sample(2), opts)
    assert_refused(rc, err, *needles)


def _has_device():
    return os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl")


@pytest.mark.skipif(_has_device(), reason="a GPU is present")
def test_cuda_without_device_refused(sample, failing_mount):
    """executor=cuda with no usable device: the mount fails at once with
    one line saying why (nothing is mounted)."""
    rc, err = failing_mount(sample(2), ["executor=cuda"])
    assert_refused(rc, err, "executor=cuda")


@pytest.mark.skipif(_has_device(), reason="a GPU is present")
def test_auto_without_device_uses_cpu(sample, mount):
    """executor=auto (the default) with no device mounts, builds blocks on
    the CPU, and says why CUDA is not used."""
    src = sample(2)
    exp = ExpectedView(src, 4)
    m = mount(src, ["tp=4", "executor=auto", "gpus=0,1", "dtype=bf16"])
    key = next(k for k in exp.array_keys() if "linear_fc2" in k)
    read_zarr_raw(m.mnt / key)
    es = stats(m)["executor_stats"]
    assert not es["cuda_usable"] and es["cuda_status"] != "ready"
    assert es["cpu"]["jobs"] > 0 and es["cuda"]["jobs"] == 0
