#!/usr/bin/env python3
"""Write a real DeepSpeed ZeRO checkpoint of a tiny model, for the mount tests.

Run under torch.distributed.run, any number of processes, on CPU:

    DS_ACCELERATOR=cpu .venv-mcore/bin/python -m torch.distributed.run \
        --nproc-per-node 2 tests/mount/ds_writer.py \
        --stage {1,2,3} --dtype {fp32,bf16,fp16} --model {llama,plain} \
        --out DIR [--steps 2] [--hf-trainer]

Models (both have one frozen parameter and one tied parameter):
  llama  tiny transformers LlamaForCausalLM (vocab 96, hidden 32, intermediate
         64, 2 layers, 4 heads, 2 kv heads, tied embeddings), layer 0's
         mlp.down_proj.weight frozen; rank 0 writes DIR/config.json.
  plain  nn.Module: embed (96x24), fc1 Linear(24, 45), fc2 Linear(45, 24),
         LayerNorm(24), a persistent buffer `scale`, head.weight tied to
         embed.weight, fc1.bias frozen (odd sizes, so ZeRO pads).

The run takes --steps real AdamW steps (two param groups, as the HF Trainer
makes them: weight decay for matrices, none for biases and norms) with
fixed seeds (rank-dependent batches) and then engine.save_checkpoint(DIR): DIR/global_step<N>/, DIR/latest,
DIR/zero_to_fp32.py.  With --hf-trainer the layout is that of a HF Trainer
save: DIR/checkpoint-<N>/ holds config.json (llama), model.safetensors (the
16-bit module weights; ZeRO-3 gathers them), trainer_state.json,
rng_state_<rank>.pth and the DeepSpeed save (global_step<N>/, latest).

ds_resume.py imports build_engine, batch and train_step from here.
"""
import argparse
import json
import os
import random

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import deepspeed

VOCAB, SEQ = 96, 8
LR, BETAS, EPS, WD = 1e-2, (0.9, 0.999), 1e-8, 0.01


class Plain(nn.Module):
    def __init__(self, hidden=24, inner=45):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, hidden)
        self.fc1 = nn.Linear(hidden, inner)
        self.fc2 = nn.Linear(inner, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, VOCAB, bias=False)
        self.head.weight = self.embed.weight          # tied
        self.register_buffer("scale", torch.linspace(0.5, 1.5, hidden))

    def forward(self, input_ids, labels):
        h = self.embed(input_ids)
        h = h + self.fc2(torch.relu(self.fc1(h)))
        h = self.norm(h) * self.scale.to(h.dtype)     # DeepSpeed may leave buffers fp32
        logits = self.head(h).float()
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())


def llama_config():
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                       num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=64,
                       tie_word_embeddings=True)


def ds_config(stage, dtype, extra=None):
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
           "zero_optimization": {"stage": stage},
           "zero_allow_untested_optimizer": True}
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    elif dtype == "fp16":
        cfg["fp16"] = {"enabled": True, "loss_scale": 128}   # static: no skipped steps
    cfg.update(extra or {})
    return cfg


def build_engine(model_kind, stage, dtype, extra=None):
    """Same seed, model, optimizer and config for the writer and the resumer.
    Returns (engine, hf_config or None)."""
    ds = ds_config(stage, dtype, extra)
    if dtype == "fp16":
        # DeepSpeed's CPU accelerator reports fp16 only where oneDNN has it;
        # torch's CPU kernels run this tiny fp16 model fine.
        from deepspeed.accelerator import get_accelerator
        type(get_accelerator()).is_fp16_supported = lambda self: True
    torch.manual_seed(0)
    cfg = llama_config() if model_kind == "llama" else None

    def make():
        if cfg is None:
            return Plain()
        from transformers import LlamaForCausalLM
        return LlamaForCausalLM(cfg)

    if stage == 3:
        with deepspeed.zero.Init(config_dict_or_path=ds):
            model = make()
    else:
        model = make()
    frozen = (model.model.layers[0].mlp.down_proj.weight if cfg is not None
              else model.fc1.bias)
    frozen.requires_grad_(False)
    # two param groups, as the HF Trainer makes them: weight decay for
    # the matrices, none for biases and norms
    # (zero.Init leaves a partitioned param's shape in ds_shape)
    train = [p for p in model.parameters() if p.requires_grad]
    matrix = [len(getattr(p, "ds_shape", p.shape)) > 1 for p in train]
    groups = [{"params": [p for p, m in zip(train, matrix) if m],
               "weight_decay": WD},
              {"params": [p for p, m in zip(train, matrix) if not m],
               "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=ds)
    return engine, cfg


def batch(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (1, SEQ), generator=g)


def loss_of(engine, ids):
    out = engine(input_ids=ids, labels=ids)
    return out.loss if hasattr(out, "loss") else out


def train_step(engine, ids):
    loss = loss_of(engine, ids)
    engine.backward(loss)
    engine.step()
    return loss.item()


def hf_weights(engine, stage):
    """The 16-bit module state dict as HF Trainer saves it (collective for ZeRO-3)."""
    if stage == 3:
        return engine._zero3_consolidated_16bit_state_dict()
    return engine.module.state_dict()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stage", type=int, choices=(1, 2, 3), required=True)
    ap.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), required=True)
    ap.add_argument("--model", choices=("llama", "plain"), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--hf-trainer", action="store_true")
    a = ap.parse_args()

    deepspeed.init_distributed("gloo")
    rank = torch.distributed.get_rank()
    engine, cfg = build_engine(a.model, a.stage, a.dtype)
    for s in range(a.steps):
        train_step(engine, batch(100 * s + rank))

    out = a.out
    if a.hf_trainer:
        out = os.path.join(a.out, f"checkpoint-{a.steps}")
        sd = hf_weights(engine, a.stage)
        if rank == 0:
            os.makedirs(out, exist_ok=True)
            if cfg is not None:
                engine.module.save_pretrained(out, state_dict=sd, safe_serialization=True)
            else:
                from safetensors.torch import save_file
                save_file({k: v.detach().clone().contiguous() for k, v in sd.items()
                           if k != "head.weight"},                 # tied alias dropped
                          os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
            with open(os.path.join(out, "trainer_state.json"), "w") as f:
                json.dump({"global_step": a.steps, "epoch": 1.0, "log_history": [],
                           "max_steps": a.steps, "train_batch_size": 1}, f, indent=2)
        torch.distributed.barrier()
        torch.save({"python": random.getstate(), "numpy": np.random.get_state(),
                    "cpu": torch.random.get_rng_state()},
                   os.path.join(out, f"rng_state_{rank}.pth"))
    engine.save_checkpoint(out)
    if rank == 0 and cfg is not None and not a.hf_trainer:
        cfg.save_pretrained(out)
    torch.distributed.barrier()


if __name__ == "__main__":
    main()
