#!/usr/bin/env python3
"""Writes the checkpoints in this directory with Debian 12's own Python.

These fixtures are real writer output: Python 3.11.2 (Debian 12's
/usr/bin/python3), torch 2.9.1 and megatron-core 0.15.3 from PyPI.
Python 3.11.0-3.11.4 pickle an Enum member as getattr(cls, 'name') where
later Pythons write cls(value) (docs/FORMATS.md, "torch.save"); the venvs
the other mount tests use run 3.11.7, so their checkpoints cannot show it.
To remake them (outside the repo, a few GB of wheels):

    /usr/bin/python3 -m venv /tmp/debpy-venv
    /tmp/debpy-venv/bin/pip install -r requirements-mcore-deps.txt
    /tmp/debpy-venv/bin/pip install --no-deps -r requirements-mcore.txt
    /tmp/debpy-venv/bin/python tests/mount/data/py3112/make_fixtures.py

Every run writes new random state (rng states, DCP ids), so the bytes
differ from the committed ones; tests/mount/test_py3112.py reads them
against torch.load of themselves, never against fixed values.

legacy_tp2/            scripts/make_legacy_checkpoint.py at tp 2, pp 1, 2
                       layers, hidden 16, vocab 100 (padded to 256): args
                       hold ModelType.encoder_or_decoder and AttnBackend.auto
legacy_tp2.oracle.npz  its full parameters (the writer's oracle)
dcp/                   torch.distributed.checkpoint.save of a state dict
                       (strided, bf16, 0-d and int tensors, a byte item);
                       .metadata holds _MEM_FORMAT_ENCODING members
mcore_td/              scripts/make_mcore_checkpoint.py --backend
                       torch_dist --tp 2 --hidden 16 --vocab 100
torchsave/p<N>/        torch.save(pickle_protocol=N), N = 1..5, of a metaseq
                       part file (model_part-0.pt): tensors (strided, bf16,
                       fp8, an nn.Parameter with and without attributes, a
                       tensor with an attribute, an nn.Buffer) and a cfg holding a
                       Namespace, an Enum member, bytes, a bytearray, a set
refused/<kind>/        one model_part-0.pt each with a tensor reshardfs
                       does not read: quantized, sparse, meta, nested, a
                       tensor subclass (MaskedTensor), and the legacy
                       non-zip torch.save format
"""
import argparse
import importlib.util
import io
import os
import shutil
import subprocess
import sys
import warnings
from collections import OrderedDict
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[3]
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING  # noqa: E402
from torch.masked import masked_tensor  # noqa: E402


def load_script(name):
    spec = importlib.util.spec_from_file_location(
        name, REPO / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def fresh(path):
    if path.exists():
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    return path


def legacy():
    mlc = load_script("make_legacy_checkpoint")
    # the writer's module constants: a smaller model, same layout
    mlc.VOCAB, mlc.HIDDEN, mlc.HEADS, mlc.FFN, mlc.MAX_POS = 100, 16, 2, 32, 8
    out = fresh(HERE / "legacy_tp2")
    fresh(HERE / "legacy_tp2.oracle.npz")
    mlc.write(out, tp=2, pp=1, layers=2)


def plain_dcp():
    g = torch.Generator().manual_seed(5)
    base = torch.randn(6, 10, generator=g)
    sd = {
        "w": torch.randn(8, 12, generator=g),
        "bf": torch.randn(4, 6, generator=g).to(torch.bfloat16),
        "view_t": base.t(),
        "narrow": base[1:5, 2:7],
        "scalar": torch.tensor(2.5),
        "ints": torch.arange(10, dtype=torch.int64),
        "step": 7,
    }
    dcp.save(sd, checkpoint_id=str(fresh(HERE / "dcp")), no_dist=True)


def mcore_td():
    out = fresh(HERE / "mcore_td")
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_mcore_checkpoint.py"),
                    str(out), "--tp", "2", "--backend", "torch_dist",
                    "--hidden", "16", "--vocab", "100"], check=True)


def part(tensors, cfg):
    """A metaseq part file's dict: the model and what it pickles beside."""
    return {"model": tensors, "cfg": cfg, "shard_metadata": None}


def save(obj, path, **kw):
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(obj, path, **kw)


def torch_saves():
    g = torch.Generator().manual_seed(9)
    w = torch.randn(4, 6, generator=g)
    p = torch.nn.Parameter(torch.randn(3, 2, generator=g))
    ps = torch.nn.Parameter(torch.randn(2, 2, generator=g))
    ps.tp_split = 0                  # _rebuild_parameter_with_state
    attr = torch.randn(5, generator=g)
    attr.note = "kept"               # _rebuild_from_type_v2(.., Tensor, ..)
    model = OrderedDict(
        w=w, view=w[1:, ::2], p=p, ps=ps, attr=attr,
        h=torch.randn(3, 4, generator=g).to(torch.bfloat16),
        f8=torch.randn(6, generator=g).to(torch.float8_e4m3fn),
        i=torch.arange(7, dtype=torch.int32),
        buffer=torch.nn.Buffer(torch.randn(2, 3, generator=g)))
    cfg = {"args": argparse.Namespace(lr=3e-4, arch="tiny"),
           "mem": _MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT,
           "raw": b"\x00\xffab", "buf": bytearray(b"xy"), "tags": {1, 2}}
    for proto in range(1, 6):
        out = fresh(HERE / "torchsave" / f"p{proto}")
        save(part(model, cfg), out / "model_part-0.pt", pickle_protocol=proto)

    base = HERE / "refused"
    fresh(base)
    x = torch.randn(2, 3, generator=g)
    kinds = {
        "quantized": torch.quantize_per_tensor(x, 0.1, 0, torch.quint8),
        "sparse": x.to_sparse(),
        "meta": torch.empty(2, 3, device="meta"),
        "nested": torch.nested.nested_tensor([x[0], x[1, :2]]),
        "subclass": masked_tensor(x, x > 0),
    }
    for kind, t in kinds.items():
        save(part({"w": x, "odd": t}, {}), base / kind / "model_part-0.pt")
    save(part({"w": x}, {}), base / "legacy_format" / "model_part-0.pt",
         _use_new_zipfile_serialization=False)


def main():
    assert sys.version_info[:3] == (3, 11, 2), sys.version
    assert torch.__version__.startswith("2.9.1"), torch.__version__
    legacy()
    plain_dcp()
    mcore_td()
    torch_saves()
    print("python", sys.version.split()[0], "torch", torch.__version__)


if __name__ == "__main__":
    main()
