#!/usr/bin/env python3
"""Writes a small OPT checkpoint as metaseq trains and releases one, with
the real fairscale FullyShardedDataParallel (run it in .venv-mcore, which
has torch and fairscale), and the oracles the tests compare against.

    make_opt_release.py OUT [--parts 2] [--dp 3] [--layers 2] [--hidden 32]
        [--ffn 64] [--heads 4] [--vocab 52] [--positions 20]
        [--separate-qkv] [--post-norm] [--untied]
        [--cfg dict|namespace|omegaconf] [--keep-training | --training-only]
        [--oracle DIR]
        [--drop-cfg FIELD] [--set-cfg FIELD=JSON] [--cfg-json JSON]
        [--part-set-cfg M:FIELD=JSON] [--dict-lines N]
        [--short-root-rows N]

Per model part m (metaseq's tensor-parallel split of the full weights,
qkv fused per part as [k_m; v_m; q_m] unless --separate-qkv), a module
with metaseq's names (decoder.embed_tokens, decoder.embed_positions,
decoder.layers.N.{self_attn.qkv_proj | k_proj, v_proj, q_proj, out_proj,
self_attn_layer_norm, fc1, fc2, final_layer_norm}, decoder.layer_norm,
decoder.output_projection tied to embed_tokens unless --untied) is wrapped
in fairscale FSDP - one wrapper per layer plus the root,
flatten_parameters=True, compute_dtype=torch.float16 - on --dp CPU ranks
over gloo.  Each rank's local_state_dict() and local_metadata_dict() are
the training shards (kept as checkpoint_last-model_part-<m>-shard<r>.pt
with --keep-training).  The release form is then derived from them as
metaseq's scripts/reshard_mp.py does with a target DDP size of 1: merge
the shards of each flat param with the padding stripped, .half(), pop
shard_metadata, add decoder.version, save reshard-model_part-<m>.pt.

cfg is metaseq's sections (common, model, distributed_training) as a
plain dict, cfg.model an argparse.Namespace, or all an OmegaConf
DictConfig made by OmegaConf.create (--cfg); --cfg-json merges a JSON
object into it first (sections merged key by key), so interpolations
(relative, long paths, chains) can be written as OmegaConf keeps them.
--part-set-cfg sets a cfg.model field in part M's files only.

Beside the parts: dict.txt as fairseq/metaseq write a dictionary ("<symbol>
<count>" lines; metaseq's Dictionary adds 4 special symbols before them),
--dict-lines lines (default vocab - 4: the dictionary fills the vocab),
and stand-in vocab.json and merges.txt.  --short-root-rows N cuts N rows
(N x hidden elements) off the end of every part's released root flat
param: a truncated release, which must be refused.

Oracles, under ORACLE (--oracle, default OUT.oracle; not in OUT):
  full.pt      the consolidated fp16 weights (metaseq names, k/v/q_proj
               apart), as generated
  part<m>.pt   part m unflattened by fairscale itself
               (FullyShardedDataParallel.consolidate_shard_weights of the
               training shards, .half()), as metaseq holds the part
  model.json   the hyperparameters
"""

import argparse
import collections
import json
import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
# metaseq's extra_state meters, pickled as metaseq pickles them
from make_metaseq_checkpoint import fake_metaseq_meters as fake_meters  # noqa: E402


def cfg_model(a, M):
    return {
        "_name": "transformer_lm" if a.separate_qkv
        else "transformer_lm_megatron",
        "decoder_layers": a.layers,
        "decoder_embed_dim": a.hidden,
        "decoder_ffn_embed_dim": a.ffn,
        "decoder_attention_heads": a.heads,
        "decoder_learned_pos": True,
        "decoder_normalize_before": not a.post_norm,
        "no_decoder_final_norm": False,
        "share_decoder_input_output_embed": not a.untied,
        "no_scale_embedding": True,
        "max_target_positions": a.positions,
        "activation_fn": "relu",
        "dropout": 0.1,
        "model_parallel_size": "${common.model_parallel_size}"
        if a.cfg == "omegaconf" else M,
    }


def make_cfg(a, M, m):
    model = cfg_model(a, M)
    for field in a.drop_cfg:
        model.pop(field)
    sets = list(a.set_cfg)
    for item in a.part_set_cfg:
        part, setting = item.split(":", 1)
        if int(part) == m:
            sets.append(setting)
    for item in sets:
        field, value = item.split("=", 1)
        model[field] = json.loads(value)
    cfg = {"common": {"model_parallel_size": M, "fp16": True},
           "model": model,
           "distributed_training": {"distributed_world_size": M * a.dp}}
    for section, value in json.loads(a.cfg_json).items():
        if isinstance(value, dict) and isinstance(cfg.get(section), dict):
            cfg[section].update(value)
        else:
            cfg[section] = value
    if a.cfg == "namespace":
        cfg["model"] = argparse.Namespace(**cfg["model"])
    elif a.cfg == "omegaconf":
        from omegaconf import OmegaConf
        cfg = OmegaConf.create(cfg)
    return cfg


def full_weights(a):
    """The consolidated model, fp16 values (so .half() is exact)."""
    g = torch.Generator().manual_seed(a.seed)
    H, F_, V, P = a.hidden, a.ffn, a.vocab, a.positions + 2

    def r(*shape):
        return (torch.randn(shape, generator=g) * 0.2).half()
    w = collections.OrderedDict()
    w["decoder.embed_tokens.weight"] = r(V, H)
    w["decoder.embed_positions.weight"] = r(P, H)
    for i in range(a.layers):
        p = f"decoder.layers.{i}."
        for n in ("k_proj", "v_proj", "q_proj", "out_proj"):
            w[p + f"self_attn.{n}.weight"] = r(H, H)
            w[p + f"self_attn.{n}.bias"] = r(H)
        for n, o, i_ in (("fc1", F_, H), ("fc2", H, F_)):
            w[p + f"{n}.weight"] = r(o, i_)
            w[p + f"{n}.bias"] = r(o)
        for n in ("self_attn_layer_norm", "final_layer_norm"):
            w[p + f"{n}.weight"] = 1 + r(H)
            w[p + f"{n}.bias"] = r(H)
    if not a.post_norm:
        w["decoder.layer_norm.weight"] = 1 + r(H)
        w["decoder.layer_norm.bias"] = r(H)
    if a.untied:
        w["decoder.output_projection.weight"] = r(V, H)
    return w


def part_tensor(name, t, m, M):
    """Part m of a full weight by metaseq's megatron rules (column-parallel
    q/k/v, fc1, embeddings and output projection on dim 0; row-parallel
    out_proj and fc2 weights on dim 1; the rest whole)."""
    if any(k in name for k in ("k_proj", "v_proj", "q_proj", "fc1",
                               "embed_tokens", "output_projection")):
        return t.chunk(M, 0)[m].clone()
    if ("out_proj" in name or "fc2" in name) and name.endswith("weight"):
        return t.chunk(M, 1)[m].clone()
    return t.clone()


class Attn(nn.Module):
    def __init__(self, H, Hp, fused):
        super().__init__()
        if fused:
            self.qkv_proj = nn.Linear(H, 3 * Hp)
        else:
            self.k_proj = nn.Linear(H, Hp)
            self.v_proj = nn.Linear(H, Hp)
            self.q_proj = nn.Linear(H, Hp)
        self.out_proj = nn.Linear(Hp, H)


class Layer(nn.Module):
    def __init__(self, H, Hp, Fp, fused):
        super().__init__()
        self.self_attn = Attn(H, Hp, fused)
        self.self_attn_layer_norm = nn.LayerNorm(H)
        self.fc1 = nn.Linear(H, Fp)
        self.fc2 = nn.Linear(Fp, H)
        self.final_layer_norm = nn.LayerNorm(H)


class Decoder(nn.Module):
    """Registration order as metaseq's TransformerDecoder."""
    def __init__(self, a, M):
        super().__init__()
        H, Hp, Fp, Vp = a.hidden, a.hidden // M, a.ffn // M, a.vocab // M
        self.register_buffer("version", torch.Tensor([3]))
        self.embed_tokens = nn.Embedding(Vp, H)
        self.embed_positions = nn.Embedding(a.positions + 2, H)
        self.layers = nn.ModuleList(
            Layer(H, Hp, Fp, not a.separate_qkv) for _ in range(a.layers))
        if not a.post_norm:
            self.layer_norm = nn.LayerNorm(H)
        self.output_projection = nn.Linear(H, Vp, bias=False)
        if not a.untied:
            self.output_projection.weight = self.embed_tokens.weight


class Model(nn.Module):
    def __init__(self, a, M):
        super().__init__()
        self.decoder = Decoder(a, M)


def part_state(a, full, m, M):
    """Part m's weights under the part module's names."""
    out = {}
    for name, t in full.items():
        out[name] = part_tensor(name, t, m, M)
    if not a.separate_qkv:
        for i in range(a.layers):
            p = f"decoder.layers.{i}.self_attn."
            for s in ("weight", "bias"):
                out[p + f"qkv_proj.{s}"] = torch.cat(
                    [out.pop(p + f"{k}_proj.{s}") for k in "kvq"], 0)
    if not a.untied:
        out["decoder.output_projection.weight"] = \
            out["decoder.embed_tokens.weight"]
    out["decoder.version"] = torch.Tensor([3])
    return out


def rank_main(rank, a, m, M, port, out):
    from fairscale.nn import FullyShardedDataParallel as FSDP
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=a.dp)
    torch.manual_seed(0)
    model = Model(a, M)
    model.load_state_dict(part_state(a, full_weights(a), m, M))
    model.half()    # fairscale's pure fp16 mode (compute_dtype fp16)
    kw = dict(flatten_parameters=True, compute_dtype=torch.float16,
              compute_device=torch.device("cpu"))
    for i, layer in enumerate(model.decoder.layers):
        model.decoder.layers[i] = FSDP(layer, **kw)
    model = FSDP(model, **kw)
    AverageMeter = fake_meters()
    state = {
        "cfg": make_cfg(a, M, m),
        "model": model.local_state_dict(),
        "shard_metadata": model.local_metadata_dict(),
        "criterion": None,
        "optimizer_history": [{"num_updates": 10}],
        "task_state": {},
        "extra_state": {"metrics": collections.OrderedDict(
            loss=AverageMeter(2.5, 4)), "train_iterator": {"epoch": 1}},
    }
    torch.save(state, out / f"checkpoint_last-model_part-{m}-shard{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def release(out, oracle, m, dp, keep, training_only=False, short_rows=0,
            hidden=0):
    """reshard_mp.py, target DDP size 1: merge the part's flat shards less
    their padding, .half(), pop shard_metadata, add decoder.version.  The
    part as metaseq holds it, unflattened by fairscale's own
    consolidate_shard_weights, goes to the oracle."""
    from fairscale.nn import FullyShardedDataParallel as FSDP
    fake_meters()
    paths = [out / f"checkpoint_last-model_part-{m}-shard{r}.pt"
             for r in range(dp)]
    shards = [torch.load(p, weights_only=False) for p in paths]
    part = FSDP.consolidate_shard_weights(
        [s["model"] for s in shards], [s["shard_metadata"] for s in shards])
    part = collections.OrderedDict((k, v.half()) for k, v in part.items())
    part.setdefault("decoder.version", torch.tensor([3.0]).half())
    torch.save(part, oracle / f"part{m}.pt")
    state = {k: v for k, v in shards[0].items() if k != "model"}
    pads = {}
    for inst in state["shard_metadata"]["param_metadata"]:
        for name, info in inst["params"].items():
            key = f"{inst['fsdp_path']}.{name}" if inst["fsdp_path"] else name
            pads[key] = [next(i for i in s["shard_metadata"]["param_metadata"]
                              if i["fsdp_path"] == inst["fsdp_path"])
                         ["params"][name]["padding"] for s in shards]
    model = collections.OrderedDict()
    for k, v in shards[0]["model"].items():
        if "flat_param" in k:
            parts = [s["model"][k] for s in shards]
            v = torch.cat([p[:p.numel() - pad] for p, pad in
                           zip(parts, pads[k])])
        if k == "flat_param_0" and short_rows:
            v = v[:v.numel() - short_rows * hidden].clone()
        model[k] = v.half()
    model.setdefault("decoder.version", torch.tensor([3.0]).half())
    state.pop("shard_metadata")
    state["model"] = model
    if not training_only:
        torch.save(state, out / f"reshard-model_part-{m}.pt")
    if not keep and not training_only:
        for p in paths:
            p.unlink()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--parts", type=int, default=2)
    p.add_argument("--dp", type=int, default=3,
                   help="FSDP ranks per part (3: the flat params pad)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--ffn", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=52)
    p.add_argument("--positions", type=int, default=20)
    p.add_argument("--separate-qkv", action="store_true")
    p.add_argument("--post-norm", action="store_true")
    p.add_argument("--untied", action="store_true")
    p.add_argument("--cfg", choices=["dict", "namespace", "omegaconf"],
                   default="namespace")
    p.add_argument("--keep-training", action="store_true",
                   help="keep the FSDP training shards too")
    p.add_argument("--training-only", action="store_true",
                   help="write only the FSDP training shards (with "
                        "shard_metadata), no release form")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--oracle")
    p.add_argument("--drop-cfg", action="append", default=[],
                   metavar="FIELD", help="leave FIELD out of cfg.model")
    p.add_argument("--set-cfg", action="append", default=[],
                   metavar="FIELD=JSON",
                   help="write FIELD of cfg.model as this value (the "
                        "weights stay those of the other arguments)")
    p.add_argument("--cfg-json", default="{}", metavar="JSON",
                   help="a JSON object merged into cfg (its sections key "
                        "by key) before OmegaConf.create")
    p.add_argument("--part-set-cfg", action="append", default=[],
                   metavar="M:FIELD=JSON",
                   help="as --set-cfg, in model part M's files only")
    p.add_argument("--dict-lines", type=int,
                   help="lines of dict.txt (default: vocab - 4)")
    p.add_argument("--short-root-rows", type=int, default=0, metavar="N",
                   help="cut N rows off the end of every part's released "
                        "root flat param")
    a = p.parse_args()
    out = Path(a.out)
    oracle = Path(a.oracle or f"{a.out}.oracle")
    out.mkdir(parents=True, exist_ok=True)
    oracle.mkdir(parents=True, exist_ok=True)
    M = a.parts
    torch.save(full_weights(a), oracle / "full.pt")
    (oracle / "model.json").write_text(json.dumps(vars(a)))
    for m in range(M):
        mp.spawn(rank_main, args=(a, m, M, free_port(), out),
                 nprocs=a.dp,
                 join=True)
        release(out, oracle, m, a.dp, a.keep_training, a.training_only,
                a.short_root_rows, a.hidden)
    for name in ("vocab.json", "merges.txt"):
        (out / name).write_text(f"{name} of the test tokenizer\n")
    lines = a.vocab - 4 if a.dict_lines is None else a.dict_lines
    text = "".join(f"{i} {1000 + lines - i}\n" for i in range(lines))
    for d in (out, oracle):
        (d / "dict.txt").write_text(text)


if __name__ == "__main__":
    main()
