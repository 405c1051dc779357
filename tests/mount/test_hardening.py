"""Hostile inputs the newer formats must refuse with one line naming the
file, not mount or hang on (the cases of an attack corpus, issue 14):
big-endian torch.save files, expanded (stride-0) tensors, FIFOs where a
file is read, floats where safetensors takes integers, a tensor named like
the control directory, and the limits on tensors and metadata.

Oracles: the reference loaders refuse these too (torch.load byteswaps a
big-endian file, safetensors refuses float offsets), and what reshardfs
mounts is read back with the real library.
"""

import json
import os
import shutil
import struct
import zipfile

import numpy as np
import pytest
from safetensors.numpy import save_file

from mcore import needs_mcore, run_py
from test_bad_input import assert_refused

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
WRITER = os.path.join(REPO, "scripts", "make_legacy_checkpoint.py")
RANK = "mp_rank_00/model_optim_rng.pt"


def raw_safetensors(path, header, data):
    """A safetensors file with `header` (a dict, or JSON text) as given."""
    text = header if isinstance(header, str) else json.dumps(header)
    text = text.encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


# ------------------------------------------------------------ safetensors

@pytest.mark.parametrize("header,needle", [
    ('{"a": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}}',
     "(2.0) is not an integer literal"),
    ('{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8e0]}}',
     "(8e0) is not an integer literal"),
    ('{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0.0, 8]}}',
     "(0.0) is not an integer literal"),
])
def test_safetensors_float_numbers_refused(tmp_path, failing_mount, header,
                                           needle):
    src = tmp_path / "st"
    src.mkdir()
    raw_safetensors(src / "model.safetensors", header, bytes(8))
    rc, err = failing_mount(src, ["tp=1"])
    assert_refused(rc, err, "model.safetensors: header:", needle)


def test_safetensors_float_in_metadata_string_is_text(tmp_path, mount):
    """3.0 inside a string is text, not a number: mounted, read back."""
    src = tmp_path / "st"
    src.mkdir()
    save_file({"a": np.arange(4, dtype=np.float32)},
              str(src / "model.safetensors"), metadata={"lr": "3.0e-4"})
    m = mount(src, ["tp=1"])
    from safetensors import safe_open
    with safe_open(str(m.mnt / "model.safetensors"), "np") as f:
        assert f.metadata()["lr"] == "3.0e-4"
        assert np.array_equal(f.get_tensor("a"), np.arange(4, dtype=np.float32))


def test_tensor_named_like_control_directory(tmp_path, failing_mount):
    src = tmp_path / "st"
    src.mkdir()
    save_file({".reshardfs": np.zeros(4, np.float32),
               "b": np.ones(4, np.float32)}, str(src / "model.safetensors"))
    rc, err = failing_mount(src, ["tp=1", "format=zarr"])
    assert_refused(rc, err, str(src), 'would hold ".reshardfs"',
                   "control directory")


def test_max_tensors(tmp_path, failing_mount, mount):
    src = tmp_path / "many"
    src.mkdir()
    save_file({f"t{i}": np.zeros(2, np.float32) for i in range(20)},
              str(src / "model.safetensors"))
    rc, err = failing_mount(src, ["tp=1", "max_tensors=10"])
    assert_refused(rc, err, "model.safetensors: header lists 20 tensors",
                   "-o max_tensors=N raises the limit")
    m = mount(src, ["tp=1", "max_tensors=20"])
    from safetensors import safe_open
    with safe_open(str(m.mnt / "model.safetensors"), "np") as f:
        assert sorted(f.keys()) == sorted(f"t{i}" for i in range(20))


def test_max_metadata_across_files(tmp_path, failing_mount):
    """Each header is small enough alone; together they pass the limit."""
    src = tmp_path / "big_headers"
    src.mkdir()
    for i in range(3):
        save_file({f"t{i}": np.zeros(2, np.float32)},
                  str(src / f"part{i}.safetensors"),
                  metadata={"pad": "x" * (500 << 10)})
    rc, err = failing_mount(src, ["tp=1", "max_metadata=1M"])
    assert_refused(rc, err, ".safetensors: the checkpoint's metadata",
                   "-o max_metadata=SIZE raises the limit")


# ------------------------------------------------------------ FIFOs

@pytest.mark.parametrize("option", ["rules", "params"])
def test_option_file_fifo_refused(sample, tmp_path, failing_mount, option):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    rc, err = failing_mount(sample(2), ["tp=2", f"{option}={fifo}"],
                            timeout=20)
    assert_refused(rc, err, f"-o {option}={fifo}: must be a regular file")


@pytest.mark.parametrize("name", ["metadata.json",
                                  "latest_checkpointed_iteration.txt"])
def test_metadata_fifo_refused(tmp_path, failing_mount, name):
    src = tmp_path / "fifo_src"
    src.mkdir()
    os.mkfifo(src / name)
    rc, err = failing_mount(src, ["tp=1"], timeout=20)
    assert_refused(rc, err, f"{src}/{name}", "not a regular file")


# ------------------------------------------------------------ torch.save

EDIT = r'''
import sys, torch
import torch.utils.cpp_extension as _ext
_ext.load_inline = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no JIT"))
for path, what in zip(sys.argv[1::2], sys.argv[2::2]):
    sd = torch.load(path, weights_only=False)
    enc = sd["model"]["language_model"]["encoder"]
    if what == "expanded":
        k = "layers.0.input_norm.weight"
        enc[k] = torch.ones(1, dtype=enc[k].dtype).expand(enc[k].shape)
    elif what == "nested":
        deep = []
        for _ in range(150):
            deep = [deep]
        sd["args"].evil = deep
    elif what == "padded":
        sd["args"].notes = "x" * (1536 << 10)
    torch.save(sd, path)
'''


def big_endian(path):
    """The zip as torch.save on a big-endian machine would label it (only
    the byteorder record changes; torch.load would byteswap the data)."""
    tmp = path.with_suffix(".tmp")
    with zipfile.ZipFile(path) as zin, \
            zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith("/byteorder"):
                data = b"big"
            zout.writestr(info.filename, data)
    os.replace(tmp, path)


@pytest.fixture(scope="module")
def legacy(tmp_path_factory):
    base = tmp_path_factory.mktemp("hardening")
    out = base / "tp1"
    run_py(WRITER, out, "--tp", 1, "--iter-dir")
    return out


@needs_mcore
@pytest.mark.parametrize("what,needles", [
    ("big", [RANK, "byteorder \"big\": only little-endian torch.save files"]),
    ("expanded", [RANK, "layers.0.input_norm.weight",
                  "repeats stored elements"]),
])
def test_torch_save_refused(legacy, tmp_path, failing_mount, what, needles):
    src = tmp_path / what
    shutil.copytree(legacy, src)
    if what == "big":
        big_endian(src / RANK)
    else:
        run_py("-c", EDIT, src / RANK, what)
    rc, err = failing_mount(src, ["tp=1"])
    assert_refused(rc, err, *needles)


@needs_mcore
def test_max_metadata_counts_rank_pickles(legacy, tmp_path, failing_mount,
                                          mount):
    """A rank file's data.pkl counts against max_metadata like a header."""
    src = tmp_path / "padded"
    shutil.copytree(legacy, src)
    run_py("-c", EDIT, src / RANK, "padded")
    rc, err = failing_mount(src, ["tp=1", "max_metadata=1M"])
    assert_refused(rc, err, f"{src}/{RANK}: the checkpoint's metadata",
                   "-o max_metadata=SIZE raises the limit")
    m = mount(src, ["tp=1", "max_metadata=2M"])
    assert (m.mnt / RANK).stat().st_size > 0


@needs_mcore
def test_view_refusal_names_the_rank_file(legacy, tmp_path, failing_mount):
    """args the megatron view cannot write back are refused naming the
    rank file they come from, not the checkpoint directory."""
    src = tmp_path / "nested"
    shutil.copytree(legacy, src)
    run_py("-c", EDIT, src / RANK, "nested")
    rc, err = failing_mount(src, ["tp=1", "format=megatron"])
    assert_refused(rc, err, f"{src}/{RANK}: args.evil:", "nested deeper")
