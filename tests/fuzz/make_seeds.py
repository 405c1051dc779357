#!/usr/bin/env python3
"""Writes the seed corpora of tests/fuzz/: small, real inputs per target.

    .venv-mcore/bin/python tests/fuzz/make_seeds.py [--reshardfs build/reshardfs]

Needs torch (real torch.save zips, data.pkl records and DCP checkpoints)
and numpy (scripts/make_sample_checkpoint.py for real .zarray files).  With
--reshardfs it also mounts a tiny zarr checkpoint as a torch_dist view at
tp=2 (fusermount3 must work) for a .metadata whose items lie in two .distcp
files.  Seeds are written to tests/fuzz/corpus/fuzz_<target>/, replacing
the files of the same name; each corpus stays well under 1 MB.
"""
import argparse
import io
import json
import os
import pickle
import random
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
import zipfile
from collections import OrderedDict
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

import make_sample_checkpoint as msc  # noqa: E402

# fuzz_torch_dist_meta.c splits its input at this marker.
MARKER = b"\nRSFUZZ-DISTCP\n"


def write(target, name, data):
    d = HERE / "corpus" / f"fuzz_{target}"
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


def torch_zip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def data_pkl(zip_bytes):
    with zipfile.ZipFile(io.BytesIO(zip_bytes)) as z:
        name = next(n for n in z.namelist() if n.endswith("/data.pkl"))
        return z.read(name)


def zarr_seeds(tmp):
    ck = os.path.join(tmp, "zarr")
    msc.make_checkpoint(ck, 2, layers=1, hidden=16, ffn=32, heads=2,
                        groups=1, vocab=100, divisor=8, optimizer=False)
    for key in ("decoder.layers.self_attention.linear_qkv.weight",
                "decoder.layers.mlp.linear_fc2.weight",
                "embedding.word_embeddings.weight",
                "decoder.final_layernorm.weight"):
        with open(os.path.join(ck, key, ".zarray"), "rb") as f:
            write("zarr_meta", key.split(".")[-2] + ".zarray", f.read())
    hand = {
        "compact.zarray": {"chunks": [1, 64], "compressor": None,
                           "dtype": "<f4", "fill_value": 0.0,
                           "filters": [], "order": "C", "shape": [4, 256],
                           "zarr_format": 2, "dimension_separator": "."},
        "scalar.zarray": {"chunks": [], "compressor": None, "dtype": "<i8",
                          "fill_value": None, "filters": None, "order": "C",
                          "shape": [], "zarr_format": 2},
        "empty.zarray": {"chunks": [1, 3], "compressor": None,
                         "dtype": "|b1", "fill_value": None, "filters": None,
                         "order": "C", "shape": [0, 7], "zarr_format": 2},
    }
    for name, d in hand.items():
        sep = (",", ":") if name == "compact.zarray" else None
        text = json.dumps(d, separators=sep, indent=None if sep else 2)
        write("zarr_meta", name, text.encode())


def zip_and_pickle_seeds(tmp):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    objs = {
        "tensor": base,
        "bf16": torch.ones(5, dtype=torch.bfloat16),
        "view": {"v": base[1:, ::2], "p": torch.nn.Parameter(torch.ones(2))},
        "list": [torch.zeros((), dtype=torch.int64), 3, "x"],
        "object": {"state": 7, "rng": (1, 2.5, b"\x00\x01")},
    }
    for name, obj in objs.items():
        z = torch_zip(obj)
        write("zip", name + ".pt", z)
        write("pickle", name + ".pkl", data_pkl(z))

    # A zip with a comment and ZIP64 records, as other writers make them.
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.comment = b"written by zipfile"
        with z.open("archive/data.pkl", "w", force_zip64=True) as f:
            f.write(pickle.dumps([1, 2], protocol=2))
        z.writestr("archive/version", "3\n")
    write("zip", "zip64_comment.zip", buf.getvalue())

    # Pickles of every kind of value, at each protocol the readers meet.
    def fake_global(module, name):
        f = type(name, (), {})
        f.__module__ = module
        f.__qualname__ = name
        mod = type(sys)(module)
        setattr(mod, name, f)
        sys.modules[module] = mod
        return f

    g = fake_global("torch._utils_fuzz", "_rebuild_tensor_v2")
    shared = [1, 2]
    values = {
        "scalars": [None, True, False, 0, 1, -1, 255, 256, 65535, 65536,
                    -2 ** 31, 2 ** 31, 2 ** 63 - 1, -2 ** 63, 2 ** 64,
                    -2 ** 100, 1.5, float("inf")],
        "strings": ["", "a", "x" * 300, "é\u2603", b"", b"\x00" * 3,
                    b"y" * 300, bytearray(b"ab")],
        "containers": ((), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), [], {},
                       {"a": 1, "b": [1]}, {1, 2}, frozenset({3}),
                       OrderedDict(a=1)),
        "memo": [shared, shared, {"k": shared}],
        "global": [g, OrderedDict, set],
    }
    for name, v in values.items():
        for proto in (2, 3, 4):
            write("pickle", f"{name}_p{proto}.pkl",
                  pickle.dumps(v, protocol=proto))


def form_seeds():
    """The construction forms (formats/codec/pickle.h): getattr as Python
    3.11.0-3.11.4 write Enum members (spelled out: the Python running this
    may be newer), copyreg reconstructors (protocol 1), protocol 5's
    BYTEARRAY8, and torch.save data.pkl under protocols 1 and 5."""
    write("pickle", "getattr_p2.pkl",
          b"\x80\x02]q\x00(c__builtin__\ngetattr\nq\x01"
          b"ctorch.distributed.checkpoint.metadata\n_MEM_FORMAT_ENCODING\nq\x02"
          b"X\x17\x00\x00\x00TORCH_CONTIGUOUS_FORMATq\x03\x86q\x04Rq\x05"
          b"h\x01h\x02X\x0c\x00\x00\x00PRESERVE_FMTq\x06\x86q\x07Rq\x08e.")
    write("pickle", "getattr_p4.pkl",
          b"\x80\x04\x95\x47\x00\x00\x00\x00\x00\x00\x00]\x94(\x8c\x08"
          b"builtins\x94\x8c\x07getattr\x94\x93\x94\x8c\x05torch\x94\x8c\x05"
          b"dtype\x94\x93\x94\x8c\x03abc\x94\x86\x94R\x94h\x03h\x06\x8c\x04"
          b"name\x94\x86\x94R\x94e.")
    write("pickle", "copyreg_p1.pkl", pickle.dumps(
        {"ns": argparse.Namespace(a=1, b=[2])}, protocol=1))
    write("pickle", "newobj_p1.pkl",
          b"ccopyreg\n__newobj__\n(ctorch\nSize\n(K\x01K\x02ttR"
          b"ccopyreg\n__newobj_ex__\n(ctorch\nSize\n)}tR\x86.")
    write("pickle", "bytearray_p5.pkl", pickle.dumps(
        [bytearray(b"ab"), b"cd", {1}], protocol=5))
    obj = {"w": torch.ones(2), "p": torch.nn.Parameter(torch.ones(1)),
           "ns": argparse.Namespace(a=1), "buf": bytearray(b"x")}
    for proto in (1, 5):
        buf = io.BytesIO()
        torch.save(obj, buf, pickle_protocol=proto)
        write("pickle", f"torch_p{proto}.pkl", data_pkl(buf.getvalue()))
    # a real one: Debian 12's Python 3.11.2 (tests/mount/data/py3112/)
    write("pickle", "dcp_py3112.metadata",
          (ROOT / "tests/mount/data/py3112/dcp/.metadata").read_bytes())


def dcp_save(state):
    d = tempfile.mkdtemp()
    try:
        dcp.save(state, checkpoint_id=d)
        meta = Path(d, ".metadata").read_bytes()
        distcp = Path(d, "__0_0.distcp").read_bytes()
    finally:
        shutil.rmtree(d)
    return meta, distcp


def dcp_seeds():
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    states = {
        "plain": {"model.w": base, "model.b": torch.zeros(5, dtype=torch.bfloat16),
                  "step": 7},
        "strided": {"t": base.t(), "s": torch.tensor(3.0),
                    "e": torch.zeros((0, 3), dtype=torch.int64),
                    "c": torch.ones(2, 2, 2, dtype=torch.float16)},
    }
    for name, state in states.items():
        meta, distcp = dcp_save(state)
        write("torch_dist_meta", name + ".seed", meta + MARKER + distcp)
        write("pickle", "dcp_" + name + ".metadata", meta)
    # No .distcp at all: every item is missing.
    write("torch_dist_meta", "plain_alone.seed", dcp_save(states["plain"])[0])


def wait_mounted(mnt, want, deadline):
    while time.monotonic() < deadline:
        with open("/proc/self/mountinfo") as f:
            on = any(line.split()[4] == mnt for line in f)
        if on == want:
            return True
        time.sleep(0.05)
    return False


def view_seeds(reshardfs, tmp):
    """A tiny zarr checkpoint shown as torch_dist at tp=2: its .metadata
    and both .distcp files."""
    ck = os.path.join(tmp, "tiny")
    os.makedirs(ck)
    Path(ck, "metadata.json").write_text(json.dumps(
        {"sharded_backend": "zarr", "sharded_backend_version": 1,
         "common_backend": "torch", "common_backend_version": 1}))
    import numpy as np
    msc.write_zarr_array(ck, "decoder.layers.self_attention.linear_qkv.weight",
                         np.arange(16, dtype=np.float32).reshape(1, 4, 4),
                         (1, 2, 4), "<f4")
    msc.write_zarr_array(ck, "decoder.layers.self_attention.linear_proj.weight",
                         np.arange(8, dtype=np.float32).reshape(1, 2, 4),
                         (1, 2, 2), "<f4")
    mnt = os.path.join(tmp, "mnt")
    os.makedirs(mnt)
    p = subprocess.Popen([reshardfs, "-f", ck, mnt, "-o",
                          "format=torch_dist,tp=2"])
    try:
        if not wait_mounted(mnt, True, time.monotonic() + 10):
            raise RuntimeError("reshardfs did not mount")
        parts = [Path(mnt, n).read_bytes()
                 for n in (".metadata", "__0_0.distcp", "__1_0.distcp")]
        write("torch_dist_meta", "view_tp2.seed", MARKER.join(parts))
    finally:
        subprocess.run(["fusermount3", "-u", mnt], check=False)
        p.wait(timeout=10)


def planner_seeds():
    # [dtype, ndim, mode] then choices: each rank with each storage mode.
    rng = random.Random(7)
    for ndim in range(5):
        for mode in range(3):
            head = bytes([ndim % 4, ndim, mode])
            tail = bytes(rng.randrange(256) for _ in range(300))
            write("planner", f"n{ndim}_mode{mode}.bin", head + tail)


def bridge_seeds():
    # rules NUL config.json NUL hf_config NUL "pattern\nname": the man
    # page's rows, a clash with a built-in row, a drop row; a config that
    # transformers' LlamaConfig writes; patterns with '#' and '*'
    row = {"family": "llama", "from": "hf", "to": "mcore"}
    rules = [
        {"names": [dict(row, target="decoder.layers.#.self_attention.q_layernorm.weight",
                        op="same", sources=["model.layers.#.self_attn.q_norm.weight"]),
                   dict(row, target=None, sources=["model.layers.#.mlp.*"])]},
        {"names": [dict(row, target="decoder.final_layernorm.weight",
                        sources=["model.layers.#.post_attention_layernorm.weight"])]},
        {"names": [dict(row, target="embedding.word_embeddings.weight",
                        op="vocab", sources=["model.embed_tokens.weight"]),
                   dict(row, target="decoder.layers.self_attention.linear_qkv.weight",
                        op="fuse_qkv", sources=["model.layers.#.self_attn.q_proj.weight",
                                                "model.layers.#.self_attn.k_proj.weight",
                                                "model.layers.#.self_attn.v_proj.weight"])]},
    ]
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "hidden_size": 64, "intermediate_size": 128,
              "num_attention_heads": 8, "num_key_value_heads": 4,
              "num_hidden_layers": 2, "vocab_size": 1000,
              "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
              "rope_theta": 50000.0, "tie_word_embeddings": False,
              "head_dim": 8, "torch_dtype": "float32"}
    hf_config = {"num_attention_heads": 8, "num_key_value_heads": 4,
                 "vocab_size": 1000, "rms_norm_eps": 1e-6}
    matches = ["l.#.e.#.w\nl.3.e.17.w", "*.#.w\nx.y.12.w",
               "optimizer.*\noptimizer.state.x", "*.*.*.*x\na.b.c.d.e.f"]
    for i, r in enumerate(rules):
        parts = [json.dumps(r), json.dumps(config), json.dumps(hf_config),
                 matches[i % len(matches)]]
        write("bridge", f"seed{i}.bin", "\0".join(parts).encode())
    write("bridge", "match.bin", ("{}\0{}\0{}\0" + matches[3]).encode())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reshardfs", help="the daemon, for the torch_dist view seed")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
    try:
        zarr_seeds(tmp)
        zip_and_pickle_seeds(tmp)
        form_seeds()
        dcp_seeds()
        planner_seeds()
        bridge_seeds()
        if args.reshardfs:
            view_seeds(os.path.abspath(args.reshardfs), tmp)
    finally:
        shutil.rmtree(tmp)
    for d in sorted((HERE / "corpus").iterdir()):
        size = sum(f.stat().st_size for f in d.iterdir())
        print(f"{d.name}: {len(list(d.iterdir()))} files, {size} bytes")


if __name__ == "__main__":
    main()
