"""metaseq/OPT FSDP flat-parameter shards as a source.

Checkpoints are written by scripts/make_metaseq_checkpoint.py with torch
(in .venv-mcore): an OPT-like model split into model parts by metaseq's
tensor-parallel rules, each part flattened per FSDP wrapper and sharded by
fairscale's rules, saved in metaseq's dict layout.  The oracle is the
script's full (consolidated) weights.  Every tensor of the zarr view is
read with zarr-python, every tensor of the safetensors view with
safetensors.safe_open (torch framework, in .venv-mcore), and compared byte
for byte.
"""

import json
import os
import shutil
from pathlib import Path

import ml_dtypes  # noqa: F401  (numpy's bfloat16 for zarr)
import numpy as np
import pytest
import zarr

from mcore import REPO, needs_mcore, run_py
from test_bad_input import assert_refused

pytestmark = needs_mcore

WRITER = REPO / "scripts" / "make_metaseq_checkpoint.py"
ZARR_DTYPE = {"float16": "<f2", "float32": "<f4", "bfloat16": "bfloat16"}

# name: (writer arguments, -o params= file form or None)
VARIANTS = {
    # metaseq training checkpoint: 2 model parts x 2 FSDP shards, fp16,
    # cfg with an argparse.Namespace and metaseq meter objects
    "fsdp": (["--namespace"], None),
    # fused qkv_proj [k; v; q], 3 shards (padding, pieces straddling
    # shards mid-row), a [3,5,7] and a 0-d param, bf16
    "fused_bf16": (["--fused-qkv", "--shards", "3", "--odd-params",
                    "--dtype", "bf16"], None),
    # three model parts
    "parts3": (["--parts", "3", "--hidden", "12", "--ffn", "24",
                "--vocab", "48"], None),
    # reshard_fsdp.py, one output shard, still flat: reshard-model_part-<m>.pt
    "reshard": (["--form", "reshard", "--fused-qkv", "--dtype", "fp32"],
                None),
    # reshard_fsdp.py --unflatten-weights: named weights, shard_metadata {}
    "unflat": (["--form", "unflat"], None),
    # no shard_metadata: -o params=FILE, the flat-param map
    "params_map": (["--no-metadata", "--shards", "3", "--odd-params"],
                   "map"),
    # no shard_metadata: -o params=FILE, fairscale's shard_metadata as JSON
    "params_fairscale": (["--no-metadata", "--parts", "1"], "fairscale"),
    # metaseq reshard_mp.py --no-pad: no shard_metadata, short last shard
    "reshard_mp_nopad": (["--no-metadata", "--no-pad", "--shards", "3",
                          "--prefix", "reshard-"], "map"),
}

ST_DUMP = r'''
import json, sys
import numpy as np, torch
from safetensors import safe_open
arrays, dtypes = {}, {}
with safe_open(sys.argv[1], framework="pt") as f:
    for k in f.keys():
        t = f.get_tensor(k)
        dtypes[k] = str(t.dtype).replace("torch.", "")
        arrays[k] = (t.view(torch.uint16) if t.dtype == torch.bfloat16
                     else t).numpy()
arrays["__dtypes__"] = np.array(json.dumps(dtypes))
np.savez(sys.argv[2], **arrays)
'''


def write(out, *args, params=None, oracle=None):
    extra = []
    if params:
        extra += ["--params-json", params]
    if oracle:
        extra += ["--oracle", oracle]
    run_py(WRITER, out, *args, *extra)


def load_npz(path):
    """{name: (dtype name, array)}; bf16 arrays are their uint16 bits."""
    z = np.load(path)
    dtypes = json.loads(str(z["__dtypes__"]))
    return {n: (dtypes[n], z[n]) for n in dtypes}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Factory: made(variant) -> (source dir, params file or None, oracle)."""
    cache = {}
    base = tmp_path_factory.mktemp("metaseq")

    def _make(name):
        if name not in cache:
            args, form = VARIANTS[name]
            src = base / name
            params = base / f"{name}.params.json" if form else None
            write(src, *args, *(["--params-form", form] if form else []),
                  params=params, oracle=base / f"{name}.npz")
            cache[name] = (src, params, load_npz(base / f"{name}.npz"))
        return cache[name]
    return _make


def opts_for(params, *opts):
    return list(opts) + ([f"params={params}"] if params else [])


def assert_same(got, want):
    """got, want: {name: (dtype name, array)}, compared byte for byte."""
    assert sorted(got) == sorted(want)
    for n, (dt, w) in want.items():
        gdt, g = got[n]
        assert gdt == dt, n
        assert g.shape == w.shape, (n, g.shape, w.shape)
        assert g.tobytes() == w.tobytes(), n


def read_zarr_view(mnt):
    got = {}
    for n in os.listdir(mnt):
        if not (Path(mnt) / n / ".zarray").exists():
            continue
        meta = json.loads((Path(mnt) / n / ".zarray").read_text())
        a = zarr.open(str(Path(mnt) / n), mode="r")[...]
        dt = {v: k for k, v in ZARR_DTYPE.items()}[meta["dtype"]]
        got[n] = (dt, a)
    return got


def read_safetensors(path, tmp_path):
    out = tmp_path / f"st_{Path(path).stem}.npz"
    run_py("-c", ST_DUMP, path, out)
    return load_npz(out)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_zarr_view(made, mount, variant):
    src, params, want = made(variant)
    m = mount(src, opts_for(params, "format=zarr"))
    names = os.listdir(m.mnt)
    assert not any(n.endswith(".pt") for n in names), names
    assert_same(read_zarr_view(m.mnt), want)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_safetensors_view(made, mount, tmp_path, variant):
    """The default view: one consolidated model.safetensors."""
    src, params, want = made(variant)
    m = mount(src, opts_for(params))
    assert sorted(os.listdir(m.mnt)) == ["model.safetensors"]
    assert_same(read_safetensors(m.mnt / "model.safetensors", tmp_path), want)


def tp_shard(name, a, r, tp):
    """Rank r of tp of a consolidated OPT weight (the built-in rules)."""
    if any(k in name for k in ("q_proj", "k_proj", "v_proj", "fc1.",
                               "embed_tokens.weight",
                               "output_projection.weight")):
        return np.split(a, tp, axis=0)[r]
    if name.endswith("out_proj.weight") or name.endswith("fc2.weight"):
        return np.split(a, tp, axis=1)[r]
    return a


def test_tp2_zarr_view(made, mount):
    src, _, want = made("fused_bf16")
    m = mount(src, ["format=zarr", "tp=2"])
    assert sorted(os.listdir(m.mnt / "decoder.layers.0.fc1.weight")) == \
        [".zarray", "0.0", "1.0"]
    assert sorted(os.listdir(m.mnt / "decoder.layers.0.fc2.weight")) == \
        [".zarray", "0.0", "0.1"]
    assert_same(read_zarr_view(m.mnt), want)


def test_tp2_safetensors_view(made, mount, tmp_path):
    """Per-rank files: each holds rank r's shard of every split tensor."""
    src, _, want = made("fsdp")
    m = mount(src, ["tp=2"])
    files = sorted(os.listdir(m.mnt))
    assert files == [f"model-rank-{r}-part-0.safetensors" for r in range(2)]
    for r, f in enumerate(files):
        got = read_safetensors(m.mnt / f, tmp_path)
        assert_same(got, {n: (dt, tp_shard(n, a, r, 2))
                          for n, (dt, a) in want.items()})


def test_other_files_pass_through(made, mount, tmp_path):
    src0, _, want = made("fsdp")
    src = tmp_path / "with_dict"
    shutil.copytree(src0, src)
    (src / "dict.txt").write_text("hello 1\n")
    m = mount(src, ["format=zarr"])
    assert (m.mnt / "dict.txt").read_text() == "hello 1\n"
    assert "dict.txt" not in read_zarr_view(m.mnt)


# ------------------------------------------------------------- refusals

def copy_of(made, variant, tmp_path):
    src0, params, _ = made(variant)
    src = tmp_path / f"copy_{variant}"
    shutil.copytree(src0, src)
    return src, params


def test_refuses_unknown_global(tmp_path, failing_mount):
    src = tmp_path / "evil"
    write(src, "--evil-global")
    rc, err = failing_mount(src, ["format=zarr"])
    assert_refused(rc, err, "checkpoint_last-model_part-0-shard0.pt",
                   "data.pkl", "GLOBAL posix.system is not allowed")


def test_refuses_numels_that_do_not_add_up(tmp_path, failing_mount):
    src = tmp_path / "badnumels"
    write(src, "--bad-numels")
    rc, err = failing_mount(src, ["format=zarr"])
    assert_refused(rc, err, "checkpoint_last-model_part-0-shard0.pt",
                   "decoder.layers.0.flat_param_0: numels add up to 1276 "
                   "but the shards hold 1292")


@pytest.mark.parametrize("padding,shown", [
    ("-3", "-3"), (str(2 ** 64), "an int wider than 64 bits")])
def test_refuses_padding_out_of_range(tmp_path, failing_mount, padding,
                                      shown):
    """A padding no int64 or no size holds is refused before it narrows,
    the line naming the field and the value."""
    src = tmp_path / "badpadding"
    write(src, "--bad-padding", padding)
    rc, err = failing_mount(src, ["format=zarr"])
    assert_refused(rc, err, "checkpoint_last-model_part-0-shard0.pt",
                   f"decoder.layers.0.flat_param_0: padding is {shown}, "
                   "not a non-negative int")


def test_refuses_params_file_that_does_not_fit(made, tmp_path,
                                               failing_mount):
    src, params = copy_of(made, "params_map", tmp_path)
    desc = json.loads(Path(params).read_text())
    desc["flat_param_0"]["shapes"][0][0] -= 1     # one row short
    bad = tmp_path / "bad.params.json"
    bad.write_text(json.dumps(desc))
    rc, err = failing_mount(src, ["format=zarr", f"params={bad}"])
    assert_refused(rc, err, "flat_param_0: numels add up to", "but the "
                   "shards hold")


def test_refuses_missing_shard(made, tmp_path, failing_mount):
    src, _ = copy_of(made, "fsdp", tmp_path)
    (src / "checkpoint_last-model_part-1-shard1.pt").unlink()
    rc, err = failing_mount(src, ["format=zarr"])
    assert_refused(rc, err, "checkpoint_last-model_part-1-shard1.pt: missing")


def test_refuses_missing_part(made, tmp_path, failing_mount):
    src, _ = copy_of(made, "parts3", tmp_path)
    for f in src.glob("*model_part-1-*"):
        f.unlink()
    rc, err = failing_mount(src, ["format=zarr"])
    assert_refused(rc, err, str(src), "model part 1 is missing")


def test_refuses_missing_shard_metadata_without_params(made, tmp_path,
                                                       failing_mount):
    src, _, _ = made("params_map")
    rc, err = failing_mount(src, ["format=zarr"])
    assert_refused(rc, err, "checkpoint_last-model_part-0-shard0.pt",
                   "no shard_metadata", "pass -o params=FILE")


def test_refuses_shard_metadata_that_differs(made, tmp_path, failing_mount):
    src, _ = copy_of(made, "fsdp", tmp_path)
    other = tmp_path / "badnumels_src"
    write(other, "--bad-numels")
    shutil.copy(other / "checkpoint_last-model_part-0-shard1.pt",
                src / "checkpoint_last-model_part-0-shard1.pt")
    rc, err = failing_mount(src, ["format=zarr"])
    assert_refused(rc, err, "checkpoint_last-model_part-0-shard1.pt",
                   "shard_metadata differs from "
                   "checkpoint_last-model_part-0-shard0.pt's")


def test_refuses_two_checkpoints(made, tmp_path, failing_mount):
    src, _ = copy_of(made, "fsdp", tmp_path)
    shutil.copy(src / "checkpoint_last-model_part-0-shard0.pt",
                src / "checkpoint_7-model_part-0-shard0.pt")
    rc, err = failing_mount(src, ["format=zarr"])
    assert_refused(rc, err, "more than one checkpoint")


def test_refuses_bad_params_file(made, tmp_path, failing_mount):
    src, _, _ = made("params_map")
    bad = tmp_path / "bad.json"
    bad.write_text('{"flat_param_0": {"names": ["a"], "shapes": [[1, -2]]}}')
    rc, err = failing_mount(src, ["format=zarr", f"params={bad}"])
    assert_refused(rc, err, str(bad), "flat_param_0", "shape 0")
    rc, err = failing_mount(src, ["format=zarr",
                                  f"params={tmp_path / 'none.json'}"])
    assert_refused(rc, err, "none.json", "cannot open params file")
