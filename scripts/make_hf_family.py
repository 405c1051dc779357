#!/usr/bin/env python3
"""Write a tiny random HF model of one family with transformers' own
save_pretrained, and the oracle of its forward.

Usage:
    python make_hf_family.py FAMILY OUTDIR [--oracle DIR] [--seed S]
                             [--tied] [--experts per_expert|packed]
                             [--set KEY=VALUE ...]

FAMILY is one of llama3, qwen2, qwen3, mistral, phi3, mixtral, qwen3_moe,
olmoe, deepseek_v3.  Each model is tiny (hidden 64, 2 layers, vocab
1000, grouped-query attention) and its config exercises what tells the
family apart:

    llama3      rope_scaling {rope_type llama3, factor 32, low_freq_factor
                1, high_freq_factor 4, original_max_position_embeddings
                8192} (megatron-core hardcodes all but the factor), theta
                500000, 4 heads / 2 kv heads (head_dim 16)
    qwen2       q/k/v bias (o_proj none), theta 1e6
    qwen3       q_norm/k_norm per head, head_dim 16 (!= 64/8)
    mistral     head_dim 32 (!= 64/8), no sliding window
    phi3        fused qkv_proj [q; k; v] and gate_up_proj [gate; up]
    mixtral     8 experts top-2, block_sparse_moe.{gate, experts.E.w1/w2/w3}
    qwen3_moe   8 experts top-2, norm_topk_prob True, q/k norm, head_dim 16
    olmoe       8 experts top-2, norm_topk_prob False, q/k norm over all
                heads (not per head)
    deepseek_v3 MLA (q_lora, kv_lora, rope/nope split), layer 0 dense, 8
                routed experts top-2 in 2 groups, a shared expert, sigmoid
                scores with e_score_correction_bias

--set KEY=VALUE (repeatable) replaces one argument of the family's config
(KEY a transformers config key, VALUE JSON): a bigger model of the same
family, e.g. --set hidden_size=1024 --set num_experts=32 (the benchmark's).

OUTDIR gets what <Family>ForCausalLM(config).save_pretrained(OUTDIR)
writes (transformers 4.57: experts one tensor per expert).  With
--experts packed the MoE tensors are rewritten, with safetensors, into
the packed form transformers 5 keeps in memory (and writes with
save_pretrained(save_original_format=False)): per layer
`model.layers.N.mlp.experts.gate_up_proj` [E, 2F, H] (expert e's gate rows
then its up rows: transformers 5's conversion_mapping MergeModulelist(0)
then Concatenate(1)) and `model.layers.N.mlp.experts.down_proj` [E, H, F];
Mixtral's `block_sparse_moe.` becomes `mlp.` (its router
`mlp.gate.weight`).  config.json stays the per-expert one.  (transformers
4.57 cannot load the packed form; the oracle comes from the per-expert
form before the rewrite.)

The oracle directory (default OUTDIR.oracle) gets tokens.npy (the fixed
int64 batch [2, 24] of scripts/make_hf_llama.py), logits.npy
(transformers' float32 logits, [2, 24, vocab]) and model.json (family,
arguments, the config).

Runs in .venv-mcore (torch, transformers, safetensors).
"""
import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from make_hf_llama import fixed_tokens  # noqa: E402

FAMILIES = ("llama3", "qwen2", "qwen3", "mistral", "phi3", "mixtral",
            "qwen3_moe", "olmoe", "deepseek_v3")
MOE = ("mixtral", "qwen3_moe", "olmoe", "deepseek_v3")
VOCAB, HIDDEN, LAYERS, HEADS, KV, FFN = 1000, 64, 2, 8, 4, 128
EXPERTS, TOPK, MOE_FFN = 8, 2, 32


def family_config(family, tied=False, overrides=None):
    """The transformers config of the tiny FAMILY model; overrides (config
    keys, e.g. {"hidden_size": 1024}) replace its arguments."""
    import transformers as tf
    common = dict(vocab_size=VOCAB, hidden_size=HIDDEN,
                  num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                  num_key_value_heads=KV, max_position_embeddings=128,
                  rms_norm_eps=1e-6, tie_word_embeddings=tied,
                  hidden_act="silu", bos_token_id=1, eos_token_id=2,
                  pad_token_id=None, dtype="float32")

    def make(cls, **kw):
        return cls(**{**common, **kw, **(overrides or {})})

    if family == "llama3":
        # head_dim 16 (4 heads, 2 kv heads): four of the eight rotary
        # frequencies fall in the smoothed or divided regimes.  Within 24
        # positions those rotate little: factor 8 instead of 32 moves the
        # logits by 1.7 times the tolerance, no rope scaling by 17 times
        common.update(max_position_embeddings=131072, num_attention_heads=4,
                      num_key_value_heads=2)
        return make(
            tf.LlamaConfig, intermediate_size=FFN, rope_theta=500000.0,
            rope_scaling={"rope_type": "llama3", "factor": 32.0,
                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 8192},
            attention_bias=False, mlp_bias=False)
    if family == "qwen2":
        return make(tf.Qwen2Config, intermediate_size=FFN,
                    rope_theta=1000000.0, use_sliding_window=False)
    if family == "qwen3":
        return make(tf.Qwen3Config, intermediate_size=FFN, head_dim=16,
                    rope_theta=1000000.0, attention_bias=False,
                    use_sliding_window=False)
    if family == "mistral":
        return make(tf.MistralConfig, intermediate_size=FFN, head_dim=32,
                    rope_theta=1000000.0, sliding_window=None)
    if family == "phi3":
        return make(tf.Phi3Config, intermediate_size=FFN,
                    rope_theta=10000.0, rope_scaling=None,
                    partial_rotary_factor=1.0, sliding_window=None,
                    original_max_position_embeddings=128)
    if family == "mixtral":
        return make(tf.MixtralConfig, intermediate_size=MOE_FFN,
                    num_local_experts=EXPERTS,
                    num_experts_per_tok=TOPK, rope_theta=1e6,
                    sliding_window=None, router_jitter_noise=0.0,
                    output_router_logits=False)
    if family == "qwen3_moe":
        return make(tf.Qwen3MoeConfig, intermediate_size=FFN,
                    moe_intermediate_size=MOE_FFN,
                    num_experts=EXPERTS,
                    num_experts_per_tok=TOPK,
                    norm_topk_prob=True, decoder_sparse_step=1,
                    mlp_only_layers=[], head_dim=16,
                    rope_theta=1e6, attention_bias=False,
                    use_sliding_window=False,
                    output_router_logits=False)
    if family == "olmoe":
        return make(tf.OlmoeConfig, intermediate_size=MOE_FFN,
                    num_experts=EXPERTS, num_experts_per_tok=TOPK,
                    norm_topk_prob=False, rope_theta=10000.0,
                    clip_qkv=None, attention_bias=False,
                    output_router_logits=False)
    if family == "deepseek_v3":
        common.update(num_key_value_heads=HEADS)
        return make(
            tf.DeepseekV3Config, intermediate_size=FFN,
            moe_intermediate_size=MOE_FFN,
            n_routed_experts=EXPERTS, n_shared_experts=1,
            num_experts_per_tok=TOPK, n_group=2, topk_group=1,
            first_k_dense_replace=1, norm_topk_prob=True,
            routed_scaling_factor=2.5, q_lora_rank=32, kv_lora_rank=16,
            qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
            rope_theta=10000.0, rope_scaling=None, rope_interleave=True,
            attention_bias=False)
    raise SystemExit(f"unknown family {family!r} (one of {', '.join(FAMILIES)})")


def model_class(config):
    import transformers
    return getattr(transformers, config.architectures[0]) \
        if config.architectures else None


def randomize(model, seed):
    """transformers' init draws small weights and ones for the norms;
    make every tensor distinct so that a swapped one shows: norms 1 + 0.1
    N(0,1), biases and the router's correction bias 0.1 N(0,1), the
    embedding and lm_head N(0, 0.5), the rest N(0, 0.1)."""
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + \
                list(model.named_buffers()):
            if not p.is_floating_point() or "rotary_emb" in name:
                continue
            r = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith("bias"):
                p.copy_(0.1 * r)
            elif p.dim() == 1:
                p.copy_(1.0 + 0.1 * r)
            elif "embed_tokens" in name or "lm_head" in name:
                p.copy_(0.5 * r)
            else:
                p.copy_(0.1 * r)


PER_EXPERT = {
    # family: (moe prefix in 4.57, (gate, up, down) names per expert)
    "mixtral": ("block_sparse_moe", ("w1", "w3", "w2")),
    "qwen3_moe": ("mlp", ("gate_proj", "up_proj", "down_proj")),
    "olmoe": ("mlp", ("gate_proj", "up_proj", "down_proj")),
    "deepseek_v3": ("mlp", ("gate_proj", "up_proj", "down_proj")),
}


def pack_experts(tensors, family, num_experts):
    """The per-expert tensors of a 4.57 save in transformers 5's packed
    form (see the module doc); everything else keeps its name, bar
    Mixtral's block_sparse_moe. -> mlp."""
    import re

    import torch
    moe, (gate, up, down) = PER_EXPERT[family]
    pat = re.compile(rf"^(model\.layers\.\d+)\.{moe}\.experts\.(\d+)\.(\w+)\.weight$")
    out, per = {}, {}
    for k, v in tensors.items():
        m = pat.match(k)
        if m:
            per.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3))] = v
            continue
        if family == "mixtral":
            k = k.replace(".block_sparse_moe.", ".mlp.")
        out[k] = v
    for layer, w in per.items():
        E = range(num_experts)
        assert sorted(w) == sorted((e, n) for e in E for n in (gate, up, down)), layer
        out[f"{layer}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([w[(e, gate)], w[(e, up)]], 0) for e in E]).contiguous()
        out[f"{layer}.mlp.experts.down_proj"] = torch.stack(
            [w[(e, down)] for e in E]).contiguous()
    return out


def write_packed(out, family, config):
    """Rewrites OUTDIR/model.safetensors in the packed form."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    path = os.path.join(out, "model.safetensors")
    assert not os.path.exists(os.path.join(out, "model.safetensors.index.json"))
    with safe_open(path, framework="pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    n = getattr(config, "num_local_experts", None) or \
        getattr(config, "num_experts", None) or config.n_routed_experts
    save_file(pack_experts(tensors, family, n), path, metadata=meta)


def parse_set(items):
    """["hidden_size=1024", ...] -> {"hidden_size": 1024, ...}"""
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise SystemExit(f"--set {item!r}: not KEY=VALUE")
        try:
            out[k] = json.loads(v)
        except ValueError:
            out[k] = v
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("family", choices=FAMILIES)
    ap.add_argument("outdir")
    ap.add_argument("--oracle", help="default OUTDIR.oracle")
    ap.add_argument("--seed", type=int, default=4321)
    ap.add_argument("--tied", action="store_true",
                    help="tie_word_embeddings (no lm_head.weight saved)")
    ap.add_argument("--experts", choices=["per_expert", "packed"],
                    default="per_expert")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config argument (VALUE JSON), repeatable")
    a = ap.parse_args(argv)
    if a.experts == "packed" and a.family not in MOE:
        ap.error(f"--experts packed: {a.family} has no experts")

    import numpy as np
    import torch
    import transformers

    out = os.path.abspath(a.outdir)
    if os.path.exists(out) and os.listdir(out):
        ap.error(f"{out} exists and is not empty")
    oracle = os.path.abspath(a.oracle or out + ".oracle")
    torch.manual_seed(a.seed)
    config = family_config(a.family, a.tied, parse_set(a.set))
    cls = transformers.AutoModelForCausalLM._model_mapping[type(config)]
    model = cls(config)
    randomize(model, a.seed)
    model.save_pretrained(out, safe_serialization=True)

    ref = cls.from_pretrained(out, dtype=torch.float32)
    ref.eval()
    tokens = fixed_tokens(VOCAB)
    with torch.no_grad():
        logits = ref(input_ids=tokens).logits.float()
    if a.experts == "packed":
        write_packed(out, a.family, config)
    os.makedirs(oracle, exist_ok=True)
    np.save(os.path.join(oracle, "tokens.npy"), tokens.numpy())
    np.save(os.path.join(oracle, "logits.npy"), logits.numpy())
    with open(os.path.join(oracle, "model.json"), "w") as f:
        json.dump({"family": a.family, "args": vars(a), "source": "hf",
                   "class": cls.__name__,
                   "config": json.loads(config.to_json_string())}, f, indent=1)
    print(f"saved {cls.__name__} ({a.family}, {a.experts}) to {out} "
          f"(files: {', '.join(sorted(os.listdir(out)))}), oracle {oracle}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
