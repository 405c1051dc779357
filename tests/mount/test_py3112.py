"""Checkpoints written under Debian 12's Python 3.11.2, which pickles Enum
members as getattr(cls, 'name') (docs/FORMATS.md, "torch.save"), and the
other pickle forms real torch.save files carry.

The sources are committed real writer output (tests/mount/data/py3112/,
made by its make_fixtures.py: Python 3.11.2, torch 2.9.1, megatron-core
0.15.3): a legacy Megatron per-rank checkpoint whose args hold enums, a
plain torch DCP checkpoint and an mcore torch_dist one (their .metadata
hold _MEM_FORMAT_ENCODING members), torch.save files under pickle
protocols 1-5, and files holding tensors reshardfs does not read.  Every
view is read back by the real loaders in .venv-mcore (torch.load, also
weights_only=True under megatron-core's safe globals; torch's DCP
FileSystemReader; megatron's dist_checkpointing.load; safetensors) and
compared with torch.load (or DCP's load) of the source, tensor by tensor.
"""
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from mcore import SCRIPT, needs_mcore, run_py
from test_bad_input import assert_refused, error_lines
from test_megatron_legacy import NO_JIT, ROUNDTRIP
from test_torch_dist import dcp_oracle, view_array

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "py3112"
LEGACY = DATA / "legacy_tp2"
ORACLE = DATA / "legacy_tp2.oracle.npz"
CHECK = HERE / "legacy_check.py"
ITER = "iter_0000010"
RANK0 = f"{ITER}/mp_rank_00/model_optim_rng.pt"
pytestmark = needs_mcore


def test_fixtures_hold_the_getattr_form():
    """The reason for these fixtures: each pickle names builtins.getattr
    (as __builtin__ under protocols below 3)."""
    for f in [LEGACY / RANK0, DATA / "dcp" / ".metadata",
              DATA / "mcore_td" / ".metadata"] + \
            sorted((DATA / "torchsave").glob("p*/model_part-0.pt")):
        assert b"getattr" in f.read_bytes(), f


# ------------------------------------------------------------ legacy Megatron

# The enums of args, loaded both ways from the view; the source loads only
# with weights_only=False (torch's safe unpickler allows no getattr).
ENUMS = NO_JIT + r'''
import sys, torch
from megatron.core.enums import ModelType
from megatron.core.safe_globals import SAFE_GLOBALS
from megatron.core.transformer.enums import AttnBackend
src, views = sys.argv[1], sys.argv[2:]
a = torch.load(src, weights_only=False)["args"]
assert a.model_type is ModelType.encoder_or_decoder
assert a.attention_backend is AttnBackend.auto
with torch.serialization.safe_globals(SAFE_GLOBALS):
    try:
        torch.load(src, weights_only=True)
        raise SystemExit("the source loaded with weights_only=True")
    except torch.serialization.pickle.UnpicklingError as e:
        assert "getattr" in str(e), e
    for v in views:
        for wo in (False, True):
            b = torch.load(v, weights_only=wo)["args"]
            assert b.model_type is a.model_type, (v, wo)
            assert b.attention_backend is a.attention_backend, (v, wo)
print("OK")
'''


def check(view, tp, pp, *extra):
    out = run_py(CHECK, view, ORACLE, "--tp", tp, "--pp", pp, "--padded",
                 256, *extra)
    assert "OK" in out.splitlines()[-1], out


def test_legacy_source_matches_oracle():
    """torch.load of the source gives the writer's oracle: the views below
    are compared with the oracle, so with the source."""
    check(LEGACY, 2, 1, "--source")


@pytest.mark.parametrize("tp,pp", [(1, 1), (4, 1), (2, 2)])
def test_legacy_views(mount, tp, pp):
    """Other layouts, loaded with weights_only=False and (with megatron's
    safe globals) weights_only=True: every tensor equals the source's, and
    args hold the source's enum members."""
    m = mount(LEGACY, [f"tp={tp}", f"pp={pp}"])
    check(m.mnt, tp, pp, "--weights-only", "--dtype", "float32")
    views = sorted(str(p) for p in m.mnt.glob(f"{ITER}/mp_rank_*/*.pt"))
    assert len(views) == tp * pp
    for v in views:
        # written as ModelType(1), as Python 3.11.5+ write it
        assert b"getattr" not in Path(v).read_bytes(), v
    assert run_py("-c", ENUMS, LEGACY / RANK0, *views).splitlines()[-1] == "OK"


def test_legacy_same_layout_round_trips(mount):
    """At the source's layout each file holds the source's tensors and args
    (enum members included) as torch.load reads them."""
    m = mount(LEGACY, ["tp=2", "pp=1"])
    pairs = []
    for t in range(2):
        rel = f"{ITER}/mp_rank_{t:02d}/model_optim_rng.pt"
        pairs += [LEGACY / rel, m.mnt / rel]
    assert run_py("-c", ROUNDTRIP, *pairs).splitlines()[-1] == "OK"


# ------------------------------------------------------------ DCP, mcore

# (the plain DCP's byte item `step` is no mcore ShardedObject: no zarr view)
@pytest.mark.parametrize("src,fmt,tp", [("dcp", "torch_dist", 1),
                                        ("mcore_td", "torch_dist", 1),
                                        ("mcore_td", "zarr", 2)])
def test_dcp_views(mount, tmp_path, src, fmt, tp):
    """torch's DCP reader loads the source; the view, read by it again
    (torch_dist) or by zarr-python, holds the same tensors."""
    want = dcp_oracle(DATA / src, tmp_path / "src")
    m = mount(DATA / src, [f"tp={tp}", f"format={fmt}"])
    if fmt == "torch_dist":
        got = dcp_oracle(m.mnt, tmp_path / "view")
    else:
        got = {k: view_array(m.mnt / k) for k in want}
    assert sorted(got) == sorted(want) and len(want) >= 5
    for key in want:
        assert got[key].shape == want[key].shape, key
        assert np.array_equal(got[key], want[key]), key


def test_megatron_loads_view_of_mcore_td(mount, tmp_path):
    """megatron's own loader reads the tp=1 view into a model exactly as
    it reads (and reshards) the 3.11.2 source."""
    m = mount(DATA / "mcore_td", ["tp=1"])
    size = ["--hidden", 16, "--vocab", 100]
    run_py(SCRIPT, tmp_path / "view", "--tp", 1, "--load-from", m.mnt, *size)
    run_py(SCRIPT, tmp_path / "direct", "--tp", 1, "--load-from",
           DATA / "mcore_td", *size)
    a = dict(np.load(f"{tmp_path}/view.0.npz"))
    b = dict(np.load(f"{tmp_path}/direct.0.npz"))
    assert sorted(a) == sorted(b) and len(b) >= 10
    for key in b:
        assert np.array_equal(a[key], b[key]), key


# ------------------------------------------------------------ torch.save forms

# The safetensors view's tensors against torch.load of the source's model:
# same names, dtypes, shapes and bytes (fp8 and bf16 compared as bits).
SAME_TENSORS = r'''
import sys, torch
from safetensors.torch import load_file
src = torch.load(sys.argv[1], weights_only=False)
got = load_file(sys.argv[2])
want = src["model"]
assert sorted(got) == sorted(want), (sorted(got), sorted(want))
for k, w in want.items():
    g, w = got[k], w.detach().contiguous()
    assert g.dtype == w.dtype and g.shape == w.shape, (k, g.dtype, w.dtype)
    assert torch.equal(g.view(torch.uint8), w.view(torch.uint8)), k
cfg = src["cfg"]
assert cfg["args"].arch == "tiny" and cfg["buf"] == bytearray(b"xy")
print("OK", len(want))
'''


@pytest.mark.parametrize("proto", [1, 2, 3, 4, 5])
def test_torch_save_protocols(mount, proto):
    """torch.save(pickle_protocol=N) of tensors as torch writes them
    (strided, bf16, fp8, Parameters with and without attributes, a tensor
    with an attribute, a Buffer) beside a cfg with a Namespace (copyreg
    under protocol 1), an Enum member (getattr), bytes, a bytearray
    (BYTEARRAY8 under 5) and a set, read as a metaseq part."""
    src = DATA / "torchsave" / f"p{proto}"
    raw = (src / "model_part-0.pt").read_bytes()
    if proto == 1:
        assert b"copy_reg\n_reconstructor" in raw
    if proto == 5:
        assert b"\x96\x02\x00\x00\x00\x00\x00\x00\x00xy" in raw  # BYTEARRAY8
    m = mount(src, [])
    out = run_py("-c", SAME_TENSORS, src / "model_part-0.pt",
                 m.mnt / "model.safetensors")
    assert out.splitlines()[-1] == "OK 9", out


# ------------------------------------------------------------ refusals

def assert_one_line(rc, err, *needles):
    """Refused with one problem line (after the summary line that leads
    every refusal, "reshardfs: SOURCE: refused: ...")."""
    assert_refused(rc, err, *needles)
    lines = error_lines(err)
    assert ": refused: " in lines[0] and len(lines) == 2, err


@pytest.mark.parametrize("kind,what", [
    ("quantized", 'model["odd"] is a tensor rebuilt by torch._utils._rebuild_qtensor, which reshardfs does not read'),
    ("sparse", 'model["odd"] is a tensor rebuilt by torch._utils._rebuild_sparse_tensor'),
    ("meta", 'model["odd"] is a tensor rebuilt by torch._utils._rebuild_meta_tensor_no_storage'),
    ("nested", 'model["odd"] is a tensor rebuilt by torch._utils._rebuild_nested_tensor'),
    ("subclass", 'model["odd"] is a tensor subclass (torch.masked.maskedtensor.core.MaskedTensor), which reshardfs does not read'),
    ("legacy_format", "a torch.save file in the legacy format (torch < 1.6, or _use_new_zipfile_serialization=False), which reshardfs does not read; re-save it: python -c \"import torch; torch.save(torch.load('F', weights_only=False), 'F2')\""),
])
def test_refused_tensors(failing_mount, kind, what):
    src = DATA / "refused" / kind
    rc, err = failing_mount(src, [])
    assert_one_line(rc, err, f"{src}/model_part-0.pt: ", what)


def _patched(tmp_path, src, rel, old, new):
    """A copy of the fixture src with bytes `old` of file rel replaced
    (same length, so every length field stays right)."""
    assert len(old) == len(new)
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    data = (dst / rel).read_bytes()
    assert data.count(old) == 1, rel
    (dst / rel).write_bytes(data.replace(old, new))
    return dst


def test_refused_getattr_dunder_in_metadata(tmp_path, failing_mount):
    """getattr(cls, '__subclasses__...') in a real .metadata: one line with
    the file, the offset and the name."""
    ck = _patched(tmp_path, DATA / "dcp", ".metadata",
                  b"TORCH_CONTIGUOUS_FORMAT", b"__subclasses___________")
    rc, err = failing_mount(ck, ["format=zarr"])
    assert_one_line(rc, err, f"{ck}/.metadata: offset ",
                    "getattr(torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING, '__subclasses___________') is not read: the name must be an identifier not starting with '_'")


def test_refused_getattr_dunder_in_args(tmp_path, failing_mount):
    ck = _patched(tmp_path, LEGACY, RANK0, b"encoder_or_decoder",
                  b"__init_subclass___")
    rc, err = failing_mount(ck, ["tp=1"])
    assert_one_line(rc, err, f"{ck}/{RANK0}: data.pkl: offset ",
                    "getattr(megatron.core.enums.ModelType, '__init_subclass___') is not read")
