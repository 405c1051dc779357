#!/usr/bin/env python3
"""Write a tiny random HF model of one family with transformers' own
save_pretrained, for the oracles (tests/mount/bridge_oracle.py) and for
seeing what a transformers version writes.

Usage:
    python tiny_hf.py FAMILY OUTDIR [--seed S] [--dtype float32|bfloat16]
    python tiny_hf.py --list

FAMILY is one of: llama, qwen2, qwen3, mistral, phi3, mixtral, qwen3_moe,
olmoe, deepseek_v3.  Every model has hidden size 64, 2 layers, 4 query and
2 key/value heads, vocab 256; the MoE ones 4 experts, 2 per token (the
DeepSeek-V3 one: its first layer dense, a shared expert, MLA attention;
the OLMoE one 4 key/value heads, as OLMoE has no grouped-query attention).
OUTDIR gets config.json, generation_config.json and model.safetensors as
the running transformers writes them (4.57's per-expert names or 5.x's, as
that version saves).

Runs in any venv with torch and transformers (.venv-mcore: 4.57; with
.venv-mcore/transformers-5.24.0 on PYTHONPATH, and .venv-bridge: 5.x).
"""
import argparse
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

COMMON = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=128, rms_norm_eps=1e-6,
              tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
MOE = dict(num_experts_per_tok=2)

FAMILIES = {
    # family: (config class, causal LM class, config fields)
    "llama": ("LlamaConfig", "LlamaForCausalLM",
              dict(intermediate_size=128)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              dict(intermediate_size=128)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
              dict(intermediate_size=128, head_dim=16)),
    "mistral": ("MistralConfig", "MistralForCausalLM",
                dict(intermediate_size=128, sliding_window=None)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM",
             dict(intermediate_size=128, pad_token_id=0)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(intermediate_size=96, num_local_experts=4, **MOE)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(intermediate_size=128, moe_intermediate_size=96,
                       num_experts=4, head_dim=16, decoder_sparse_step=1,
                       mlp_only_layers=[], norm_topk_prob=True, **MOE)),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM",
              dict(intermediate_size=96, num_experts=4, pad_token_id=0,
                   num_key_value_heads=4, **MOE)),  # as OLMoE: no GQA
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    dict(intermediate_size=128, moe_intermediate_size=96,
                         n_routed_experts=4, n_shared_experts=1,
                         first_k_dense_replace=1, n_group=1, topk_group=1,
                         q_lora_rank=32, kv_lora_rank=32,
                         qk_nope_head_dim=16, qk_rope_head_dim=8,
                         v_head_dim=16, num_key_value_heads=4,
                         routed_scaling_factor=1.0, norm_topk_prob=True,
                         **MOE)),
}


def make(family, outdir, seed=0, dtype="float32"):
    """Saves a random FAMILY model to outdir; returns the model."""
    import torch
    import transformers
    cfg_name, lm_name, fields = FAMILIES[family]
    cfg = getattr(transformers, cfg_name)(**{**COMMON, **fields})
    torch.manual_seed(seed)
    model = getattr(transformers, lm_name)(cfg)
    # Random weights everywhere, norms too (init leaves them at 1), so a
    # swapped or dropped tensor shows.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.05)
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(outdir)
    return model


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("family", nargs="?", choices=sorted(FAMILIES))
    ap.add_argument("outdir", nargs="?")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="float32",
                    choices=["float32", "bfloat16"])
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args(argv)
    if a.list:
        print(" ".join(FAMILIES))
        return 0
    if not a.family or not a.outdir:
        ap.error("FAMILY and OUTDIR are needed")
    make(a.family, a.outdir, a.seed, a.dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
