"""Mixture-of-Experts dist checkpoints at a new tp, ep and etp.

megatron-core 0.15.3 builds MoE GPTModels on CPU over gloo
(scripts/make_moe_checkpoint.py: 8 experts, top-2, SwiGLU, a shared
expert, a router with an expert bias; every layer MoE, and the first layer
dense) and saves them as torch_dist and zarr at tp=2, ep=2.  Each view is
loaded by megatron-core itself, strictly, at the view's layout, and every
rank's parameters must equal megatron-core's own load of the source at
that layout (its load-time reshard is the oracle).  Which rank file holds
an expert chunk is checked with torch's own DCP metadata reader.
"""

import json
import re

import pytest

from mcore import REPO, needs_mcore, run_py
from test_bad_input import assert_refused

pytestmark = needs_mcore

SCRIPT = REPO / "scripts" / "make_moe_checkpoint.py"


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """Saves at tp=2, ep=2: torch_dist and zarr, every layer MoE; torch_dist
    with the first layer dense."""
    base = tmp_path_factory.mktemp("moe")
    run_py(SCRIPT, "save", base / "dist", "--tp", 2, "--ep", 2,
           "--format", "torch_dist")
    run_py(SCRIPT, "save", base / "zarr", "--tp", 2, "--ep", 2,
           "--format", "zarr")
    run_py(SCRIPT, "save", base / "dense0", "--tp", 2, "--ep", 2,
           "--first-dense", "--format", "torch_dist")
    run_py(SCRIPT, "save", base / "single", "--tp", 2, "--ep", 2,
           "--singleton", "--format", "torch_dist")
    run_py(SCRIPT, "save", base / "pp2", "--tp", 1, "--pp", 2, "--ep", 2,
           "--format", "torch_dist")
    return base


def layout_args(tp, ep, etp, first_dense, singleton=False):
    args = ["--tp", tp, "--ep", ep]
    if etp:
        args += ["--etp", etp]
    if first_dense:
        args.append("--first-dense")
    if singleton:
        args.append("--singleton")
    return args


def load_same(moe, tmp_path, src, view, tp, ep, etp=None, first_dense=False,
              fmt="torch_dist", singleton=False):
    """megatron-core loads the view (a `fmt` checkpoint) and the source at
    one layout; both loads must hold the same parameters on every rank."""
    lay = layout_args(tp, ep, etp, first_dense, singleton)
    want = moe / f"oracle_{src.name}_{tp}_{ep}_{etp}"
    if not list(moe.glob(want.name + ".*")):
        run_py(SCRIPT, "load", src, *lay, "--format", "torch_dist",
               "--dump", want)
    got = tmp_path / "got"
    run_py(SCRIPT, "load", view, *lay, "--format", fmt, "--dump", got)
    out = run_py(SCRIPT, "compare", got, want)
    assert "OK" in out, out


@pytest.mark.parametrize("tp,ep,etp", [(1, 4, 1), (2, 1, None), (2, 4, 1)])
def test_torch_dist_view_loads_at_new_ep(moe, mount, tmp_path, tp, ep, etp):
    opts = [f"tp={tp}", f"ep={ep}"] + ([f"etp={etp}"] if etp else [])
    m = mount(moe / "dist", opts)
    load_same(moe, tmp_path, moe / "dist", m.mnt, tp, ep, etp)


def test_first_layer_dense(moe, mount, tmp_path):
    """Mixed dense and MoE layers are keyed per layer: (E, out, in)."""
    m = mount(moe / "dense0", ["tp=1", "ep=4", "etp=1"])
    load_same(moe, tmp_path, moe / "dense0", m.mnt, 1, 4, 1,
              first_dense=True)


def test_pipeline_stages(moe, mount, tmp_path):
    """Saved at tp=1, pp=2, ep=2 (dp=2): loaded at pp=1, tp=2, ep=4; and
    back at pp=2 with etp=1."""
    m = mount(moe / "pp2", ["tp=2", "ep=4", "etp=1"])
    load_same(moe, tmp_path, moe / "pp2", m.mnt, 2, 4, 1)
    m = mount(moe / "pp2", ["tp=2", "pp=2", "ep=2", "etp=1"], name="pp")
    lay = ["--tp", 2, "--pp", 2, "--ep", 2, "--etp", 1]
    run_py(SCRIPT, "load", moe / "pp2", *lay, "--format", "torch_dist",
           "--dump", tmp_path / "want")
    run_py(SCRIPT, "load", m.mnt, *lay, "--format", "torch_dist",
           "--dump", tmp_path / "got")
    assert "OK" in run_py(SCRIPT, "compare", tmp_path / "got",
                          tmp_path / "want")


def test_singleton_local_shards(moe, mount, tmp_path):
    """One key per expert, gated fc1 halves as _w/_v keys: cut by etp per
    expert, counted for ep from the numbers in the keys."""
    m = mount(moe / "single", ["tp=1", "ep=4", "etp=1"])
    load_same(moe, tmp_path, moe / "single", m.mnt, 1, 4, 1, singleton=True)


def test_zarr_source_as_torch_dist_and_zarr(moe, mount, tmp_path):
    m = mount(moe / "zarr", ["tp=1", "ep=4", "etp=1",
                             "format=torch_dist"])
    load_same(moe, tmp_path, moe / "dist", m.mnt, 1, 4, 1)
    z = mount(moe / "zarr", ["tp=1", "ep=2", "format=zarr"], name="z")
    load_same(moe, tmp_path, moe / "dist", z.mnt, 1, 2, fmt="zarr")


def test_expert_chunks_in_their_ranks_files(moe, mount):
    """At ep=4, etp=1 expert x lives in rank x // 2's file, and each of
    its chunks is one expert; at etp=2 the expert TP piece j goes to rank
    j + 2 * (x // 2).  Read with torch's FileSystemReader."""
    for etp in (1, 2):
        m = mount(moe / "dist", ["tp=1", "ep=4", f"etp={etp}"],
                  name=f"etp{etp}")
        out = run_py("-c", f"""
import json
from torch.distributed.checkpoint import FileSystemReader
md = FileSystemReader({str(m.mnt)!r}).read_metadata()
rows = []
for idx, info in md.storage_data.items():
    tm = md.state_dict_metadata[idx.fqn]
    if "experts.experts" not in idx.fqn or not hasattr(tm, "chunks"):
        continue
    chunk = next(c for c in tm.chunks if tuple(c.offsets) == tuple(idx.offset))
    rows.append([idx.fqn, list(idx.offset), list(chunk.sizes),
                 list(tm.size), info.relative_path])
print(json.dumps(rows))
""")
        rows = json.loads(out.strip().splitlines()[-1])
        assert rows
        files = set()
        for fqn, off, sizes, size, path in rows:
            assert sizes[1] == 1, (fqn, sizes)     # one expert per chunk
            expert = off[1]
            axis = 2 if "linear_fc1" in fqn else 3
            piece = off[axis] // sizes[axis]
            rank = piece % etp + etp * (expert // 2)
            assert path == f"__{rank}_0.distcp", (fqn, off, path)
            files.add(path)
        assert len(files) == 4 * etp


def test_dry_run_shows_experts(moe, reshardfs_bin, tmp_path):
    import subprocess
    r = subprocess.run([reshardfs_bin, "--dry-run", "-v", str(moe / "dist"),
                        str(tmp_path), "-o", "tp=1,ep=4,etp=1"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout
    assert "experts: 8 per MoE layer, ep=4 (2 local experts per rank), " \
           "etp=1 (stored at etp=2)" in r.stdout
    line = next(x for x in r.stdout.splitlines()
                if "experts.experts.linear_fc2.weight " in x)
    assert re.search(r"split along axis 3 by etp, experts along axis 1$",
                     line), line


def test_ep_that_does_not_divide_is_refused(moe, failing_mount, sample):
    assert_refused(*failing_mount(moe / "dist", ["tp=1", "ep=3"]),
                   "ep=3: the checkpoint's 8 experts per layer do not "
                   "divide into 3 expert-parallel ranks; ep can be 1, 2, 4, 8")
    assert_refused(*failing_mount(sample(2), ["ep=2"]),
                   "ep=2: the checkpoint has no expert weights")
    assert_refused(*failing_mount(moe / "dist",
                                  ["format=safetensors", "ep=2"]),
                   "a safetensors view holds every expert")
    assert_refused(*failing_mount(moe / "dist", ["experts=grouped"]),
                   "-o experts= picks the expert keys of per-rank megatron "
                   "views; a torch_dist view keys experts")


def test_expert_hole_or_overlap_is_refused(moe, failing_mount, tmp_path):
    """An expert chunk missing from `.metadata`, or two chunks claiming one
    expert, refuse the mount naming the file and the key: never a silently
    partial expert set."""
    from test_torch_dist import _copy, _rewrite_metadata
    key = "decoder.layers.mlp.experts.experts.linear_fc2.weight"
    drop = f"""
tm = md.state_dict_metadata[{key!r}]
tm.chunks = [c for c in tm.chunks if c.offsets[1] != 3]
"""
    ck = _copy(moe / "dist", tmp_path / "hole")
    _rewrite_metadata(ck, drop)
    assert_refused(*failing_mount(ck, ["tp=1", "ep=4"]), ".metadata", key,
                   "the rest has no stored bytes")
    twice = f"""
tm = md.state_dict_metadata[{key!r}]
for c in tm.chunks:
    if c.offsets[1] == 3:
        c.offsets = torch.Size([c.offsets[0], 2, *c.offsets[2:]])
for idx, _ in items:
    if idx.fqn == {key!r} and idx.offset[1] == 3:
        info = md.storage_data.pop(idx)
        md.storage_data[type(idx)(idx.fqn, torch.Size(
            [idx.offset[0], 2, *idx.offset[2:]]), idx.index)] = info
"""
    ck = _copy(moe / "dist", tmp_path / "twice")
    _rewrite_metadata(ck, "import torch\n" + twice)
    assert_refused(*failing_mount(ck, ["tp=1", "ep=4"]), ".metadata", key)
