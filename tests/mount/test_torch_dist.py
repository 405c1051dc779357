"""torch_dist (PyTorch DCP) through the mount: torch_dist sources shown as
zarr and as torch_dist at other TPs, and zarr sources shown as torch_dist.

Sources are written by the real writers: megatron-core's
dist_checkpointing.save (torch_dist backend, on CPU over gloo) and torch's
own torch.distributed.checkpoint.save.  The oracle is torch's DCP reader
loading every tensor whole (dcp_dump.py); megatron's loader must also read
the zarr view into a model exactly as it reads the torch_dist source.
"""

import json
import os
from pathlib import Path

import ml_dtypes  # noqa: F401  (numpy's bfloat16 for zarr)
import numpy as np
import pytest
import zarr

from conftest import bytes_delivered
from mcore import SCRIPT, needs_mcore, run_py
from test_bad_input import assert_refused

HERE = Path(__file__).resolve().parent
pytestmark = needs_mcore


def dcp_oracle(src, tmp_path):
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = tmp_path / "oracle.npz"
    run_py(HERE / "dcp_dump.py", src, out)
    return dict(np.load(out))


def view_array(path):
    a = zarr.open(str(path), mode="r")[...]
    return a.view(np.int16) if a.dtype.itemsize == 2 and a.dtype.kind == "V" \
        or str(a.dtype) == "bfloat16" else a


@pytest.fixture(scope="module")
def mcore_dist(tmp_path_factory):
    out = tmp_path_factory.mktemp("mcore_td") / "iter_0000002"
    run_py(SCRIPT, out, "--tp", 2, "--backend", "torch_dist",
           "--with-optimizer")
    return out


PLAIN_DCP = r'''
import sys, torch, torch.distributed.checkpoint as dcp
g = torch.Generator().manual_seed(3)
base = torch.randn(6, 10, generator=g)
sd = {
    "w": torch.randn(8, 12, generator=g),
    "bf": torch.randn(4, 6, generator=g).to(torch.bfloat16),
    "view_t": base.t(),                # non-contiguous (transposed)
    "narrow": base[1:5, 2:7],          # a strided window of a storage
    "scalar": torch.tensor(2.5),
    "ints": torch.arange(10, dtype=torch.int64),
    "empty": torch.zeros((0, 3), dtype=torch.int64),  # an empty storage
}
dcp.save(sd, checkpoint_id=sys.argv[1], no_dist=True)
'''


@pytest.fixture(scope="module")
def plain_dcp(tmp_path_factory):
    out = tmp_path_factory.mktemp("plain_dcp") / "ckpt"
    run_py("-c", PLAIN_DCP, out)
    return out


@pytest.mark.parametrize("tp", [1, 2])
def test_mcore_torch_dist_as_zarr(mcore_dist, mount, tmp_path, tp):
    want = dcp_oracle(mcore_dist, tmp_path)
    m = mount(mcore_dist, [f"tp={tp}", "format=zarr"])
    names = set(os.listdir(m.mnt))
    assert set(want) <= names
    assert "common.pt" in names and ".metadata" not in names
    assert not any(n.endswith(".distcp") for n in names)
    assert json.loads((m.mnt / "metadata.json").read_text())[
        "sharded_backend"] == "zarr"
    for key, arr in want.items():
        got = view_array(m.mnt / key)
        assert got.shape == arr.shape and np.array_equal(got, arr), key
    # ShardedObjects: byte-identical to the source's byte items.
    extra = [p for p in m.mnt.glob("*._extra_state/shard_*.pt")]
    assert extra
    stats = json.loads((m.mnt / ".reshardfs" / "stats").read_text())
    assert stats["format"] == "torch_dist"
    assert stats["source_bytes_read"] <= bytes_delivered(stats) * 1.01 + 65536


def test_megatron_loads_zarr_view_of_torch_dist(mcore_dist, mount, tmp_path):
    m = mount(mcore_dist, ["tp=1", "format=zarr"])
    run_py(SCRIPT, tmp_path / "view", "--tp", 1, "--load-from", m.mnt)
    run_py(SCRIPT, tmp_path / "direct", "--tp", 1, "--load-from", mcore_dist)
    a = dict(np.load(f"{tmp_path}/view.0.npz"))
    b = dict(np.load(f"{tmp_path}/direct.0.npz"))
    assert sorted(a) == sorted(b) and len(b) >= 10
    for key in b:
        assert np.array_equal(a[key], b[key]), key


def test_plain_torch_dcp(plain_dcp, mount, tmp_path):
    """torch's own writer, no metadata.json, strided and 0-d tensors."""
    want = dcp_oracle(plain_dcp, tmp_path)
    m = mount(plain_dcp, ["format=zarr"])
    for key, arr in want.items():
        got = view_array(m.mnt / key)
        assert got.shape == arr.shape and np.array_equal(got, arr), key


# ------------------------------------------------------- torch_dist views

def test_plain_torch_dcp_as_torch_dist(plain_dcp, mount, tmp_path):
    """torch's own writer shown as torch_dist: torch's DCP reader loads every
    tensor of the view, the empty one included, equal to the source."""
    want = dcp_oracle(plain_dcp, tmp_path / "src")
    m = mount(plain_dcp, ["format=torch_dist"])
    got = dcp_oracle(m.mnt, tmp_path / "view")
    assert sorted(got) == sorted(want) and "empty" in got
    for key in want:
        assert got[key].shape == want[key].shape, key
        assert np.array_equal(got[key], want[key]), key


def _meta_json(mnt):
    return json.loads((mnt / "metadata.json").read_text())["sharded_backend"]


@pytest.mark.parametrize("tp", [1, 2])
def test_torch_dist_view_of_torch_dist(mcore_dist, mount, tmp_path, tp):
    """The default view of a torch_dist source is torch_dist: torch's own
    FileSystemReader loads every tensor of it, equal to the source."""
    want = dcp_oracle(mcore_dist, tmp_path / "src")
    m = mount(mcore_dist, [f"tp={tp}"])
    names = set(os.listdir(m.mnt))
    assert names == {".metadata", "common.pt", "metadata.json"} | \
        {f"__{r}_0.distcp" for r in range(tp)}
    assert _meta_json(m.mnt) == "torch_dist"
    got = dcp_oracle(m.mnt, tmp_path / "view")
    assert sorted(got) == sorted(want)
    for key in want:
        assert np.array_equal(got[key], want[key]), key


def test_torch_dist_view_of_zarr(sample, mount, tmp_path):
    """A zarr sample (bf16 params, fp32 states, gated fc1, padded vocab)
    shown as torch_dist at tp=4, vocab re-padded: torch's DCP reader must
    read exactly the oracle's arrays."""
    from oracle import ExpectedView
    src = sample(2)
    exp = ExpectedView(src, 4)
    m = mount(src, ["tp=4", "format=torch_dist"])
    assert _meta_json(m.mnt) == "torch_dist"
    got = dcp_oracle(m.mnt, tmp_path)
    assert sorted(got) == sorted(exp.array_keys())
    for key in exp.array_keys():
        want = exp.full_array(key)
        g = got[key]
        assert g.shape == want.shape, key
        assert np.array_equal(g.view(want.dtype) if g.dtype != want.dtype
                              else g, want), key


@pytest.mark.parametrize("backend,tp", [("zarr", 1), ("zarr", 4),
                                        ("torch_dist", 4)])
def test_megatron_loads_torch_dist_view(mount, tmp_path, tmp_path_factory,
                                        backend, tp):
    """Megatron saves at tp=2 in either backend; through a torch_dist view
    at another TP its default loader (dist_checkpointing.load) gets, on
    every rank, what it gets when it reshards the source itself.  From zarr,
    ShardedObjects are re-wrapped as torch_dist stores them."""
    src = tmp_path_factory.mktemp(f"mc_{backend}") / "iter_0000003"
    run_py(SCRIPT, src, "--tp", 2, "--backend", backend, "--with-optimizer")
    m = mount(src, [f"tp={tp}", "format=torch_dist"])
    run_py(SCRIPT, tmp_path / "view", "--tp", tp, "--load-from", m.mnt)
    run_py(SCRIPT, tmp_path / "direct", "--tp", tp, "--load-from", src)
    for rank in range(tp):
        a = dict(np.load(f"{tmp_path}/view.{rank}.npz"))
        b = dict(np.load(f"{tmp_path}/direct.{rank}.npz"))
        assert sorted(a) == sorted(b) and len(b) >= 10
        for key in b:
            assert np.array_equal(a[key], b[key]), (rank, key)


# ---------------------------------------------------------- hostile input

def _copy(src, dst):
    dst.mkdir()
    for p in src.iterdir():
        (dst / p.name).write_bytes(p.read_bytes())
    return dst


def _rewrite_metadata(ck, edit):
    """Unpickles .metadata with stand-in classes, edits, pickles back."""
    code = r'''
import pickle, sys
import torch.utils.cpp_extension as c
c.load_inline = lambda *a, **k: (_ for _ in ()).throw(RuntimeError())
md = pickle.load(open(sys.argv[1], "rb"))
items = list(md.storage_data.items())
''' + edit + r'''
pickle.dump(md, open(sys.argv[1], "wb"))
'''
    run_py("-c", code, ck / ".metadata")


@pytest.mark.parametrize("prefix", ["../", "sub/", "/tmp/"])
def test_relative_path_escape(mcore_dist, failing_mount, tmp_path, prefix):
    ck = _copy(mcore_dist, tmp_path / "ck")
    _rewrite_metadata(ck, f"items[3][1].relative_path = {prefix!r} + "
                          "items[3][1].relative_path")
    rc, err = failing_mount(ck, ["tp=1"])
    assert_refused(rc, err, ".metadata", prefix)


def test_item_past_end_of_file(mcore_dist, failing_mount, tmp_path):
    ck = _copy(mcore_dist, tmp_path / "ck")
    _rewrite_metadata(ck, "items[5][1].offset = 10**9")
    rc, err = failing_mount(ck, ["tp=1"])
    assert_refused(rc, err, ".distcp", "past the end")


def test_unknown_global(mcore_dist, failing_mount, tmp_path):
    """A reference to a callable outside the allowlist (here os.system,
    pickled as posix.system) is refused by name, never resolved."""
    ck = _copy(mcore_dist, tmp_path / "ck")
    _rewrite_metadata(ck, "import os; md.planner_data = os.system")
    rc, err = failing_mount(ck, ["tp=1"])
    assert_refused(rc, err, ".metadata", "system")


def test_flattened_range_misfit_refused(mcore_dist, failing_mount, tmp_path):
    """A flattened_range shape in mcore_data that the stored tensor is no
    reformulation of: refused, not served as some other cut."""
    ck = _copy(mcore_dist, tmp_path / "ck")
    key = "decoder.layers.mlp.linear_fc1.weight"
    _rewrite_metadata(ck, "md.mcore_data = {%r: "
                          "{'nd_reformulated_orig_global_shape': (2, 3)}}" % key)
    rc, err = failing_mount(ck, ["tp=1"])
    assert_refused(rc, err, ".metadata", key, "flattened_range", "is not cut into")


def test_truncated_distcp(mcore_dist, failing_mount, tmp_path):
    ck = _copy(mcore_dist, tmp_path / "ck")
    victim = sorted(ck.glob("*.distcp"))[0]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    rc, err = failing_mount(ck, ["tp=1"])
    assert_refused(rc, err, victim.name)
