#!/usr/bin/env python3
"""Write, load and compare real megatron-core MoE checkpoints on CPU.

Usage:
    make_moe_checkpoint.py save OUT --tp T --ep E [--etp X] [--pp P]
                           [--experts N] [--first-dense] [--layers L]
                           [--seed S] [--form sequential|te|grouped]
                           [--singleton] --format torch|torch_dist|zarr
    make_moe_checkpoint.py load CKPT --tp T --ep E [--etp X] [--pp P]
                           [--experts N] [--first-dense] [--layers L]
                           [--form sequential|te|grouped] [--singleton]
                           --format torch|torch_dist|zarr --dump FILE
    make_moe_checkpoint.py compare DUMP_A DUMP_B

The model: a tiny megatron-core 0.15 GPTModel (L layers, default 4;
hidden 64, 8 heads, 4 query groups, SwiGLU, RMSNorm, RoPE, vocab 1000)
whose MLPs are MoE layers: N experts (default 8) of ffn 32, top-2 routing
(sigmoid scores with an expert bias, so `mlp.router.expert_bias` exists),
the allgather token dispatcher, and one gated shared expert of ffn 64.
--first-dense makes layer 0 a dense MLP (moe_layer_freq [0, 1, 1, ...]:
a dist save keys every layer on its own); without it moe_layer_freq is 1
and a dist save stacks the layers.
Experts are megatron-core's SequentialMLP from the local (non-TE) spec:
the only expert module that runs without a GPU.  After initialisation
every expert weight gets its global expert index added, so that no two
experts (which EP ranks initialise from the same seed) are alike, and the
router's expert bias is drawn from the seed.

One process per rank (torch.multiprocessing) joined over gloo; the world
is pp * lcm(tp, ep * etp) ranks (at most 8).

save --format torch writes what Megatron-LM's --ckpt-format torch writes
(megatron/training/checkpointing.py: get_checkpoint_name,
generate_state_dict): every rank whose expert-data-parallel rank is 0
torch.saves {args (an argparse.Namespace), checkpoint_version 3.0,
iteration 1, model: model.state_dict_for_save_checkpoint(),
num_floating_point_operations_so_far 0} to
OUT/mp_rank_{tp:02d}[_{pp:03d}][_{ep:03d}]/model_optim_rng.pt (the PP
suffix when pp > 1, the EP suffix when ep > 1).  --form te or grouped
renames the SequentialMLP expert keys into TEGroupedMLP's
(`experts.linear_fc1.weight<i>`) or the legacy GroupedMLP's
(`experts.weight1` [hidden, L*2F] and `weight2` [L*F, hidden], the
per-expert matrices transposed in the layout GroupedMLP views them as);
those modules need a GPU to build.  torch_dist and zarr save
dist_checkpointing.save(model.sharded_state_dict()) to OUT; --singleton
passes the metadata singleton_local_shards (a key per expert, gated fc1
halves as _w/_v keys) to save and load.

load builds the model at the given layout (a different seed, so nothing
survives by chance) and loads CKPT strictly: torch format as Megatron-LM's
load_checkpoint does (each rank torch.loads its own rank file and calls
model.load_state_dict(sd['model'], strict=True); --form te/grouped keys
are renamed back to SequentialMLP's first), torch_dist and zarr with
dist_checkpointing.load(..., strict=StrictHandling.RAISE_ALL) (zarr with
zarr-python's load strategy).  Then each
rank writes FILE.rank<rank>.npz: every parameter and buffer of its state
dict under its global identity
(layer numbers global, expert indices global:
`decoder.layers.3.mlp.experts.local_experts.5.linear_fc1.weight` is
global expert 5) with its TP split (axis, rank, size, gated) in
FILE.rank<rank>.json.

compare merges each dump's shards into global tensors (TP axis, gated
fc1 as [W; V]; replicas must agree) and requires the same names, shapes
and bytes.  Prints "OK <tensors>".
"""

import argparse
import glob
import json
import math
import os
import re
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_mcore_checkpoint import _cpu_workarounds, pad_vocab, spawn_ranks  # noqa: E402

HIDDEN, HEADS, GROUPS, FFN, VOCAB, MAX_SEQ = 64, 8, 4, 128, 1000, 128
MOE_FFN, SHARED_FFN = 32, 64


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def world_of(a):
    return a.pp * math.lcm(a.tp, a.ep * a.etp)


def moe_pattern(a):
    """megatron-core's moe_layer_freq: 1 (every layer MoE: the layers are
    alike, and a dist save stacks them, (L, E, out, in)), or a list with
    layer 0 dense (every layer keyed on its own, (E, out, in))."""
    if not a.first_dense:
        return 1
    return [0 if i == 0 else 1 for i in range(a.layers)]


def _moe_workarounds():
    """megatron-core 0.15.3 without Transformer Engine: moe_utils imports
    te_general_gemm inside a try and leaves the name undefined when TE is
    missing (the router then fails with NameError); model_parallel_config
    calls warnings.warn without importing warnings (ep > 1 and tp > 1)."""
    import warnings

    import megatron.core.model_parallel_config as mpc
    import megatron.core.transformer.moe.moe_utils as mu
    if not hasattr(mu, "te_general_gemm"):
        mu.te_general_gemm = None
    if not hasattr(mpc, "warnings"):
        mpc.warnings = warnings


def build_model(a, seed):
    import torch
    import torch.nn.functional as F
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.transformer import TransformerConfig

    torch.manual_seed(seed)
    config = TransformerConfig(
        num_layers=a.layers, hidden_size=HIDDEN, ffn_hidden_size=FFN,
        num_attention_heads=HEADS, num_query_groups=GROUPS,
        gated_linear_unit=True, activation_func=F.silu,
        normalization="RMSNorm", add_bias_linear=False,
        tensor_model_parallel_size=a.tp, pipeline_model_parallel_size=a.pp,
        pipeline_dtype=torch.float32 if a.pp > 1 else None,
        num_moe_experts=a.experts, **moe_fields(a),
        use_cpu_initialization=True, hidden_dropout=0.0,
        attention_dropout=0.0, params_dtype=torch.float32, bf16=False,
        fp16=False, sequence_parallel=False,
        gradient_accumulation_fusion=False, bias_activation_fusion=False,
        masked_softmax_fusion=False, bias_dropout_fusion=False,
        apply_rope_fusion=False, persist_layer_norm=False,
    )
    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False,
                                      normalization="RMSNorm")
    for ls in spec.layer_specs:
        mlp = ls.submodules.mlp
        if getattr(mlp.submodules, "shared_experts", None) is not None:
            mlp.submodules.shared_experts.params = {"gate": True}
    pp_rank = ps.get_pipeline_model_parallel_rank()
    model = GPTModel(
        config=config, transformer_layer_spec=spec,
        vocab_size=pad_vocab(VOCAB, a.tp), max_sequence_length=MAX_SEQ,
        pre_process=pp_rank == 0, post_process=pp_rank == a.pp - 1,
        share_embeddings_and_output_weights=False,
        position_embedding_type="rope")
    # experts told apart: global expert g gets g added; the router's
    # expert bias (zeros at init) drawn from the seed, so that a load that
    # missed it shows
    ep_rank = ps.get_expert_model_parallel_rank()
    with torch.no_grad():
        for layer in model.decoder.layers:
            router = getattr(layer.mlp, "router", None)
            if getattr(router, "expert_bias", None) is not None:
                router.expert_bias.copy_(torch.randn(router.expert_bias.shape))
            experts = getattr(layer.mlp, "experts", None)
            if experts is None:
                continue
            L = experts.num_local_experts
            for i, e in enumerate(experts.local_experts):
                for p in e.parameters():
                    p.add_(float(ep_rank * L + i + 1))
    return model


def moe_fields(a):
    """The MoE settings megatron-core's TransformerConfig and Megatron-LM's
    args both name alike (the expert count they name apart)."""
    return dict(
        expert_model_parallel_size=a.ep, expert_tensor_parallel_size=a.etp,
        moe_router_topk=2, moe_ffn_hidden_size=MOE_FFN,
        moe_shared_expert_intermediate_size=SHARED_FFN,
        moe_router_score_function="sigmoid",
        moe_router_enable_expert_bias=True,
        moe_token_dispatcher_type="allgather", moe_grouped_gemm=False,
        moe_layer_freq=moe_pattern(a))


def megatron_lm_args(a):
    """The args a Megatron-LM run of this model saves (the fields its
    checkpointing and converters read)."""
    import torch
    return argparse.Namespace(
        num_layers=a.layers, hidden_size=HIDDEN, ffn_hidden_size=FFN,
        num_attention_heads=HEADS, group_query_attention=True,
        num_query_groups=GROUPS, kv_channels=HIDDEN // HEADS,
        norm_epsilon=1e-5, rotary_base=10000, rotary_percent=1.0,
        max_position_embeddings=MAX_SEQ, seq_length=MAX_SEQ,
        untie_embeddings_and_output_weights=True, swiglu=True,
        normalization="RMSNorm", position_embedding_type="rope",
        add_bias_linear=False, add_qkv_bias=False,
        padded_vocab_size=pad_vocab(VOCAB, a.tp), vocab_size=VOCAB,
        make_vocab_size_divisible_by=128,
        tensor_model_parallel_size=a.tp, pipeline_model_parallel_size=a.pp,
        virtual_pipeline_model_parallel_size=None,
        num_experts=a.experts, **moe_fields(a),
        params_dtype=torch.float32, bf16=False, fp16=False,
        use_dist_ckpt=False, ckpt_format="torch", iteration=1)


def rank_dir(tp_rank, pp_rank, ep_rank, pp, ep):
    """Megatron-LM's get_checkpoint_name, the directory part."""
    name = f"mp_rank_{tp_rank:02d}"
    if pp > 1:
        name += f"_{pp_rank:03d}"
    if ep > 1:
        name += f"_{ep_rank:03d}"
    return name


# SequentialMLP key <-> the other expert modules' keys
SEQ = re.compile(r"^(.*\.mlp\.experts\.)local_experts\.(\d+)\.(linear_fc[12])\.(weight|_extra_state)$")


def to_form(sd, form, L):
    """SequentialMLP's state dict keys in `form` (te, grouped)."""
    import torch
    if form == "sequential":
        return sd
    out, experts = {}, {}
    for k, v in sd.items():
        m = SEQ.match(k)
        if not m:
            out[k] = v
            continue
        pre, i, fc, what = m.group(1), int(m.group(2)), m.group(3), m.group(4)
        if what == "_extra_state":
            if form == "te":
                out.setdefault(f"{pre}{fc}._extra_state", None)
            continue
        if form == "te":
            out[f"{pre}{fc}.weight{i}"] = v
        else:
            experts.setdefault((pre, fc), {})[i] = v
    for (pre, fc), ws in experts.items():
        assert sorted(ws) == list(range(L)), sorted(ws)
        # GroupedMLP views weight1 [hidden, L*X] as [L, hidden, X] and
        # weight2 [L*F, hidden] as [L, F, hidden]: expert i's (out, in)
        # matrix transposed
        st = torch.stack([ws[i].t() for i in range(L)]).contiguous()
        if fc == "linear_fc1":
            out[f"{pre}weight1"] = st.reshape(st.shape[1], -1)
        else:
            out[f"{pre}weight2"] = st.reshape(-1, st.shape[2])
    return out


TE = re.compile(r"^(.*\.mlp\.experts\.)(linear_fc[12])\.(weight(\d+)|_extra_state)$")
GROUPED = re.compile(r"^(.*\.mlp\.experts\.)weight([12])$")


def from_form(sd, model_sd):
    """Any form's expert keys back to SequentialMLP's (model_sd: the
    model's own state dict, for the shapes)."""
    out = {}
    for k, v in sd.items():
        m, g = TE.match(k), GROUPED.match(k)
        if m:
            pre, fc = m.group(1), m.group(2)
            if m.group(4) is not None:
                out[f"{pre}local_experts.{int(m.group(4))}.{fc}.weight"] = v
            continue
        if g:
            pre, fc = g.group(1), f"linear_fc{g.group(2)}"
            i = 0
            while f"{pre}local_experts.{i}.{fc}.weight" in model_sd:
                i += 1
            L = i
            shape = model_sd[f"{pre}local_experts.0.{fc}.weight"].shape  # (out, in)
            view = v.reshape(L, shape[1], shape[0])
            for i in range(L):
                out[f"{pre}local_experts.{i}.{fc}.weight"] = view[i].t().contiguous()
            continue
        out[k] = v
    # the _extra_state entries SequentialMLP's load expects
    for k in model_sd:
        if k.endswith("._extra_state") and k not in out:
            out[k] = None
    return out


def dump(model, a, path):
    """Every parameter under its global identity, with its TP split."""
    import numpy as np
    import torch
    from megatron.core import parallel_state as ps

    rank = torch.distributed.get_rank()
    ep_rank = ps.get_expert_model_parallel_rank()
    tp_rank, tp = ps.get_tensor_model_parallel_rank(), a.tp
    etp_rank, etp = ps.get_expert_tensor_parallel_rank(), a.etp
    offset = {}
    for li, layer in enumerate(model.decoder.layers):
        offset[li] = layer.layer_number - 1
    arrays, meta = {}, {}
    # parameters and persistent buffers (the router's expert_bias)
    for k, p in model.state_dict(keep_vars=True).items():
        if not isinstance(p, torch.Tensor) or k.endswith("_extra_state"):
            continue
        m = re.match(r"^decoder\.layers\.(\d+)\.(.*)$", k)
        name = k
        if m:
            name = f"decoder.layers.{offset[int(m.group(1))]}.{m.group(2)}"
        is_expert = ".mlp.experts.local_experts." in name
        if is_expert:
            L = a.experts // a.ep
            name = re.sub(r"local_experts\.(\d+)\.",
                          lambda x: f"local_experts.{ep_rank * L + int(x.group(1))}.",
                          name)
        split = getattr(p, "tensor_model_parallel", False)
        axis = getattr(p, "partition_dim", -1) if split else -1
        size, r = (etp, etp_rank) if is_expert else (tp, tp_rank)
        arrays[name] = p.detach().cpu().numpy()
        meta[name] = dict(axis=axis if size > 1 else -1, rank=r, size=size,
                          gated=name.endswith("linear_fc1.weight"))
    np.savez(f"{path}.rank{rank}.npz", **arrays)
    with open(f"{path}.rank{rank}.json", "w") as f:
        json.dump(meta, f)


def _init(rank, world, port, a):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    _cpu_workarounds()
    _moe_workarounds()
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    dist.init_process_group("gloo", rank=rank, world_size=world)
    ps.initialize_model_parallel(
        tensor_model_parallel_size=a.tp, pipeline_model_parallel_size=a.pp,
        expert_model_parallel_size=a.ep, expert_tensor_parallel_size=a.etp)


def _done():
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    dist.barrier()
    ps.destroy_model_parallel()
    dist.destroy_process_group()


def sd_metadata(a):
    """The sharded state dict's metadata: --singleton asks for one key per
    expert and the gated fc1 halves as _w/_v keys."""
    return {"singleton_local_shards": True} if a.singleton else None


def _save_worker(rank, world, port, a):
    _init(rank, world, port, a)
    import torch
    import torch.distributed as dist
    from megatron.core import dist_checkpointing
    from megatron.core import parallel_state as ps

    model = build_model(a, a.seed)
    if a.format == "torch":
        # checkpointing.py (core_v0.15.3): ranks whose expert-data-parallel
        # rank is 0 write their file
        if ps.get_expert_data_parallel_rank() == 0:
            d = os.path.join(a.path, rank_dir(
                ps.get_tensor_model_parallel_rank(),
                ps.get_pipeline_model_parallel_rank(),
                ps.get_expert_model_parallel_rank(), a.pp, a.ep))
            os.makedirs(d, exist_ok=True)
            sd = to_form(model.state_dict_for_save_checkpoint(), a.form,
                         a.experts // a.ep)
            torch.save({"args": megatron_lm_args(a), "checkpoint_version": 3.0,
                        "iteration": 1, "model": sd,
                        "num_floating_point_operations_so_far": 0},
                       os.path.join(d, "model_optim_rng.pt"))
    else:
        if rank == 0:
            os.makedirs(a.path, exist_ok=True)
        dist.barrier()
        strategy = ("zarr", 1) if a.format == "zarr" else None
        dist_checkpointing.save(model.sharded_state_dict(metadata=sd_metadata(a)),
                                a.path, sharded_strategy=strategy)
    _done()


def _load_worker(rank, world, port, a):
    _init(rank, world, port, a)
    import torch
    from megatron.core import dist_checkpointing
    from megatron.core import parallel_state as ps

    model = build_model(a, a.seed + 1)
    if a.format == "torch":
        path = os.path.join(a.path, rank_dir(
            ps.get_tensor_model_parallel_rank(),
            ps.get_pipeline_model_parallel_rank(),
            ps.get_expert_model_parallel_rank(), a.pp, a.ep),
            "model_optim_rng.pt")
        sd = torch.load(path, map_location="cpu", weights_only=False)
        args = sd["args"]
        assert args.tensor_model_parallel_size == a.tp, path
        assert args.pipeline_model_parallel_size == a.pp, path
        assert getattr(args, "expert_model_parallel_size", 1) == a.ep, path
        etp = getattr(args, "expert_tensor_parallel_size", None)
        assert (etp if etp is not None else a.tp) == a.etp, path
        state = sd["model"]
        if a.form != "sequential":
            state = from_form(state, model.state_dict())
        model.load_state_dict(state, strict=True)
    else:
        from megatron.core.dist_checkpointing.validation import StrictHandling
        strategy = None
        if a.format == "zarr":
            # zarr-python's loader (the default one needs tensorstore)
            from megatron.core.dist_checkpointing.strategies.zarr import (
                ZarrLoadShardedStrategy)
            strategy = ZarrLoadShardedStrategy()
        loaded = dist_checkpointing.load(
            model.sharded_state_dict(metadata=sd_metadata(a)), a.path,
            sharded_strategy=strategy, strict=StrictHandling.RAISE_ALL)
        model.load_state_dict(loaded, strict=False)
    dump(model, a, a.dump)
    _done()


def merge(parts):
    """The global tensor from (meta, array) shards of one parameter."""
    import numpy as np
    meta0 = parts[0][0]
    if meta0["axis"] < 0:
        for m, v in parts[1:]:
            assert np.array_equal(v, parts[0][1]), "replicas differ"
        return parts[0][1]
    size = meta0["size"]
    by_rank = {}
    for m, v in parts:
        if m["rank"] in by_rank:
            assert np.array_equal(by_rank[m["rank"]], v), "replicas differ"
        by_rank[m["rank"]] = v
    assert sorted(by_rank) == list(range(size)), sorted(by_rank)
    vs = [by_rank[r] for r in range(size)]
    axis = meta0["axis"]
    if meta0["gated"]:
        halves = [np.split(v, 2, axis=0) for v in vs]
        return np.concatenate([h[0] for h in halves] + [h[1] for h in halves], 0)
    return np.concatenate(vs, axis)


def load_dump(path):
    import numpy as np
    shards = {}
    for npz in sorted(glob.glob(glob.escape(str(path)) + ".rank*.npz")):
        meta = json.load(open(npz[:-4] + ".json"))
        arr = np.load(npz)
        for k in arr.files:
            shards.setdefault(k, []).append((meta[k], arr[k]))
    assert shards, f"{path}: no dump"
    return {k: merge(v) for k, v in shards.items()}


def compare(a, b):
    import numpy as np
    x, y = load_dump(a), load_dump(b)
    assert set(x) == set(y), sorted(set(x) ^ set(y))
    for k in x:
        assert x[k].shape == y[k].shape, (k, x[k].shape, y[k].shape)
        assert np.array_equal(x[k], y[k]), k
    print("OK", len(x))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for cmd in ("save", "load"):
        p = sub.add_parser(cmd)
        p.add_argument("path")
        p.add_argument("--tp", type=int, default=1)
        p.add_argument("--ep", type=int, default=1)
        p.add_argument("--etp", type=int)
        p.add_argument("--pp", type=int, default=1)
        p.add_argument("--experts", type=int, default=8)
        p.add_argument("--layers", type=int, default=4)
        p.add_argument("--first-dense", action="store_true")
        p.add_argument("--seed", type=int, default=1234)
        p.add_argument("--form", choices=["sequential", "te", "grouped"],
                       default="sequential")
        p.add_argument("--format", required=True,
                       choices=["torch", "torch_dist", "zarr"])
        p.add_argument("--singleton", action="store_true")
        if cmd == "load":
            p.add_argument("--dump", required=True)
    p = sub.add_parser("compare")
    p.add_argument("a")
    p.add_argument("b")
    a = ap.parse_args(argv)
    if a.cmd == "compare":
        compare(a.a, a.b)
        return 0
    a.etp = a.etp or a.tp
    a.path = os.path.abspath(a.path)
    if a.cmd == "load":
        a.dump = os.path.abspath(a.dump)
    world = world_of(a)
    if world > 8:
        ap.error(f"the layout needs {world} processes; at most 8")
    spawn_ranks(_save_worker if a.cmd == "save" else _load_worker,
                (world, _free_port(), a), world)
    if a.cmd == "save":
        print(f"saved {a.format} tp={a.tp} ep={a.ep} etp={a.etp} pp={a.pp} "
              f"to {a.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
