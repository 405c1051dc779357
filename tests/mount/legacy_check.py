"""Check a legacy Megatron per-rank checkpoint (a view, or a source) against
the full-parameter oracle of scripts/make_legacy_checkpoint.py.

Runs in .venv-mcore (torch).  Usage:
    legacy_check.py CKPT ORACLE.npz --tp T --pp P [--vpp V] [--padded N]
                    [--dtype float32|bfloat16] [--source] [--weights-only]

Every mp_rank_TT[_PPP]/model_optim_rng.pt is loaded with torch.load (and,
with --weights-only, again with weights_only=True and Megatron's safe
globals).  Then, independently of how reshardfs or the writer split the
model: the rank directories must be exactly those of (T, P); args must
carry the layout; embeddings sit in the first model chunk, final norm and
output layer in the last, word_embeddings_for_head in the last chunk when
weights are tied and it is not also the first; layers are numbered per
chunk.  The ranks' shards are merged back (rows for column-parallel and
vocab tensors, W and V halves for a gated dense_h_to_4h, columns for
row-parallel ones, replicas compared) and every tensor must equal the
oracle's exactly.  Without --source the optimizer and rng state must be
gone.  Prints "OK <tensors>" on success.
"""
import argparse
import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import torch


def _no_jit():
    # megatron-core JIT-compiles a CUDA extension at import; not on CPU.
    import torch.utils.cpp_extension as cpp_ext

    def fail(*a, **k):
        raise RuntimeError("JIT CUDA extensions disabled (CPU-only run)")
    cpp_ext.load_inline = fail


COL = ("self_attention.query_key_value.weight", "self_attention.query_key_value.bias",
       "mlp.dense_h_to_4h.weight", "mlp.dense_h_to_4h.bias",
       "word_embeddings.weight", "output_layer.weight")
ROW = ("self_attention.dense.weight", "mlp.dense_4h_to_h.weight")
KEEP = {"args", "checkpoint_version", "iteration",
        "num_floating_point_operations_so_far"}


def rank_dirs(tp, pp):
    return {f"mp_rank_{t:02d}" + (f"_{p:03d}" if pp > 1 else ""): (t, p)
            for t in range(tp) for p in range(pp)}


def flatten(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from flatten(v, prefix + k + ".")
        else:
            yield prefix + k, v


def merge(name, parts, gated):
    """The global tensor from the TP ranks' shards, by the name's kind."""
    if name.endswith(COL[2:4]) and gated:
        halves = [p.chunk(2, 0) for p in parts]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves])
    if name.endswith(COL):
        return torch.cat(parts, 0)
    if name.endswith(ROW):
        return torch.cat(parts, 1)
    for p in parts[1:]:
        assert torch.equal(p, parts[0]), f"{name}: replicas differ"
    return parts[0]


def load(path, weights_only):
    if not weights_only:
        return torch.load(path, map_location="cpu", weights_only=False)
    from megatron.core.safe_globals import SAFE_GLOBALS
    with torch.serialization.safe_globals(SAFE_GLOBALS):
        return torch.load(path, map_location="cpu", weights_only=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("oracle")
    ap.add_argument("--tp", type=int, required=True)
    ap.add_argument("--pp", type=int, required=True)
    ap.add_argument("--vpp", type=int, default=1)
    ap.add_argument("--padded", type=int)
    ap.add_argument("--dtype")
    ap.add_argument("--source", action="store_true")
    ap.add_argument("--weights-only", action="store_true")
    a = ap.parse_args()
    _no_jit()

    oracle = np.load(a.oracle)
    cfg = json.loads(str(oracle["__config__"]))
    want = {k: oracle[k] for k in oracle.files if k != "__config__"}
    tp, pp, vpp = a.tp, a.pp, a.vpp
    L = cfg["num_layers"]
    lpc = L // (pp * vpp)
    tied, gated = not cfg["untied"], cfg["gated"]

    root = Path(a.ckpt)
    tracker = root / "latest_checkpointed_iteration.txt"
    it_dir = root / f"iter_{int(tracker.read_text()):07d}" if tracker.exists() else root
    ranks = rank_dirs(tp, pp)
    found = {n for n in os.listdir(it_dir) if n.startswith("mp_rank_")}
    assert found == set(ranks), f"rank directories {sorted(found)}"

    shards = {}          # global name -> {t: tensor}
    head = {}
    for name, (t, p) in ranks.items():
        if not a.source:
            assert os.listdir(it_dir / name) == ["model_optim_rng.pt"], \
                os.listdir(it_dir / name)
        path = it_dir / name / "model_optim_rng.pt"
        sd = load(path, False)
        if a.weights_only:
            sd_w = load(path, True)
            assert sd_w.keys() == sd.keys()
        args = sd["args"]
        assert isinstance(args, argparse.Namespace)
        assert args.tensor_model_parallel_size == tp, name
        assert args.pipeline_model_parallel_size == pp, name
        assert args.virtual_pipeline_model_parallel_size == (vpp if vpp > 1 else None)
        if hasattr(args, "num_layers_per_virtual_pipeline_stage"):
            assert args.num_layers_per_virtual_pipeline_stage == \
                (lpc if vpp > 1 else None)
        if a.padded:
            assert args.padded_vocab_size == a.padded, args.padded_vocab_size
        assert args.num_layers == L and args.swiglu == gated
        assert sd["checkpoint_version"] == 3.0 and sd["iteration"] == cfg["iteration"]
        models = ["model"] if vpp == 1 else [f"model{c}" for c in range(vpp)]
        if a.source:
            assert {"optimizer", "rng_state", "opt_param_scheduler"} <= sd.keys()
        else:
            assert set(sd) == KEEP | set(models), sorted(sd)
        for c, key in enumerate(models):
            g = c * pp + p
            first, last = g == 0, g == pp * vpp - 1
            layers_seen = set()
            for flat, v in flatten(sd[key]):
                if a.dtype:
                    assert str(v.dtype) == "torch." + a.dtype, (flat, v.dtype)
                assert v.is_contiguous() or a.source
                m = re.match(r"(.*\.layers\.)(\d+)(\..*)", flat)
                if m:
                    n = int(m.group(2))
                    assert n < lpc, (name, key, flat)
                    layers_seen.add(n)
                    flat = f"{m.group(1)}{g * lpc + n}{m.group(3)}"
                elif flat.startswith("language_model.embedding."):
                    assert first, (name, key, flat)
                elif flat == "word_embeddings_for_head.weight":
                    assert tied and last and not first, (name, key)
                    head.setdefault(t, v)
                    continue
                else:
                    assert last, (name, key, flat)
                assert t not in shards.setdefault(flat, {}), (name, flat)
                shards[flat][t] = v
            assert layers_seen == set(range(lpc)), (name, key, layers_seen)
    assert set(shards) == set(want), \
        (sorted(set(shards) ^ set(want)))
    # args say what the shapes are: the padded vocab is the embedding's rows
    # (and the output layer's) over all TP ranks
    for flat, parts in shards.items():
        if flat.endswith(("word_embeddings.weight", "output_layer.weight")):
            rows = sum(parts[t].shape[0] for t in parts)
            assert getattr(args, "padded_vocab_size", rows) == rows, \
                (flat, rows, args.padded_vocab_size)
    for flat, parts in shards.items():
        assert sorted(parts) == list(range(tp)), flat
        full = merge(flat, [parts[t] for t in range(tp)], gated)
        ref = want[flat]
        got = full.float().numpy()
        assert got.shape[1:] == ref.shape[1:], (flat, got.shape, ref.shape)
        rows = min(got.shape[0], ref.shape[0]) if got.ndim else None
        if got.ndim and got.shape[0] != ref.shape[0]:
            # re-padded vocab: rows past the stored ones are zeros
            assert flat.endswith(("word_embeddings.weight", "output_layer.weight"))
            assert not got[rows:].any()
            got, ref = got[:rows], ref[:rows]
        assert np.array_equal(got, ref), flat
    if tied and pp * vpp > 1:
        assert sorted(head) == list(range(tp)), sorted(head)
        we = merge("word_embeddings.weight", [head[t] for t in range(tp)], False)
        ref = want["language_model.embedding.word_embeddings.weight"]
        n = min(we.shape[0], ref.shape[0])
        assert np.array_equal(we.float().numpy()[:n], ref[:n])
    else:
        assert not head
    print("OK", len(shards))


if __name__ == "__main__":
    sys.exit(main())
