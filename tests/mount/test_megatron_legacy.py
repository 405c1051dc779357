"""Legacy Megatron-LM per-rank checkpoints (mp_rank_TT[_PPP]/
model_optim_rng.pt) as a source and as a view.

Sources are written by scripts/make_legacy_checkpoint.py with torch.save,
in the dict layout megatron/training/checkpointing.py and
megatron/legacy/model write (args as an argparse.Namespace, nested model
dicts, optimizer and rng state); its oracle holds the full parameters.
tests/mount/legacy_check.py loads every virtual .pt with torch.load (also
weights_only=True with megatron-core's safe globals), checks the layout
fields of args and where each tensor sits, merges the ranks back and
compares every tensor with the oracle.  Views: other TP and PP, virtual
stages, gated bf16 MLPs, tied and untied embeddings, the old norm names,
the iteration-directory and checkpoint-root forms, zarr and torch_dist
views of a legacy source, cp -r, and refusals, one line each.
"""
import json
import os
import shutil
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import zarr

from mcore import needs_mcore, run_py
from test_bad_input import assert_refused

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
WRITER = REPO / "scripts" / "make_legacy_checkpoint.py"
CHECK = HERE / "legacy_check.py"
ITER = "iter_0000010"
pytestmark = needs_mcore


def make(base, name, *args):
    """A legacy checkpoint under base/name, and its oracle."""
    out = base / name
    run_py(WRITER, out, *args)
    return out, base / (name + ".oracle.npz")


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    """tp=2, pp=2, tied, fp32, checkpoint-root form, plus stray files."""
    out, oracle = make(tmp_path_factory.mktemp("legacy"), "tp2pp2",
                       "--tp", 2, "--pp", 2)
    (out / ITER / "notes.txt").write_text("kept\n")
    (out / "progress.txt").write_text("kept too\n")
    older = out / "iter_0000005" / "mp_rank_00_000"
    older.mkdir(parents=True)
    (older / "model_optim_rng.pt").write_bytes(b"an older save, not read")
    return out, oracle


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    """tp=2, pp=2, vpp=2 (8 layers), swiglu, bf16, distributed optimizer."""
    return make(tmp_path_factory.mktemp("legacy"), "gated", "--tp", 2,
                "--pp", 2, "--vpp", 2, "--layers", 8, "--gated", "--bf16",
                "--distopt")


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    """tp=4, pp=1, untied output layer, input_layernorm/final_layernorm
    names, SOURCE = the iteration directory."""
    return make(tmp_path_factory.mktemp("legacy"), "untied", "--tp", 4,
                "--untied", "--old-names", "--iter-dir")


def check(view, oracle, tp, pp, vpp=1, *extra):
    out = run_py(CHECK, view, oracle, "--tp", tp, "--pp", pp, "--vpp", vpp,
                 *extra)
    assert "OK" in out.splitlines()[-1], out


# ------------------------------------------------------------ the writer


def test_writer_matches_checker(src, gated, untied):
    """The checker accepts the sources themselves (their own layout)."""
    check(*src, 2, 2, 1, "--source", "--padded", 1024)
    check(*gated, 2, 2, 2, "--source", "--dtype", "bfloat16")
    check(*untied, 4, 1, 1, "--source")


# ------------------------------------------------------------ views


@pytest.mark.parametrize("tp,pp", [(4, 1), (1, 4), (1, 1), (8, 2)])
def test_views_of_tp2_pp2(src, mount, tp, pp):
    m = mount(src[0], [f"tp={tp}", f"pp={pp}"])
    check(m.mnt, src[1], tp, pp, 1, "--padded", 1024, "--weights-only",
          "--dtype", "float32")


def test_default_format_and_tree(src, mount):
    """Without format= a legacy source is shown as one; the tree keeps the
    tracker and the other files of the tracked iteration, leaves out the
    rank directories' other files and the iterations not tracked."""
    m = mount(src[0], ["tp=4", "pp=1"])
    assert sorted(os.listdir(m.mnt)) == sorted(
        ["latest_checkpointed_iteration.txt", "progress.txt", ITER])
    assert sorted(os.listdir(m.mnt / ITER)) == sorted(
        ["notes.txt"] + [f"mp_rank_{t:02d}" for t in range(4)])
    assert (m.mnt / ITER / "notes.txt").read_text() == "kept\n"
    assert (m.mnt / "latest_checkpointed_iteration.txt").read_bytes() == \
        (src[0] / "latest_checkpointed_iteration.txt").read_bytes()


# torch.load imports megatron-core for the enums in args; its import
# JIT-compiles a CUDA extension unless told not to (CPU-only machine).
NO_JIT = r'''
import torch.utils.cpp_extension as _ext
def _no_jit(*a, **k):
    raise RuntimeError("no JIT CUDA extensions on CPU")
_ext.load_inline = _no_jit
'''

ROUNDTRIP = NO_JIT + r'''
import sys, torch
# args come from TP rank 0 of stage 0 in every view file: the process rank
# fields are that rank's
SKIP = {"rank", "local_rank"}


def flat(d, p=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from flat(v, p + k + ".")
        else:
            yield p + k, v


def same(a, b):
    keys = [k for k in b if k.startswith("model")]
    assert keys == [k for k in a if k.startswith("model")], keys
    for k in keys:
        fa, fb = list(flat(a[k])), list(flat(b[k]))
        assert [n for n, _ in fa] == [n for n, _ in fb]
        for (n, x), (_, y) in zip(fa, fb):
            assert x.dtype == y.dtype and torch.equal(x, y), n
    assert {k: v for k, v in vars(a["args"]).items() if k not in SKIP} == \
        {k: v for k, v in vars(b["args"]).items() if k not in SKIP}
    for k in ("checkpoint_version", "iteration",
              "num_floating_point_operations_so_far"):
        assert a[k] == b[k], k
    assert not {"optimizer", "rng_state", "opt_param_scheduler"} & set(b)


for src, view in zip(sys.argv[1::2], sys.argv[2::2]):
    same(torch.load(src, weights_only=False),
         torch.load(view, weights_only=False))
print("OK")
'''


@pytest.mark.parametrize("which", ["src", "gated"])
def test_same_layout_round_trips(which, src, gated, mount):
    """At the source's own layout every file holds the source's tensors in
    the source's order and its args unchanged."""
    ckpt, _ = src if which == "src" else gated
    vpp = 2 if which == "gated" else 1
    m = mount(ckpt, ["tp=2", "pp=2", f"vpp={vpp}"])
    pairs = []
    for t in range(2):
        for p in range(2):
            rel = f"{ITER}/mp_rank_{t:02d}_{p:03d}/model_optim_rng.pt"
            pairs += [ckpt / rel, m.mnt / rel]
    assert run_py("-c", ROUNDTRIP, *pairs).splitlines()[-1] == "OK"


@pytest.mark.parametrize("tp,pp,vpp", [(4, 2, 2), (1, 1, 1), (2, 4, 1),
                                       (8, 4, 2)])
def test_virtual_stages_gated_bf16(gated, mount, tp, pp, vpp):
    m = mount(gated[0], [f"tp={tp}", f"pp={pp}", f"vpp={vpp}"])
    check(m.mnt, gated[1], tp, pp, vpp, "--dtype", "bfloat16",
          "--weights-only")


@pytest.mark.parametrize("tp,opts,padded", [
    (1, ["vocab_size=1000", "vocab_divisor=576"], 1152),   # grows
    (2, ["vocab_size=1000", "vocab_divisor=8"], 1008),     # shrinks
])
def test_vocab_repadded(src, mount, tp, opts, padded):
    """args.padded_vocab_size follows the view's padding; rows past the
    stored ones read as zeros, padding rows are dropped (the checker
    compares the rows both have and wants zeros past the stored ones)."""
    m = mount(src[0], [f"tp={tp}", "pp=2", *opts])
    check(m.mnt, src[1], tp, 2, 1, "--padded", padded)


def test_dtype_view(gated, mount):
    m = mount(gated[0], ["tp=4", "pp=2", "dtype=f32"])
    check(m.mnt, gated[1], 4, 2, 1, "--dtype", "float32")


@pytest.mark.parametrize("tp,pp", [(2, 2), (1, 4), (8, 1)])
def test_untied_old_names_iteration_dir(untied, mount, tp, pp):
    m = mount(untied[0], [f"tp={tp}", f"pp={pp}"])
    assert all(n.startswith("mp_rank_") for n in os.listdir(m.mnt))
    check(m.mnt, untied[1], tp, pp)


def test_distributed_optimizer_files_left_out(gated, mount):
    m = mount(gated[0], ["tp=2", "pp=2", "vpp=2"])
    for d in (m.mnt / ITER).iterdir():
        assert os.listdir(d) == ["model_optim_rng.pt"], d


def test_cp_r(src, mount, tmp_path):
    m = mount(src[0], ["tp=1", "pp=4"])
    dst = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(m.mnt), str(dst)], check=True)
    for root, _, files in os.walk(m.mnt):
        for f in files:
            rel = Path(root, f).relative_to(m.mnt)
            assert (dst / rel).read_bytes() == Path(root, f).read_bytes(), rel
    check(dst, src[1], 1, 4)


# ------------------------------------------------------------ other views


def zarr_values(path):
    a = zarr.open(str(path), mode="r")[...]
    if a.dtype.kind == "V" or str(a.dtype) == "bfloat16":
        a = a.view(ml_dtypes.bfloat16)
    return a.astype(np.float32)


def iteration_of(mnt):
    """A view of a checkpoint root is a root: the tracker and the tracked
    iteration's directory, which holds the view."""
    assert sorted(n for n in os.listdir(mnt) if n.startswith("iter_")) == \
        [ITER]
    assert (mnt / "latest_checkpointed_iteration.txt").exists()
    return mnt / ITER


@pytest.mark.parametrize("which,tp", [("src", 4), ("gated", 1), ("gated", 8)])
def test_zarr_view(which, tp, src, gated, mount):
    ckpt, oracle = src if which == "src" else gated
    m = mount(ckpt, [f"tp={tp}", "format=zarr"])
    view = iteration_of(m.mnt)
    want = np.load(oracle)
    names = [k for k in want.files if k != "__config__"]
    assert set(names) <= set(os.listdir(view))
    assert not [n for n in os.listdir(view) if n.startswith(("iter_", "mp_"))]
    for k in names:
        assert np.array_equal(zarr_values(view / k), want[k]), k
    qkv = zarr.open(str(view / "language_model.encoder.layers.1."
                        "self_attention.query_key_value.weight"), mode="r")
    assert qkv.chunks == (192 // tp, 64)


def test_user_rules_reach_the_reader(src, mount, tmp_path):
    """-o rules= decides how the reader places each rank's copy: a rule
    calling dense_4h_to_h replicated makes the catalog take TP rank 0's
    shard as the whole tensor (half the columns), where the built-in rule
    merges both ranks."""
    ckpt, oracle = src
    name = "language_model.encoder.layers.0.mlp.dense_4h_to_h.weight"
    full = np.load(oracle)[name]
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"rules": [
        {"match": "*mlp.dense_4h_to_h.weight", "split": "replicated"}]}))
    m = mount(ckpt, ["format=zarr"])
    assert zarr_values(iteration_of(m.mnt) / name).shape == full.shape
    m2 = mount(ckpt, ["format=zarr", f"rules={rules}"])
    got = zarr_values(iteration_of(m2.mnt) / name)
    assert got.shape == (full.shape[0], full.shape[1] // 2)
    assert np.array_equal(got, full[:, :full.shape[1] // 2])


def test_torch_dist_view(gated, mount, tmp_path):
    m = mount(gated[0], ["tp=2", "format=torch_dist"])
    out = tmp_path / "dump.npz"
    run_py(HERE / "dcp_dump.py", iteration_of(m.mnt), out)
    got, want = np.load(out), np.load(gated[1])
    for k in want.files:
        if k != "__config__":
            a = got[k].view(ml_dtypes.bfloat16).astype(np.float32)
            assert np.array_equal(a, want[k]), k


# ------------------------------------------------------------ refusals


EDIT = NO_JIT + r'''
import os, sys, torch
for path, what in zip(sys.argv[1::2], sys.argv[2::2]):
    sd = torch.load(path, weights_only=False)
    enc = sd["model"]["language_model"]["encoder"]
    if what == "global":
        sd["extra"] = os.system
    elif what == "shape":
        k = "layers.0.self_attention.query_key_value.weight"
        enc[k] = enc[k][:-8].clone()
    elif what == "lack":
        del enc["layers.1.mlp.dense_4h_to_h.bias"]
    elif what == "iteration":
        sd["iteration"] += 1
    elif what == "tp":
        sd["args"].tensor_model_parallel_size = 4
    elif what == "uneven":
        sd["args"].decoder_first_pipeline_num_layers = 1
    elif what == "version":
        sd["checkpoint_version"] = 1.0
    elif what == "torchfn":
        sd["args"].evil = torch.load
    torch.save(sd, path)
'''

RANK1 = f"{ITER}/mp_rank_01_000/model_optim_rng.pt"
RANK0 = f"{ITER}/mp_rank_00_000/model_optim_rng.pt"
REFUSED = [
    ("global", RANK1, ["mp_rank_01_000/model_optim_rng.pt: data.pkl:",
                       "GLOBAL posix.system is not allowed"]),
    ("shape", RANK1, ["mp_rank_01_000/model_optim_rng.pt:",
                      "layers.0.self_attention.query_key_value.weight differs "
                      "in dtype or shape from TP rank 0's"]),
    ("lack", RANK1, ["mp_rank_01_000/model_optim_rng.pt: lacks "
                     "language_model.encoder.layers.1.mlp.dense_4h_to_h.bias"]),
    ("lack", RANK0, ["mp_rank_01_000/model_optim_rng.pt: holds "
                     "language_model.encoder.layers.1.mlp.dense_4h_to_h.bias, "
                     "which TP rank 0 of its stage lacks"]),
    ("iteration", RANK1, ["mp_rank_01_000/model_optim_rng.pt: iteration or "
                          "checkpoint_version differs"]),
    ("tp", RANK0, ["args.tensor_model_parallel_size is not 2"]),
    ("uneven", RANK0, ["args.decoder_first_pipeline_num_layers is set"]),
    ("version", RANK0, ["checkpoint_version 1: before 2.0"]),
    # the reader parses any torch.* GLOBAL; the view writes back only what
    # args really hold, never a callable for weights_only=False to run
    ("torchfn", RANK0, ["args.evil: GLOBAL torch.serialization.load is not "
                        "allowed"]),
]


@pytest.fixture(scope="module")
def broken(src, tmp_path_factory):
    """A copy of the source per REFUSED case, each damaged by one torch.save
    (all written by one Python process)."""
    base = tmp_path_factory.mktemp("broken")
    dirs, edits = {}, []
    for what, rel, _ in REFUSED:
        d = base / f"{what}_{rel.split('/')[1]}"
        shutil.copytree(src[0], d)
        dirs[what, rel] = d
        edits += [d / rel, what]
    run_py("-c", EDIT, *edits)
    return dirs


@pytest.mark.parametrize("what,rel,needles", REFUSED)
def test_refused(broken, failing_mount, what, rel, needles):
    rc, err = failing_mount(broken[what, rel], ["tp=2"])
    assert_refused(rc, err, *needles)


def test_missing_rank(src, tmp_path, failing_mount):
    d = tmp_path / "missing"
    shutil.copytree(src[0], d)
    shutil.rmtree(d / ITER / "mp_rank_01_001")
    rc, err = failing_mount(d, ["tp=2"])
    assert_refused(rc, err, f"{ITER}/mp_rank_01_001/model_optim_rng.pt: "
                   "missing (the rank directories make tp=2, pp=2)")


def test_truncated_rank_file(src, tmp_path, failing_mount):
    d = tmp_path / "truncated"
    shutil.copytree(src[0], d)
    f = d / RANK1
    f.write_bytes(f.read_bytes()[:-100])
    rc, err = failing_mount(d, ["tp=2"])
    assert_refused(rc, err, "mp_rank_01_000/model_optim_rng.pt: zip:")


def test_tracker_names_missing_iteration(src, tmp_path, failing_mount):
    d = tmp_path / "tracker"
    shutil.copytree(src[0], d)
    (d / "latest_checkpointed_iteration.txt").write_text("20\n")
    rc, err = failing_mount(d, ["tp=2"])
    assert_refused(rc, err, "latest_checkpointed_iteration.txt: names "
                   "iter_0000020, which is missing")


@pytest.mark.parametrize("opts,needle", [
    (["pp=3"], "the checkpoint has 4 layers, which do not divide into 3 pipeline stages"),
    (["pp=1", "vpp=2"], "vpp=2: virtual pipeline stages need pp > 1"),
    (["tp=3"], "cannot be split evenly"),
])
def test_bad_layouts(src, failing_mount, opts, needle):
    rc, err = failing_mount(src[0], opts)
    assert_refused(rc, err, needle)


def test_megatron_view_needs_legacy_source(sample, failing_mount):
    rc, err = failing_mount(sample(1), ["tp=1", "format=megatron"])
    assert_refused(rc, err, "the megatron view needs a per-rank Megatron source")
