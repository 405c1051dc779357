#!/usr/bin/env python3
"""Write a legacy Megatron-LM per-rank checkpoint (docs/FORMATS.md, "Legacy Megatron") of a tiny
GPT, the way megatron/training/checkpointing.py save_checkpoint does with
--ckpt-format torch, plus the full parameters as an .npz oracle.

Usage (in .venv-mcore: needs torch and numpy; megatron-core is used for the
enums real args hold when it is installed):
    python make_legacy_checkpoint.py OUT --tp T --pp P [--vpp V] [--gated]
        [--untied] [--bf16] [--layers L] [--iter-dir] [--old-names]
        [--distopt] [--llama] [--oracle FILE]

OUT receives `latest_checkpointed_iteration.txt` and `iter_0000010/` with
one `mp_rank_TT[_PPP]/model_optim_rng.pt` per (tp, pp) rank (the PP suffix
only when P > 1); with --iter-dir OUT is the iteration directory itself.
Each file is torch.save of the dict Megatron writes: args (an
argparse.Namespace with Megatron's field names), checkpoint_version 3.0,
iteration, model (model0.. with V > 1 virtual stages), optimizer,
opt_param_scheduler, rng_state and num_floating_point_operations_so_far.

The model dict follows megatron/legacy/model: GPTModel
.state_dict_for_save_checkpoint -> {'language_model': {'embedding':
{'word_embeddings': {'weight'}, 'position_embeddings': {'weight'}},
'encoder': {'layers.<local>.<param>': T, ..., 'final_norm.weight'},
'output_layer': {'weight'}}, 'word_embeddings_for_head': {'weight'}}, the
inner dicts being module.state_dict() OrderedDicts.  Layers are numbered
per stage; with virtual stages chunk c of stage p holds layers
(c*P + p)*L/(P*V) + local.  TP: query_key_value, dense_h_to_4h and the
vocab tensors are split on rows, dense and dense_4h_to_h weights on
columns, the rest replicated; a gated dense_h_to_4h (--gated, args.swiglu)
holds [W_r; V_r] on rank r.

--llama writes the Llama form of the legacy model (--normalization
RMSNorm --swiglu --disable-bias-linear --position-embedding-type rope
--group-query-attention --num-query-groups 2, --vocab-size given): no
biases, no position embeddings, norms with weights only, query_key_value
of (heads + 2*groups) * kv_channels rows, and args saying so.

The oracle (default OUT.oracle.npz next to OUT) maps every global name
(layer numbers global, `language_model.encoder.layers.<g>.<param>`) to the
full tensor as float32 (bf16 values are exact in float32), with
'__config__' a JSON string of the layout and model sizes.
"""

import argparse
import json
import random
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch

ITERATION = 10
VOCAB = 1000
HIDDEN = 64
HEADS = 4
FFN = 128
MAX_POS = 32
GROUPS = 2          # query groups of --llama (GQA)


def pad_vocab(vocab_size, tp, divisible_by=128):
    """Megatron-LM's _vocab_size_with_padding rule."""
    multiple = divisible_by * tp
    return ((vocab_size + multiple - 1) // multiple) * multiple


def _enums():
    """The enum members real args hold, when megatron-core is installed."""
    import torch.utils.cpp_extension as cpp_ext

    def _no_jit(*args, **kwargs):
        # megatron/core/inference/unified_memory.py JIT-compiles a CUDA
        # extension at import time; without a GPU make it fail fast (caught).
        raise RuntimeError("JIT CUDA extensions disabled (CPU-only run)")

    cpp_ext.load_inline = _no_jit
    try:
        from megatron.core.enums import ModelType
        from megatron.core.transformer.enums import AttnBackend
        return ModelType.encoder_or_decoder, AttnBackend.auto
    except ImportError:
        return None, None


def layer_params(gated, old_names, llama=False):
    """(name, global shape, tp kind) of one layer; kinds: col, row, rep."""
    norm1 = "input_layernorm" if old_names else "input_norm"
    norm2 = "post_attention_layernorm" if old_names else "post_attention_norm"
    f = 2 * FFN if gated else FFN
    if llama:
        d = HIDDEN // HEADS
        return [
            (f"{norm1}.weight", (HIDDEN,), "rep"),
            ("self_attention.query_key_value.weight",
             ((HEADS + 2 * GROUPS) * d, HIDDEN), "col"),
            ("self_attention.dense.weight", (HIDDEN, HIDDEN), "row"),
            (f"{norm2}.weight", (HIDDEN,), "rep"),
            ("mlp.dense_h_to_4h.weight", (2 * FFN, HIDDEN), "glu"),
            ("mlp.dense_4h_to_h.weight", (HIDDEN, FFN), "row"),
        ]
    return [
        (f"{norm1}.weight", (HIDDEN,), "rep"),
        (f"{norm1}.bias", (HIDDEN,), "rep"),
        ("self_attention.query_key_value.weight", (3 * HIDDEN, HIDDEN), "col"),
        ("self_attention.query_key_value.bias", (3 * HIDDEN,), "col"),
        ("self_attention.dense.weight", (HIDDEN, HIDDEN), "row"),
        ("self_attention.dense.bias", (HIDDEN,), "rep"),
        (f"{norm2}.weight", (HIDDEN,), "rep"),
        (f"{norm2}.bias", (HIDDEN,), "rep"),
        ("mlp.dense_h_to_4h.weight", (f, HIDDEN), "glu" if gated else "col"),
        ("mlp.dense_h_to_4h.bias", (f,), "glu" if gated else "col"),
        ("mlp.dense_4h_to_h.weight", (HIDDEN, FFN), "row"),
        ("mlp.dense_4h_to_h.bias", (HIDDEN,), "rep"),
    ]


def full_model(cfg, dtype):
    """Global parameters: name -> tensor (names with global layer numbers)."""
    g = torch.Generator().manual_seed(cfg["seed"])
    padded = cfg["padded_vocab_size"]
    out = OrderedDict()

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    out["language_model.embedding.word_embeddings.weight"] = rnd(padded, HIDDEN)
    if not cfg["llama"]:
        out["language_model.embedding.position_embeddings.weight"] = rnd(MAX_POS, HIDDEN)
    for layer in range(cfg["num_layers"]):
        for name, shape, _ in layer_params(cfg["gated"], cfg["old_names"], cfg["llama"]):
            out[f"language_model.encoder.layers.{layer}.{name}"] = rnd(*shape)
    final = "final_layernorm" if cfg["old_names"] else "final_norm"
    out[f"language_model.encoder.{final}.weight"] = rnd(HIDDEN)
    if not cfg["llama"]:
        out[f"language_model.encoder.{final}.bias"] = rnd(HIDDEN)
    if cfg["untied"]:
        out["language_model.output_layer.weight"] = rnd(padded, HIDDEN)
    return out


def shard(t, kind, tp, r):
    """Rank r's part of a global tensor, as Megatron's parallel layers hold it."""
    if kind == "rep":
        return t.clone()
    if kind in ("col", "vocab"):
        return t.chunk(tp, 0)[r].clone()
    if kind == "row":
        return t.chunk(tp, 1)[r].clone()
    w, v = t.chunk(2, 0)                       # gated: [W; V] globally
    return torch.cat([w.chunk(tp, 0)[r], v.chunk(tp, 0)[r]]).clone()


def make_args(cfg, tp, pp, vpp, rank, dtype):
    """An argparse.Namespace with the fields (and types) Megatron-LM's
    arguments.py gives them; the ones a loader checks are exact."""
    model_type, attn_backend = _enums()
    lpc = cfg["num_layers"] // (pp * vpp)
    a = argparse.Namespace()
    fields = dict(
        num_layers=cfg["num_layers"], encoder_num_layers=cfg["num_layers"],
        decoder_num_layers=None, hidden_size=HIDDEN, ffn_hidden_size=FFN,
        num_attention_heads=HEADS, kv_channels=HIDDEN // HEADS,
        group_query_attention=False, num_query_groups=1,
        max_position_embeddings=MAX_POS, position_embedding_type="learned_absolute",
        add_position_embedding=True, make_vocab_size_divisible_by=128,
        padded_vocab_size=cfg["padded_vocab_size"], vocab_size=None,
        tokenizer_type="GPT2BPETokenizer", vocab_file="gpt2-vocab.json",
        merge_file="gpt2-merges.txt",
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
        num_layers_per_virtual_pipeline_stage=lpc if vpp > 1 else None,
        transformer_pipeline_model_parallel_size=pp,
        standalone_embedding_stage=False,
        decoder_first_pipeline_num_layers=None,
        decoder_last_pipeline_num_layers=None,
        account_for_embedding_in_pipeline_split=False,
        account_for_loss_in_pipeline_split=False,
        expert_model_parallel_size=1, num_experts=None,
        context_parallel_size=1, sequence_parallel=tp > 1,
        data_parallel_size=1, world_size=tp * pp, rank=rank, local_rank=rank,
        swiglu=cfg["gated"], untie_embeddings_and_output_weights=cfg["untied"],
        add_bias_linear=True, normalization="LayerNorm", norm_epsilon=1e-5,
        apply_query_key_layer_scaling=False, attention_softmax_in_fp32=False,
        fp16=False, bf16=dtype == torch.bfloat16, params_dtype=dtype,
        main_grads_dtype=torch.float32, main_params_dtype=torch.float32,
        exp_avg_dtype=torch.float32, exp_avg_sq_dtype=torch.float32,
        use_distributed_optimizer=cfg["distopt"], transformer_impl="local",
        use_legacy_models=True, ckpt_format="torch", use_dist_ckpt=False,
        model_type=model_type, attention_backend=attn_backend,
        seed=1234, lr=3e-4, min_lr=3e-5, weight_decay=0.1, adam_beta1=0.9,
        adam_beta2=0.95, micro_batch_size=2, global_batch_size=8,
        seq_length=MAX_POS, train_iters=100, iteration=ITERATION,
        consumed_train_samples=ITERATION * 8, save="/ckpt/gpt", load=None,
        data_path=["/data/corpus_text_document"], split="969,30,1",
        recompute_granularity=None, hidden_dropout=0.1, attention_dropout=0.1,
        init_method_std=0.02, clip_grad=1.0, log_interval=1,
    )
    if cfg["llama"]:
        fields.update(
            group_query_attention=True, num_query_groups=GROUPS,
            position_embedding_type="rope", add_position_embedding=False,
            rotary_base=10000, normalization="RMSNorm", swiglu=True,
            add_bias_linear=False, vocab_size=VOCAB,
            tokenizer_type="HuggingFaceTokenizer")
    for k, v in fields.items():
        setattr(a, k, v)
    return a


def optimizer_state(params):
    """What Float16OptimizerWithFloat16Params.state_dict() holds."""
    n = len(params)
    return {
        "optimizer": {
            "state": {i: {"exp_avg": torch.zeros_like(p, dtype=torch.float32),
                          "exp_avg_sq": torch.zeros_like(p, dtype=torch.float32)}
                      for i, p in enumerate(params[:2])},
            "param_groups": [{"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8,
                              "weight_decay": 0.1, "amsgrad": False,
                              "wd_mult": 1.0, "lr_mult": 1.0,
                              "is_expert_parallel": False,
                              "is_decoupled_lr": False,
                              "params": list(range(n))}],
        },
        "grad_scaler": {"scale": torch.tensor([4096.0]),
                        "growth_tracker": torch.tensor([0], dtype=torch.int32),
                        "hysteresis_tracker": 2},
        "fp32_from_fp16_params": [[p.float() for p in params[:2]]],
    }


def rng_state():
    return [{
        "random_rng_state": random.getstate(),
        "np_rng_state": np.random.get_state(),
        "torch_rng_state": torch.get_rng_state(),
        "cuda_rng_state": torch.get_rng_state(),      # no GPU here
        "rng_tracker_states": {"model-parallel-rng": torch.get_rng_state()},
    }]


def kind_of(name, cfg):
    if name.endswith("word_embeddings.weight") or name.endswith("output_layer.weight"):
        return "vocab"
    for pname, _, kind in layer_params(cfg["gated"], cfg["old_names"], cfg["llama"]):
        if name.endswith("." + pname):
            return kind
    return "rep"


def chunk_model(full, cfg, tp, pp, vpp, r, p, c):
    """Model chunk c of stage p on TP rank r, nested as Megatron saves it."""
    L = cfg["num_layers"]
    lpc = L // (pp * vpp)
    g = c * pp + p
    first, last = g == 0, g == pp * vpp - 1
    lm = {}
    if first:
        lm["embedding"] = {}
        for key in ("word_embeddings",) + (() if cfg["llama"] else ("position_embeddings",)):
            t = full[f"language_model.embedding.{key}.weight"]
            lm["embedding"][key] = OrderedDict(
                weight=shard(t, kind_of(key + ".weight", cfg), tp, r))
    enc = OrderedDict()
    for local in range(lpc):
        layer = g * lpc + local
        for pname, _, kind in layer_params(cfg["gated"], cfg["old_names"], cfg["llama"]):
            t = full[f"language_model.encoder.layers.{layer}.{pname}"]
            enc[f"layers.{local}.{pname}"] = shard(t, kind, tp, r)
    if last:
        final = "final_layernorm" if cfg["old_names"] else "final_norm"
        for w in ("weight",) + (() if cfg["llama"] else ("bias",)):
            enc[f"{final}.{w}"] = full[f"language_model.encoder.{final}.{w}"].clone()
    lm["encoder"] = enc
    if last and cfg["untied"]:
        lm["output_layer"] = OrderedDict(
            weight=shard(full["language_model.output_layer.weight"], "vocab", tp, r))
    model = {"language_model": lm}
    if last and not first and not cfg["untied"]:
        # GPTModel on the last stage keeps a copy of the tied embedding.
        model["word_embeddings_for_head"] = OrderedDict(weight=shard(
            full["language_model.embedding.word_embeddings.weight"], "vocab", tp, r))
    return model


def flat_tensors(d):
    for v in d.values():
        if isinstance(v, dict):
            yield from flat_tensors(v)
        else:
            yield v


def write(out, tp, pp, vpp=1, gated=False, untied=False, bf16=False,
          layers=4, iter_dir=False, old_names=False, distopt=False,
          oracle=None, seed=3, llama=False):
    out = Path(out)
    assert layers % (pp * vpp) == 0
    cfg = dict(num_layers=layers, gated=gated or llama, untied=untied,
               seed=seed, old_names=old_names, distopt=distopt, llama=llama,
               padded_vocab_size=pad_vocab(VOCAB, tp))
    dtype = torch.bfloat16 if bf16 else torch.float32
    full = full_model(cfg, dtype)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    ckpt = out if iter_dir else out / f"iter_{ITERATION:07d}"
    for p in range(pp):
        for r in range(tp):
            models = [chunk_model(full, cfg, tp, pp, vpp, r, p, c)
                      for c in range(vpp)]
            params = [t for m in models for t in flat_tensors(m)]
            sd = {"args": make_args(cfg, tp, pp, vpp, p * tp + r, dtype),
                  "checkpoint_version": 3.0, "iteration": ITERATION}
            if vpp == 1:
                sd["model"] = models[0]
            else:
                for c, m in enumerate(models):
                    sd[f"model{c}"] = m
            sd["optimizer"] = optimizer_state(params)
            sd["opt_param_scheduler"] = {
                "max_lr": 3e-4, "lr_warmup_steps": 10, "num_steps": ITERATION * 8,
                "lr_decay_style": "cosine", "lr_decay_steps": 800,
                "min_lr": 3e-5, "start_wd": 0.1, "end_wd": 0.1,
                "wd_incr_style": "constant", "wd_incr_steps": 800}
            sd["rng_state"] = rng_state()
            sd["num_floating_point_operations_so_far"] = 123456789
            name = f"mp_rank_{r:02d}" + (f"_{p:03d}" if pp > 1 else "")
            d = ckpt / name
            d.mkdir(parents=True, exist_ok=True)
            torch.save(sd, d / "model_optim_rng.pt")
            if distopt:
                torch.save({"buckets_coalesced": True, "per_bucket_numel": [4],
                            0: {torch.float32: {"param": torch.zeros(4)}}},
                           d / "distrib_optim.pt")
    if not iter_dir:
        (out / "latest_checkpointed_iteration.txt").write_text(str(ITERATION))
    if oracle is None:
        oracle = out.parent / (out.name + ".oracle.npz")
    arrays = {k: v.float().numpy() for k, v in full.items()}
    config = dict(cfg, tp=tp, pp=pp, vpp=vpp, bf16=bf16, iteration=ITERATION,
                  iter_dir=iter_dir, vocab=VOCAB)
    np.savez(oracle, __config__=np.array(json.dumps(config)), **arrays)
    return oracle


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--vpp", type=int, default=1)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--gated", action="store_true")
    ap.add_argument("--untied", action="store_true")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--iter-dir", action="store_true")
    ap.add_argument("--old-names", action="store_true")
    ap.add_argument("--distopt", action="store_true")
    ap.add_argument("--llama", action="store_true")
    ap.add_argument("--oracle")
    ap.add_argument("--seed", type=int, default=3)
    a = ap.parse_args()
    write(a.out, a.tp, a.pp, a.vpp, a.gated, a.untied, a.bf16, a.layers,
          a.iter_dir, a.old_names, a.distopt, a.oracle, a.seed, a.llama)


if __name__ == "__main__":
    main()
