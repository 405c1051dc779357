"""A Megatron checkpoint root as SOURCE, for every format.

Megatron's --load takes the root: the directory holding
latest_checkpointed_iteration.txt and iter_XXXXXXX/.  Mounted, a root is
shown as a root in the views Megatron loads (zarr, torch_dist, megatron):
the tracker, the root's other files, and the tracked iteration at the new
layout; other iterations are not shown (nor read).  The safetensors view
is the tracked iteration's model alone.

The oracles: megatron-core itself, loading the view through the root the
way Megatron-LM's --load resolves it (scripts/make_mcore_checkpoint.py
resolve_load_dir), against megatron-core loading the stored iteration; and
numpy for the sample checkpoints.
"""

import os
import shutil

import numpy as np
import pytest

from mcore import needs_mcore, run_mcore
from oracle import ExpectedView
from test_bad_input import assert_refused
from test_zarr_view import assert_tree_equals_oracle

TRACKER = "latest_checkpointed_iteration.txt"


def make_root(base, iteration_dir, tracked="100"):
    """base/root with the iteration at iter_0000100, its tracker, a log
    file, and an older iteration that is not a checkpoint at all."""
    root = base / "root"
    root.mkdir()
    shutil.copytree(iteration_dir, root / "iter_0000100", symlinks=True)
    (root / TRACKER).write_text(tracked + "\n")
    (root / "train.log").write_text("step 100\n")
    old = root / "iter_0000050"
    old.mkdir()
    (old / "metadata.json").write_text("not JSON: never read\n")
    return root


@pytest.fixture(scope="module")
def sample_root(sample, tmp_path_factory):
    return make_root(tmp_path_factory.mktemp("root"), sample(2))


def test_zarr_root_shown_as_root(sample, sample_root, mount):
    m = mount(sample_root, ["tp=8"])
    assert sorted(os.listdir(m.mnt)) == sorted(
        [TRACKER, "train.log", "iter_0000100"])
    assert (m.mnt / TRACKER).read_text() == "100\n"
    assert (m.mnt / "train.log").read_text() == "step 100\n"
    assert_tree_equals_oracle(m.mnt / "iter_0000100",
                              ExpectedView(sample(2), 8))


def test_safetensors_view_of_root_is_the_iteration(sample_root, mount):
    m = mount(sample_root, ["tp=2", "format=safetensors"])
    names = sorted(os.listdir(m.mnt))
    assert "model-rank-0-part-0.safetensors" in names
    assert not [n for n in names if n.startswith("iter_") or n == TRACKER]


def test_release_tracker(sample, tmp_path, mount):
    root = tmp_path / "rel"
    root.mkdir()
    shutil.copytree(sample(2), root / "release", symlinks=True)
    (root / TRACKER).write_text("release")
    m = mount(root, ["tp=4"])
    assert sorted(os.listdir(m.mnt)) == sorted([TRACKER, "release"])
    assert_tree_equals_oracle(m.mnt / "release", ExpectedView(sample(2), 4))


def test_root_without_tracker_names_iterations(sample, tmp_path,
                                               failing_mount):
    root = tmp_path / "untracked"
    root.mkdir()
    for it in ("iter_0000100", "iter_0000200"):
        shutil.copytree(sample(2), root / it, symlinks=True)
    rc, err = failing_mount(root, ["tp=4"])
    assert_refused(rc, err, str(root), "iter_0000100, iter_0000200",
                   TRACKER, f"reshardfs {root}/iter_0000200")


@pytest.mark.parametrize("text", ["abc\n", "10\0../x", "-5", "", "1 2"])
def test_bad_tracker_refused(sample, tmp_path, failing_mount, text):
    root = tmp_path / "bad"
    root.mkdir()
    shutil.copytree(sample(2), root / "iter_0000010", symlinks=True)
    (root / TRACKER).write_bytes(text.encode())
    rc, err = failing_mount(root, ["tp=4"])
    assert_refused(rc, err, f"{root}/{TRACKER}",
                   "neither an iteration number nor 'release'")


def test_tracker_names_missing_iteration(sample, tmp_path, failing_mount):
    root = make_root(tmp_path, sample(2), tracked="7")
    rc, err = failing_mount(root, ["tp=4"])
    assert_refused(rc, err, f"{root}/{TRACKER}", "names iter_0000007, "
                   "which is missing")


def test_root_iteration_errors_name_the_iteration(sample, tmp_path,
                                                  failing_mount):
    root = make_root(tmp_path, sample(2))
    chunk = next((root / "iter_0000100" /
                  "decoder.layers.mlp.linear_fc2.weight").glob("0.*"))
    chunk.write_bytes(b"short")
    rc, err = failing_mount(root, ["tp=4"])
    assert_refused(rc, err, str(root / "iter_0000100"), "chunk file has 5 bytes")


# ------------------------------------------------------------ megatron-core


def load_dumps(prefix, tp):
    return [dict(np.load(f"{prefix}.{r}.npz")) for r in range(tp)]


@pytest.fixture(scope="module")
def mcore_root(tmp_path_factory):
    """backend -> a root around an iteration megatron-core saved at tp=2."""
    made = {}

    def get(backend):
        if backend not in made:
            base = tmp_path_factory.mktemp(f"mcore_root_{backend}")
            it = base / "saved"
            run_mcore(it, "--tp", 2, "--backend", backend)
            made[backend] = (make_root(base, it), it)
        return made[backend]
    return get


@needs_mcore
@pytest.mark.parametrize("backend,view", [("zarr", "zarr"),
                                          ("zarr", "torch_dist"),
                                          ("torch_dist", "torch_dist")])
def test_megatron_loads_root_view(mcore_root, mount, tmp_path, backend, view):
    """megatron-core loads MNT as --load would (tracker, then the iteration)
    at tp=4 and gets what it gets resharding the stored iteration."""
    root, it = mcore_root(backend)
    m = mount(root, ["tp=4", f"format={view}"])
    run_mcore(tmp_path / "view", "--tp", 4, "--load-from", m.mnt)
    run_mcore(tmp_path / "direct", "--tp", 4, "--load-from", it)
    via_view = load_dumps(tmp_path / "view", 4)
    direct = load_dumps(tmp_path / "direct", 4)
    for rank in range(4):
        assert sorted(via_view[rank]) == sorted(direct[rank])
        assert len(direct[rank]) >= 10
        for key, want in direct[rank].items():
            assert np.array_equal(via_view[rank][key], want), (rank, key)
