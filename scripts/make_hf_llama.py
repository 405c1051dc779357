#!/usr/bin/env python3
"""Write a tiny HF Llama model directory with transformers' own
save_pretrained, and the oracle of its forward.

Usage:
    python make_hf_llama.py OUTDIR [--oracle DIR] [--seed S] [--tied]
                            [--max-shard-size SIZE] [--dtype float32|bfloat16]
                            [--layers 2 --hidden 64 --ffn 128 --heads 8
                             --kv-heads 4 --vocab 1000]
                            [--norm-eps 1e-6] [--rope-theta 50000]

OUTDIR gets what LlamaForCausalLM(config).save_pretrained(OUTDIR) writes
(random init from --seed): config.json, generation_config.json and
model.safetensors, or with --max-shard-size (e.g. 100KB) the sharded form,
model-0000N-of-0000M.safetensors and model.safetensors.index.json.  The
default model has grouped-query attention (8 heads, 4 kv heads), and an
rms_norm_eps and rope_theta that are not transformers' defaults, so that a
reader that drops them shows it.

The oracle directory (default OUTDIR.oracle, outside the model directory)
gets tokens.npy (the fixed int64 token batch [2, 24] below --vocab that
scripts/make_mcore_checkpoint.py's --logits-from uses too), logits.npy
(transformers' float32 logits of it, [2, 24, vocab], computed in float32
from the weights as saved) and model.json (the arguments).

Runs in .venv-mcore (torch, transformers, safetensors).
"""
import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

TOKENS_SHAPE = (2, 24)


def fixed_tokens(vocab):
    """The token batch of the logits oracles (the same as
    make_mcore_checkpoint.fixed_tokens)."""
    import torch
    g = torch.Generator().manual_seed(7)
    return torch.randint(0, vocab, TOKENS_SHAPE, generator=g)


def llama_config(a):
    from transformers import LlamaConfig
    return LlamaConfig(
        vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.ffn,
        num_hidden_layers=a.layers, num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads, max_position_embeddings=a.max_pos,
        rms_norm_eps=a.norm_eps, rope_theta=a.rope_theta,
        tie_word_embeddings=a.tied, hidden_act="silu",
        attention_bias=False, mlp_bias=False, bos_token_id=1,
        eos_token_id=2, dtype=a.dtype)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--oracle", help="default OUTDIR.oracle")
    ap.add_argument("--seed", type=int, default=4321)
    ap.add_argument("--tied", action="store_true",
                    help="tie_word_embeddings (no lm_head.weight saved)")
    ap.add_argument("--max-shard-size",
                    help="save_pretrained's max_shard_size (e.g. 100KB): "
                         "the sharded form with an index")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"],
                    default="float32")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--ffn", type=int, default=128)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--max-pos", type=int, default=128)
    ap.add_argument("--norm-eps", type=float, default=1e-6)
    ap.add_argument("--rope-theta", type=float, default=50000.0)
    a = ap.parse_args(argv)

    import numpy as np
    import torch
    from transformers import LlamaForCausalLM

    out = os.path.abspath(a.outdir)
    if os.path.exists(out) and os.listdir(out):
        ap.error(f"{out} exists and is not empty")
    oracle = os.path.abspath(a.oracle or out + ".oracle")
    torch.manual_seed(a.seed)
    config = llama_config(a)
    model = LlamaForCausalLM(config)
    # transformers' init draws small weights and ones for the norms; make
    # the norms and every weight distinct so a swapped tensor shows
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif "embed_tokens" in name or "lm_head" in name:
                p.normal_(0.0, 0.5)
            else:
                p.normal_(0.0, 0.1)
    model = model.to(getattr(torch, a.dtype))
    kw = {"max_shard_size": a.max_shard_size} if a.max_shard_size else {}
    model.save_pretrained(out, safe_serialization=True, **kw)

    # the oracle: the weights as saved, in float32
    ref = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32)
    ref.eval()
    tokens = fixed_tokens(a.vocab)
    with torch.no_grad():
        logits = ref(input_ids=tokens).logits.float()
    os.makedirs(oracle, exist_ok=True)
    np.save(os.path.join(oracle, "tokens.npy"), tokens.numpy())
    np.save(os.path.join(oracle, "logits.npy"), logits.numpy())
    with open(os.path.join(oracle, "model.json"), "w") as f:
        json.dump(vars(a), f, indent=1)
    print(f"saved {a.dtype} LlamaForCausalLM to {out} "
          f"(files: {', '.join(sorted(os.listdir(out)))}), oracle {oracle}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
