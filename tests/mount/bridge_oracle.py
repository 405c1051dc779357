#!/usr/bin/env python3
"""The Megatron-Bridge oracle: NVIDIA Megatron-Bridge's own HF <->
megatron-core conversion, on the CPU, for the tests and the benchmark to
compare reshardfs's bridge views against.

Usage:
    python bridge_oracle.py convert HFDIR OUT.npz [--tp N] [--keys state|sharded]
                                     [--dtype float32|bfloat16] [--save-mcore DIR]
    python bridge_oracle.py export MCORE_CKPT HFOUT --like HFDIR [--dtype ...]
    python bridge_oracle.py families

Exit status 3 (and one line on stderr) when Megatron-Bridge has no bridge
for HFDIR's architecture (0.6.2: Mixtral, Phi-3).

convert: AutoBridge.from_hf_pretrained(HFDIR) -> its megatron-core provider
(GPTModel, megatron-core's local spec: no Transformer Engine, fusions and
moe_grouped_gemm off, the allgather token dispatcher) -> Megatron-Bridge's
load_weights_hf_to_megatron fills it -> every tensor of the model's
state_dict (--keys state, the default: module names such as
decoder.layers.0.self_attention.linear_qkv.weight, experts as
decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight) or of its
sharded_state_dict (--keys sharded: the names and global shapes a
megatron-core dist checkpoint stores: layers stacked along a first axis,
decoder.layers.self_attention.linear_qkv.weight [L, ...], with the local
spec's norms under TE's names (linear_qkv.layer_norm_weight,
linear_fc1.layer_norm_weight), where every layer has one spec; per layer,
decoder.layers.N...., where the bridge builds a block of per-layer specs
(DeepSeek-V3); experts stacked along an expert axis,
...mlp.experts.experts.linear_fc1.weight [L, E, ...] or [E, ...]) goes into
OUT.npz by name, as the model holds it
(float32, or bfloat16 stored as its uint16 bits under the name with the
suffix "@bf16").  Extra states (_extra_state) are left out.  OUT.npz.json
beside it lists each name's shape and dtype, the provider's settings and
the versions.  --save-mcore DIR also saves the model as a megatron-core
dist checkpoint (torch_dist, megatron.core.dist_checkpointing.save).

--tp N (default 1) runs N gloo processes; at N > 1 OUT.npz holds each
rank's local tensors under "tpR/NAME" (--keys state only).

export: builds the same provider from HFDIR's config (--like: an HF
directory of the same model; its weights are not read), loads MCORE_CKPT
(a megatron-core torch_dist checkpoint of that model with the local spec's
names, e.g. one --save-mcore wrote) into it with
megatron.core.dist_checkpointing.load, and writes HFOUT with Megatron-Bridge's
save_hf_pretrained (config.json and safetensors as Megatron-Bridge exports
them).

Runs in .venv-bridge (Python 3.12, megatron-bridge 0.6.2, megatron-core
0.19.2, transformers 5.12.1, torch 2.9.1 on the CPU): scripts/setup makes it
when a Python 3.12 is here.  Transformer Engine is not installed: the stub
in tests/bridge_stub answers Megatron-Bridge's one module-level import of
it, and this script checks that megatron-core still runs without TE.
"""
import argparse
import json
import os
import socket
import sys
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
# megatron-core and Megatron-Bridge append `git rev-parse HEAD` of their own
# folder to __version__ unless this is set (here: the repo's HEAD).
os.environ.setdefault("NO_VCS_VERSION", "1")
warnings.filterwarnings("ignore")

HERE = os.path.dirname(os.path.abspath(__file__))
STUB = os.path.join(os.path.dirname(HERE), "bridge_stub")

# What makes megatron-core run on the CPU without TE or fused kernels.
CPU_SETTINGS = dict(
    gradient_accumulation_fusion=False,
    bias_activation_fusion=False,
    bias_dropout_fusion=False,
    masked_softmax_fusion=False,
    persist_layer_norm=False,
    apply_rope_fusion=False,
    cross_entropy_loss_fusion=False,
    moe_grouped_gemm=False,
    moe_token_dispatcher_type="allgather",
    moe_permute_fusion=False,
    moe_router_fusion=False,
    moe_shared_expert_overlap=False,
    use_cpu_initialization=True,
    sequence_parallel=False,
    fp16=False,
)


def import_bridge():
    """megatron.bridge's AutoBridge, with the TE stub answering its one TE
    import; fails if any megatron-core HAVE_TE flag ends up True."""
    sys.path.insert(0, STUB)
    try:
        import te_stub
    finally:
        sys.path.remove(STUB)
    import logging
    logging.disable(logging.WARNING)
    with te_stub.for_bridge():
        from megatron.bridge import AutoBridge
    logging.disable(logging.NOTSET)
    bad = te_stub.check_no_te()
    if bad:
        sys.exit(f"bridge_oracle: megatron-core thinks TE is here: {bad}")
    return AutoBridge


# Exit status when Megatron-Bridge has no bridge for the directory's
# architecture (0.6.2: Mixtral, Phi-3), for a test to skip on.
UNSUPPORTED = 3


def from_hf(AutoBridge, path, **kwargs):
    """AutoBridge.from_hf_pretrained(path), or exit UNSUPPORTED saying which
    architecture Megatron-Bridge does not know."""
    with open(os.path.join(path, "config.json")) as f:
        archs = json.load(f).get("architectures") or []
    known = set(AutoBridge.list_supported_models())
    if not any(a in known for a in archs):
        print(f"bridge_oracle: Megatron-Bridge {versions()['megatron-bridge']}"
              f" has no bridge for {archs}", file=sys.stderr)
        sys.exit(UNSUPPORTED)
    return AutoBridge.from_hf_pretrained(path, **kwargs)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_dist(rank, world, port, tp):
    import torch
    import torch.distributed as dist
    if not torch.cuda.is_available():
        # As scripts/make_mcore_checkpoint.py: megatron-core's
        # YarnRotaryEmbedding (DeepSeek-V3's MLA) asks for the current CUDA
        # device whatever use_cpu_initialization says, and its torch_dist
        # save calls torch.cuda.synchronize().
        torch.cuda.current_device = lambda: "cpu"
        torch.cuda.synchronize = lambda *a, **k: None
    from megatron.core import parallel_state
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world)
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=1)


def mla_on_local_spec():
    """megatron-core 0.19.2's MLASelfAttention passes k_channels and
    v_channels to its core attention, which only TE's takes; the local
    spec's DotProductAttention gets them dropped.  It has no weights, so
    the names and tensors are megatron-core's; only a forward of an MLA
    model would not be right (the oracle runs none)."""
    from megatron.core.transformer.dot_product_attention import \
        DotProductAttention
    init = DotProductAttention.__init__
    if getattr(init, "_oracle", False):
        return

    def patched(self, *args, k_channels=None, v_channels=None, **kwargs):
        init(self, *args, **kwargs)
    patched._oracle = True
    DotProductAttention.__init__ = patched


def make_provider(bridge, load_weights, tp, dtype):
    """The bridge's megatron-core provider, on megatron-core's local spec
    with CPU_SETTINGS."""
    import torch
    from megatron.bridge.models import gpt_provider
    # Every spec that would be TE's is megatron-core's local one: the
    # default (which model providers such as OLMoE's build on) calls
    # transformer_engine_layer_spec from gpt_provider's globals.
    gpt_provider.transformer_engine_layer_spec = gpt_provider.local_layer_spec
    provider = bridge.to_megatron_provider(load_weights=load_weights)
    if getattr(provider, "use_transformer_engine_full_layer_spec", False):
        provider.use_transformer_engine_full_layer_spec = False
    for k, v in CPU_SETTINGS.items():
        if hasattr(provider, k):
            setattr(provider, k, v)
    provider.tensor_model_parallel_size = tp
    provider.pipeline_model_parallel_size = 1
    provider.expert_model_parallel_size = 1
    provider.params_dtype = getattr(torch, dtype)
    provider.bf16 = dtype == "bfloat16"
    if getattr(provider, "multi_latent_attention", False):
        mla_on_local_spec()
    if hasattr(provider, "finalize"):
        provider.finalize()
    return provider


def add_sequential_expert_mappings(bridge):
    """Megatron-Bridge's mapping for megatron-core's SequentialMLP expert
    names (local_experts.N, what the local spec with moe_grouped_gemm off
    builds) where a model bridge maps only the grouped ones
    (experts.linear_fcK.weightN, TE's): the same mapping object under the
    other name, as the Qwen3-MoE and DeepSeek bridges spell out themselves.
    Returns the megatron names added (OLMoE's bridge in 0.6.2)."""
    import copy
    from megatron.bridge.models.conversion.mapping_registry import \
        MegatronMappingRegistry
    cls = type(bridge._model_bridge)  # a new instance at each use
    orig = cls.mapping_registry
    if getattr(orig, "_oracle_added", None) is not None:
        return orig._oracle_added
    added = []

    def registry(self):
        reg = orig(self)
        have = {m.megatron_param for m in reg.mappings}
        extra = []
        for m in reg.mappings:
            for fc in ("linear_fc1", "linear_fc2"):
                grouped = f".mlp.experts.{fc}.weight*"
                if not m.megatron_param.endswith(grouped):
                    continue
                seq = (m.megatron_param[:-len(grouped)] +
                       f".mlp.experts.local_experts.*.{fc}.weight")
                if seq in have:
                    continue
                m2 = copy.copy(m)
                m2.megatron_param = seq
                extra.append(m2)
                have.add(seq)
                if seq not in added:
                    added.append(seq)
        return MegatronMappingRegistry(*reg.mappings, *extra) if extra else reg
    registry._oracle_added = added
    cls.mapping_registry = registry
    return added


def build(provider):
    """One GPTModel on the CPU (the bridge's pre-wrap hook loads the HF
    weights into it when the provider was made with load_weights)."""
    models = provider.provide_distributed_model(
        wrap_with_ddp=False, use_cpu_initialization=True,
        mixed_precision_wrapper=None)
    assert len(models) == 1, len(models)
    model = models[0]
    te = sorted({type(m).__name__ for m in model.modules()
                 if type(m).__module__.startswith(
                     ("transformer_engine", "megatron.core.extensions"))})
    if te:
        sys.exit(f"bridge_oracle: the model has TE modules: {te}")
    return model


def provider_summary(provider):
    keys = ["num_layers", "hidden_size", "ffn_hidden_size",
            "num_attention_heads", "num_query_groups", "kv_channels",
            "normalization", "layernorm_epsilon", "gated_linear_unit",
            "activation_func", "add_bias_linear", "add_qkv_bias",
            "qk_layernorm", "position_embedding_type", "rotary_base",
            "rotary_percent", "share_embeddings_and_output_weights",
            "vocab_size", "num_moe_experts", "moe_router_topk",
            "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
            "moe_layer_freq", "moe_router_pre_softmax",
            "moe_router_score_function", "moe_router_enable_expert_bias",
            "moe_token_dispatcher_type", "moe_grouped_gemm",
            "multi_latent_attention", "q_lora_rank", "kv_lora_rank",
            "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim",
            "mtp_num_layers", "make_vocab_size_divisible_by",
            "transformer_layer_spec"]
    out = {}
    for k in keys:
        if hasattr(provider, k):
            v = getattr(provider, k)
            if callable(v) and not isinstance(v, (int, float, str, bool)):
                v = getattr(v, "__name__", None) or getattr(
                    getattr(v, "func", None), "__name__", repr(v))
            try:
                json.dumps(v)
            except TypeError:
                v = repr(v)
            out[k] = v
    return out


def to_numpy(t):
    """(array, suffix): float32 as is, bfloat16 as its uint16 bits."""
    import torch
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view("uint16"), "@bf16"
    return t.numpy(), ""


def state_tensors(model):
    return {k: v for k, v in model.state_dict().items()
            if "_extra_state" not in k and v is not None}


def sharded_tensors(model):
    """Each ShardedTensor key of model.sharded_state_dict() with its global
    tensor, assembled from this (only) rank's pieces."""
    import torch
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import (ShardedTensor,
                                                          apply_factories)
    sd = model.sharded_state_dict()
    apply_factories(sd)
    out, filled = {}, {}
    for sh in nested_values(sd):
        if not isinstance(sh, ShardedTensor) or sh.key.endswith("_extra_state"):
            continue
        if sh.key not in out:
            out[sh.key] = torch.zeros(sh.global_shape, dtype=sh.data.dtype)
            filled[sh.key] = 0
        data = sh.data
        if sh.flattened_range is not None:
            raise SystemExit(f"bridge_oracle: flattened {sh.key}")
        # prepend_axis_num leading axes of size 1 that data lacks
        data = data.reshape((1,) * sh.prepend_axis_num + tuple(data.shape))
        idx = tuple(slice(o, o + n) for o, n in
                    zip(sh.global_offset, data.shape))
        if not _all_zero(sh.replica_id):
            continue  # a copy of a piece that replica 0 brings
        out[sh.key][idx] = data
        filled[sh.key] += data.numel()
    for k, n in filled.items():
        if n < out[k].numel():
            raise SystemExit(f"bridge_oracle: {k}: only {n} of "
                             f"{out[k].numel()} elements found")
    return out


def _all_zero(r):
    return all(x == 0 for x in (r if isinstance(r, tuple) else (r,)))


def convert_rank(rank, a, port):
    import numpy as np
    import torch
    torch.manual_seed(0)
    AutoBridge = import_bridge()
    init_dist(rank, a.tp, port, a.tp)
    bridge = from_hf(AutoBridge, a.hfdir, dtype=getattr(torch, a.dtype))
    added = add_sequential_expert_mappings(bridge)
    provider = make_provider(bridge, True, a.tp, a.dtype)
    model = build(provider)
    if a.keys == "sharded":
        tensors = sharded_tensors(model)
    else:
        tensors = state_tensors(model)
    prefix = f"tp{rank}/" if a.tp > 1 else ""
    arrays, meta = {}, {}
    for k, v in tensors.items():
        arr, suffix = to_numpy(v)
        arrays[prefix + k + suffix] = arr
        meta[prefix + k] = {"shape": list(v.shape),
                            "dtype": str(v.dtype).replace("torch.", "")}
    if a.save_mcore:
        from megatron.core import dist_checkpointing
        os.makedirs(a.save_mcore, exist_ok=True)
        dist_checkpointing.save(model.sharded_state_dict(), a.save_mcore)
    if a.tp > 1:
        import torch.distributed as dist
        gathered = [None] * a.tp
        dist.all_gather_object(gathered, (arrays, meta))
        if rank != 0:
            return
        arrays, meta = {}, {}
        for ar, me in gathered:
            arrays.update(ar)
            meta.update(me)
    np.savez(a.out, **arrays)
    info = {"tensors": meta, "keys": a.keys, "tp": a.tp,
            "hf_architectures": bridge.hf_pretrained.config.architectures,
            "model_bridge": type(bridge._model_bridge).__name__,
            "provider": type(provider).__name__,
            "provider_settings": provider_summary(provider),
            "mappings_added": added,
            "versions": versions()}
    with open(a.out + ".json", "w") as f:
        json.dump(info, f, indent=1, sort_keys=True)
    print(f"bridge_oracle: {len(arrays)} tensors -> {a.out} "
          f"({info['model_bridge']})")


def _spawned(rank, a, port):
    convert_rank(rank, a, port)


def versions():
    import importlib.metadata as md
    out = {}
    for d in ("megatron-bridge", "megatron-core", "transformers", "torch"):
        try:
            out[d] = md.version(d)
        except md.PackageNotFoundError:
            out[d] = None
    return out


def convert(a):
    port = free_port()
    if a.tp == 1:
        convert_rank(0, a, port)
        return
    if a.keys != "state":
        sys.exit("bridge_oracle: --tp > 1 takes --keys state only")
    import torch.multiprocessing as mp
    mp.spawn(_spawned, args=(a, port), nprocs=a.tp, join=True)


def export(a):
    import torch
    from megatron.core import dist_checkpointing
    AutoBridge = import_bridge()
    init_dist(0, 1, free_port(), 1)
    # No dtype here: from_hf_pretrained would hand it to the tokenizer
    # too, whose save_pretrained cannot write a torch.dtype.
    bridge = from_hf(AutoBridge, a.like)
    add_sequential_expert_mappings(bridge)
    provider = make_provider(bridge, False, 1, a.dtype)
    provider.perform_initialization = False
    model = build(provider)
    sd = model.sharded_state_dict()
    loaded = dist_checkpointing.load(sd, a.mcore_ckpt, strict="assume_ok_unexpected")
    model.load_state_dict(loaded, strict=False)
    # save_hf_pretrained's two halves without its ModelOpt import (it asks
    # ModelOpt whether the model is quantized): the bridge's artifacts
    # (config.json, generation_config.json, tokenizer files) as
    # save_hf_pretrained writes them, and the tensors its
    # export_hf_weights streams, in one model.safetensors.
    from safetensors.torch import save_file
    os.makedirs(a.hfout, exist_ok=True)
    try:
        bridge.hf_pretrained.save_artifacts(a.hfout)
    except ValueError as e:
        # A --like directory without a tokenizer (tiny_hf.py's): the config
        # as the bridge holds it, and no tokenizer files.
        print(f"bridge_oracle: no tokenizer saved ({str(e).strip()[:80]})")
        bridge.hf_pretrained.config.save_pretrained(a.hfout)
    tensors = {}
    for name, t in bridge.export_hf_weights([model], cpu=True,
                                            show_progress=False):
        if name in tensors:
            sys.exit(f"bridge_oracle: {name} exported twice")
        tensors[name] = t.detach().contiguous().clone()
    save_file(tensors, os.path.join(a.hfout, "model.safetensors"),
              metadata={"format": "pt"})
    print(f"bridge_oracle: {a.mcore_ckpt} -> {a.hfout} "
          f"({len(tensors)} tensors)")


def families(_a):
    AutoBridge = import_bridge()
    for name in AutoBridge.list_supported_models():
        print(name)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("convert")
    c.add_argument("hfdir")
    c.add_argument("out")
    c.add_argument("--tp", type=int, default=1)
    c.add_argument("--keys", choices=["state", "sharded"], default="state")
    c.add_argument("--dtype", choices=["float32", "bfloat16"],
                   default="float32")
    c.add_argument("--save-mcore", metavar="DIR")
    e = sub.add_parser("export")
    e.add_argument("mcore_ckpt")
    e.add_argument("hfout")
    e.add_argument("--like", required=True, metavar="HFDIR")
    e.add_argument("--dtype", choices=["float32", "bfloat16"],
                   default="float32")
    sub.add_parser("families")
    a = ap.parse_args(argv)
    {"convert": convert, "export": export, "families": families}[a.cmd](a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
