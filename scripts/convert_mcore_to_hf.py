#!/usr/bin/env python3
"""Offline conversion of a megatron-core Llama-style GPTModel dist
checkpoint (zarr or torch_dist) to an HF transformers Llama directory, the
way a user's converter does it: the baseline of scripts/bench_hf.

    python convert_mcore_to_hf.py CKPT OUTDIR [MODEL SIZE] [ARCH]

MODEL SIZE and ARCH as scripts/make_mcore_checkpoint.py takes them (the
checkpoint's; --vocab is the true vocabulary).  Builds the GPTModel at
tp=1 in this one process (gloo), loads CKPT into it with megatron-core's
dist_checkpointing.load, takes model.state_dict(), splits each layer's
linear_qkv into q/k/v (per query group: heads/groups query heads, one key
head, one value head) and linear_fc1 into gate/up, cuts the vocabulary
padding, and writes OUTDIR/config.json (LlamaConfig) and
OUTDIR/model.safetensors (safetensors.torch.save_file).

Bench-only: the tests do not use it as an oracle.  Runs in .venv-mcore.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def hf_state_dict(sd, size, tied):
    """megatron-core local-spec state_dict names -> HF Llama names."""
    import torch
    H, nh, ng = size["hidden"], size["heads"], size["groups"]
    d = H // nh
    per = nh // ng
    V = size["vocab"]
    out = {"model.embed_tokens.weight": sd["embedding.word_embeddings.weight"][:V],
           "model.norm.weight": sd["decoder.final_layernorm.weight"]}
    if not tied:
        out["lm_head.weight"] = sd["output_layer.weight"][:V]
    for i in range(size["layers"]):
        m, h = f"decoder.layers.{i}.", f"model.layers.{i}."
        qkv = sd[m + "self_attention.linear_qkv.weight"].view(ng, (per + 2) * d, H)
        q, k, v = torch.split(qkv, [per * d, d, d], dim=1)
        out[h + "self_attn.q_proj.weight"] = q.reshape(nh * d, H)
        out[h + "self_attn.k_proj.weight"] = k.reshape(ng * d, H)
        out[h + "self_attn.v_proj.weight"] = v.reshape(ng * d, H)
        out[h + "self_attn.o_proj.weight"] = sd[m + "self_attention.linear_proj.weight"]
        gate, up = torch.chunk(sd[m + "mlp.linear_fc1.weight"], 2, dim=0)
        out[h + "mlp.gate_proj.weight"] = gate
        out[h + "mlp.up_proj.weight"] = up
        out[h + "mlp.down_proj.weight"] = sd[m + "mlp.linear_fc2.weight"]
        out[h + "input_layernorm.weight"] = sd[m + "input_layernorm.weight"]
        out[h + "post_attention_layernorm.weight"] = sd[m + "pre_mlp_layernorm.weight"]
    return {k: v.contiguous().clone() for k, v in out.items()}


def convert(ckpt, outdir, size, arch):
    import make_mcore_checkpoint as mm
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(mm._free_port())
    mm._cpu_workarounds()
    import json

    import torch
    import torch.distributed as dist
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    dist.init_process_group("gloo", rank=0, world_size=1)
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.dist_checkpointing.strategies.zarr import (
        ZarrLoadShardedStrategy,
    )
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    model = mm.build_model(1, 0, size, init=False, arch=arch)
    ckpt = mm.resolve_load_dir(ckpt)
    with open(os.path.join(ckpt, "metadata.json")) as f:
        backend = json.load(f)["sharded_backend"]
    strategy = ZarrLoadShardedStrategy() if backend == "zarr" else None
    loaded = dist_checkpointing.load(model.sharded_state_dict(prefix=""), ckpt,
                                     sharded_strategy=strategy)
    model.load_state_dict(loaded, strict=False)
    del loaded
    sd = hf_state_dict(model.state_dict(), size, arch["tied"])
    del model
    ffn = size["ffn"] or 2 * size["hidden"]
    config = LlamaConfig(
        vocab_size=size["vocab"], hidden_size=size["hidden"],
        intermediate_size=ffn, num_hidden_layers=size["layers"],
        num_attention_heads=size["heads"],
        num_key_value_heads=size["groups"],
        max_position_embeddings=mm.MAX_SEQ, rms_norm_eps=arch["norm_eps"],
        rope_theta=arch["rope_base"], tie_word_embeddings=arch["tied"],
        hidden_act="silu", attention_bias=False, mlp_bias=False,
        architectures=["LlamaForCausalLM"], dtype="float32")
    os.makedirs(outdir, exist_ok=True)
    config.save_pretrained(outdir)
    save_file(sd, os.path.join(outdir, "model.safetensors"),
              metadata={"format": "pt"})
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


def main(argv=None):
    import make_mcore_checkpoint as mm
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpt")
    ap.add_argument("outdir")
    for name, default in mm.TINY.items():
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--rope-base", type=float, default=mm.ARCH["rope_base"])
    ap.add_argument("--norm-eps", type=float, default=mm.ARCH["norm_eps"])
    a = ap.parse_args(argv)
    size = {k: getattr(a, k) for k in mm.TINY}
    arch = dict(tied=a.tied, rope_base=a.rope_base, norm_eps=a.norm_eps)
    t0 = time.monotonic()
    convert(os.path.abspath(a.ckpt), os.path.abspath(a.outdir), size, arch)
    print(f"converted {a.ckpt} -> {a.outdir} in {time.monotonic() - t0:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
