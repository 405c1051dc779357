#!/usr/bin/env python3
"""Writes a small metaseq/OPT checkpoint as fairscale FSDP flat-parameter
shards, with torch (run it in .venv-mcore), and the oracle of what a mount
must show.

    make_metaseq_checkpoint.py OUT [--parts 2] [--shards 2] [--form fsdp]
        [--fused-qkv] [--dtype fp16] [--no-metadata --params-json P.json]
        [--oracle O.npz] ...

The model is OPT-like (metaseq's TransformerDecoder names): embed_tokens,
embed_positions, per layer self_attn.{k,v,q,out}_proj (or a fused
qkv_proj), self_attn_layer_norm, fc1, fc2, final_layer_norm, then
decoder.layer_norm, a tied decoder.output_projection and the buffer
decoder.version.  Its full weights are split into model parts by metaseq's
tensor-parallel rules (the inverse of stitch_fsdp_ckpt.py
reshard_megatron_parts), then each part is flattened and sharded exactly as
fairscale does it:

* one FSDP wrapper at the root and one per layer (fsdp_path
  "decoder.layers.N"); each flattens the params it owns, in named_modules
  order, into flat_param_0 (flatten_params_wrapper.py FlatParameter:
  torch.cat of p.reshape(-1)); a tied param is left out and recorded in
  shared_param_info as (src, dst);
* each flat param is cut with torch.chunk(world) and the short tail chunks
  zero-padded to the first one's size (fully_sharded_data_parallel.py
  _get_shard), the padding recorded per shard;
* shard_metadata is local_metadata_dict()'s dict; the saved dict is
  metaseq trainer.state_dict()'s: cfg, model, criterion,
  optimizer_history, task_state, extra_state (with meter objects of
  metaseq.logging.meters), last_optimizer_state, shard_metadata.

Forms: fsdp (<prefix>model_part-<m>-shard<d>.pt), reshard (metaseq
reshard_fsdp.py with one output shard, still flat:
reshard-model_part-<m>.pt) and unflat (reshard_fsdp.py
--unflatten-weights: named weights, shard_metadata {}).

The oracle (.npz) holds every tensor the mount must show, merged as
stitch_fsdp_ckpt.py does with a fused qkv_proj split into q/k/v_proj as
HF's OPT conversion does; bf16 tensors are stored as their uint16 bits and
"__dtypes__" maps names to torch dtype names.
"""

import argparse
import collections
import json
import os
import re
import sys
import types
from pathlib import Path

import torch
import torch.nn.functional as F

DTYPES = {"fp16": torch.float16, "fp32": torch.float32,
          "bf16": torch.bfloat16}


def fake_metaseq_meters():
    """Meter objects pickled the way metaseq's extra_state["metrics"]
    pickles them (GLOBAL metaseq.logging.meters.<class> + BUILD), without
    metaseq installed."""
    names = ["metaseq", "metaseq.logging", "metaseq.logging.meters"]
    for n in names:
        sys.modules.setdefault(n, types.ModuleType(n))
    mod = sys.modules["metaseq.logging.meters"]

    class AverageMeter:
        def __init__(self, val, n):
            self.val, self.count, self.sum = val, n, val * n
    AverageMeter.__module__ = "metaseq.logging.meters"
    AverageMeter.__qualname__ = AverageMeter.__name__ = "AverageMeter"
    mod.AverageMeter = AverageMeter
    return AverageMeter


class _Evil:
    """A value whose unpickling would run a command."""
    def __reduce__(self):
        return (os.system, ("true",))


def full_model(a, g, dt):
    """The consolidated (one model part) weights, in module order."""
    H, F_, V, P = a.hidden, a.ffn, a.vocab, a.positions

    def r(*shape):
        return (torch.randn(shape, generator=g) * 0.5).to(dt)

    w = collections.OrderedDict()
    w["decoder.embed_tokens.weight"] = r(V, H)
    w["decoder.embed_positions.weight"] = r(P, H)
    if a.odd_params:       # multi-axis and 0-d params straddling shards
        w["decoder.extra.weight"] = r(3, 5, 7)
        w["decoder.scale"] = r()
    for i in range(a.layers):
        p = f"decoder.layers.{i}."
        for n in ("k_proj", "v_proj", "q_proj"):
            w[p + f"self_attn.{n}.weight"] = r(H, H)
            w[p + f"self_attn.{n}.bias"] = r(H)
        w[p + "self_attn.out_proj.weight"] = r(H, H)
        w[p + "self_attn.out_proj.bias"] = r(H)
        w[p + "self_attn_layer_norm.weight"] = r(H)
        w[p + "self_attn_layer_norm.bias"] = r(H)
        w[p + "fc1.weight"] = r(F_, H)
        w[p + "fc1.bias"] = r(F_)
        w[p + "fc2.weight"] = r(H, F_)
        w[p + "fc2.bias"] = r(H)
        w[p + "final_layer_norm.weight"] = r(H)
        w[p + "final_layer_norm.bias"] = r(H)
    w["decoder.layer_norm.weight"] = r(H)
    w["decoder.layer_norm.bias"] = r(H)
    return w


def part_of(name, t, m, M):
    """Model part m of a full weight: metaseq's megatron TP rules (what
    reshard_megatron_parts concatenates back)."""
    def rows(x, dim):
        return x.chunk(M, dim=dim)[m].clone()
    if "fc1" in name or any(k in name for k in ("k_proj", "q_proj", "v_proj")):
        return rows(t, 0)
    if ("fc2" in name or "out_proj" in name) and name.endswith("weight"):
        return rows(t, 1)
    if "embed_tokens.weight" in name:
        return rows(t, 0)
    return t.clone()


def part_weights(full, m, M, fused):
    """Part m's weights in its modules' registration order; with fused,
    each layer's k/v/q become one qkv_proj = [k; v; q] (metaseq's
    SequeuceParallelTransformerBlock layout)."""
    out = collections.OrderedDict()
    for name, t in full.items():
        if fused and re.search(r"self_attn\.[kvq]_proj\.", name):
            base = re.sub(r"\.[kvq]_proj\.", ".qkv_proj.", name)
            if base not in out:
                out[base] = torch.cat([
                    part_of(n, full[n], m, M) for n in
                    (re.sub(r"\.[kvq]_proj\.", f".{k}_proj.", name)
                     for k in "kvq")], 0)
            continue
        out[name] = part_of(name, t, m, M)
    return out


def fsdp_groups(weights, layers):
    """(fsdp_path, [(name relative to it, tensor)]) per FSDP wrapper, root
    first, as FSDP.named_modules() lists them."""
    root, per_layer = [], [[] for _ in range(layers)]
    for name, t in weights.items():
        if name.startswith("decoder.layers."):
            i = int(name.split(".")[2])
            per_layer[i].append((name.split(".", 3)[3], t))
        else:
            root.append((name, t))
    return [("", root)] + [(f"decoder.layers.{i}", g)
                           for i, g in enumerate(per_layer)]


def get_shard(flat, rank, world):
    """fairscale FullyShardedDataParallel._get_shard."""
    chunks = list(torch.flatten(flat).chunk(world))
    while len(chunks) < world:
        chunks.append(chunks[0].new_empty(0))
    num_to_pad = chunks[0].numel() - chunks[rank].numel()
    shard = chunks[rank].clone()
    if num_to_pad > 0:
        shard = F.pad(shard, [0, num_to_pad])
    return shard, num_to_pad


def make(a):
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    dt = DTYPES[a.dtype]
    g = torch.Generator().manual_seed(a.seed)
    full = full_model(a, g, dt)
    M = a.parts
    D = a.shards if a.form == "fsdp" else 1
    prefix = a.prefix if a.form == "fsdp" else "reshard-"
    AverageMeter = fake_metaseq_meters()
    version = torch.tensor([3.0])
    tied = [("decoder.embed_tokens.weight",
             "decoder.output_projection.weight")]
    params_desc = None

    for m in range(M):
        weights = part_weights(full, m, M, a.fused_qkv)
        groups = fsdp_groups(weights, a.layers)
        flats = []
        for path, members in groups:
            flat = torch.cat([t.reshape(-1) for _, t in members], 0)
            flats.append((path, members, flat))
        if m == 0:
            params_desc = [(path, members) for path, members, _ in flats]
        for d in range(D):
            model = collections.OrderedDict()
            param_metadata = []
            for path, members, flat in flats:
                key = f"{path}.flat_param_0" if path else "flat_param_0"
                shard, pad = get_shard(flat, d, D)
                if a.no_pad and pad:
                    # metaseq reshard_mp.py --no-pad: the short last
                    # shard stays short
                    shard, pad = shard[:shard.numel() - pad].clone(), 0
                if a.form != "unflat":
                    model[key] = shard
                names = [n for n, _ in members]
                shapes = [t.size() for _, t in members]
                numels = [t.numel() for _, t in members]
                if a.bad_numels and path == "decoder.layers.0":
                    names, shapes, numels = names[:-1], shapes[:-1], numels[:-1]
                if a.bad_padding is not None and path == "decoder.layers.0":
                    pad = a.bad_padding
                param_metadata.append({
                    "fsdp_path": path,
                    "params": {"flat_param_0": {
                        "names": names, "shapes": shapes,
                        "numels": numels, "padding": pad}},
                    "no_broadcast_optim_state": False,
                    "shared_param_info": tied if path == "" else [],
                })
                if path == "":
                    model["decoder.version"] = version.clone()
            if a.form == "unflat":
                # reshard_fsdp.py: t.view(shape) of the unsharded flat
                # param's split: every weight of a wrapper shares its
                # storage, at an offset
                for path, members, flat in flats:
                    pieces = flat.split([t.numel() for _, t in members])
                    for (n, t), piece in zip(members, pieces):
                        model[f"{path}.{n}" if path else n] = \
                            piece.view(t.shape)
                model["decoder.version"] = version.clone()
            sd = {
                "cfg": {"model": {"_name": "transformer_lm_megatron",
                                  "decoder_embed_dim": a.hidden,
                                  "decoder_layers": a.layers},
                        "distributed_training": {
                            "distributed_world_size": M * D,
                            "model_parallel_size": M}},
                "model": model,
                "criterion": None,
                "optimizer_history": [{
                    "criterion_name": "VocabParallelCrossEntropyCriterion",
                    "optimizer_name": "MemoryEfficientFP16Optimizer",
                    "lr_scheduler_state": {"best": None},
                    "num_updates": 10}],
                "task_state": {},
                "extra_state": {
                    "metrics": collections.OrderedDict(
                        loss=AverageMeter(2.5, 4)),
                    "previous_training_time": 12.5,
                    "train_iterator": {"epoch": 1, "iterations_in_epoch": 10,
                                       "shuffle": True},
                    "val_loss": None},
                "last_optimizer_state": {
                    "state": {0: {"step": 10,
                                  "exp_avg": torch.zeros(
                                      flats[0][2].numel() // D + 1)}},
                    "param_groups": [{"lr": 1e-4, "params": [0]}],
                    "loss_scale": 4.0},
            }
            if a.namespace:
                sd["args"] = argparse.Namespace(arch="transformer_lm",
                                                model_parallel_size=M)
            if a.evil_global:
                sd["extra_state"]["evil"] = _Evil()
            if a.form == "unflat":
                sd["shard_metadata"] = {}
            elif not a.no_metadata:
                sd["shard_metadata"] = {"param_metadata": param_metadata,
                                        "buffer_names": ["decoder.version"]}
            name = (f"{prefix}model_part-{m}-shard{d}.pt" if a.form == "fsdp"
                    else f"{prefix}model_part-{m}.pt")
            torch.save(sd, out / name)

    if a.params_json:
        write_params(a, params_desc, tied)
    if a.oracle:
        write_oracle(a, full, version)


def write_params(a, groups, tied):
    """-o params=FILE: the flat-param map, or shard_metadata as JSON."""
    if a.params_form == "map":
        desc = {}
        for path, members in groups:
            key = f"{path}.flat_param_0" if path else "flat_param_0"
            desc[key] = {"names": [n for n, _ in members],
                         "shapes": [list(t.shape) for _, t in members]}
    else:
        desc = {"param_metadata": [
            {"fsdp_path": path,
             "params": {"flat_param_0": {
                 "names": [n for n, _ in members],
                 "shapes": [list(t.shape) for _, t in members],
                 "numels": [t.numel() for _, t in members],
                 "padding": 0}},
             "no_broadcast_optim_state": False,
             "shared_param_info": [list(p) for p in tied] if path == ""
             else []}
            for path, members in groups],
            "buffer_names": ["decoder.version"]}
    Path(a.params_json).write_text(json.dumps(desc, indent=1))


def write_oracle(a, full, version):
    """What the mount shows: the full weights (stitched parts, fused qkv
    split), the tied output projection when shard_metadata (or a
    fairscale-form params file) says it is shared, and the buffer."""
    want = collections.OrderedDict(full)
    shared = a.form != "unflat" and (not a.no_metadata
                                     or a.params_form == "fairscale")
    if shared:
        want["decoder.output_projection.weight"] = \
            full["decoder.embed_tokens.weight"]
    want["decoder.version"] = version
    arrays, dtypes = {}, {}
    for name, t in want.items():
        dtypes[name] = str(t.dtype).replace("torch.", "")
        arrays[name] = (t.view(torch.uint16) if t.dtype == torch.bfloat16
                        else t).numpy()
    import numpy as np
    arrays["__dtypes__"] = np.array(json.dumps(dtypes))
    np.savez(a.oracle, **arrays)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--parts", type=int, default=2)
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--ffn", type=int, default=40)
    p.add_argument("--vocab", type=int, default=50)
    p.add_argument("--positions", type=int, default=18)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp16")
    p.add_argument("--form", choices=["fsdp", "reshard", "unflat"],
                   default="fsdp")
    p.add_argument("--prefix", default="checkpoint_last-")
    p.add_argument("--fused-qkv", action="store_true")
    p.add_argument("--odd-params", action="store_true",
                   help="add a [3,5,7] and a 0-d param to the root")
    p.add_argument("--no-metadata", action="store_true")
    p.add_argument("--no-pad", action="store_true",
                   help="leave short shards unpadded (reshard_mp.py "
                        "--no-pad); use with --no-metadata")
    p.add_argument("--params-json", help="write -o params=FILE here")
    p.add_argument("--params-form", choices=["map", "fairscale"],
                   default="map")
    p.add_argument("--namespace", action="store_true",
                   help="add args=argparse.Namespace(...)")
    p.add_argument("--evil-global", action="store_true",
                   help="add a value that unpickles as os.system(...)")
    p.add_argument("--bad-numels", action="store_true",
                   help="leave layer 0's last param out of shard_metadata")
    p.add_argument("--bad-padding", type=int, metavar="INT",
                   help="write layer 0's padding as INT in shard_metadata")
    p.add_argument("--oracle", help="write the expected tensors here (.npz)")
    p.add_argument("--seed", type=int, default=1)
    make(p.parse_args())


if __name__ == "__main__":
    main()
