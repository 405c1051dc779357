#!/usr/bin/env python3
"""Resume a DeepSpeed ZeRO checkpoint the way a real job does, and record what
DeepSpeed resumed with.

Run under torch.distributed.run, any number of processes, on CPU:

    DS_ACCELERATOR=cpu .venv-mcore/bin/python -m torch.distributed.run \
        --nproc-per-node N tests/mount/ds_resume.py --src DIR \
        --model {llama,plain} --stage S --dtype D --out RESULT.pt [--universal]

It builds the engine exactly as ds_writer.py does (same model, seed, AdamW
hyperparameters, ds config), calls engine.load_checkpoint(DIR) -- with
"checkpoint": {"load_universal": true} under --universal, so DIR must hold
`latest_universal` -- and rank 0 saves RESULT.pt:

  fp32, exp_avg, exp_avg_sq  {name: full fp32 tensor} for every trainable
                             parameter (named_parameters(), so a tied one once)
  step                       sorted distinct optimizer 'step' values (floats)
  global_steps               engine.global_steps after the load
  frozen                     {name: full tensor as float32} of frozen params
  buffers                    {name: tensor as float32} of the module's buffers
  after_step                 {name: full fp32 tensor} after one more training
                             step on a fixed batch, the same on every rank
  world_size                 N

Without --universal it is a plain same-world-size resume (the reference).
"""
import argparse
import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch
import deepspeed
from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

from ds_writer import batch, build_engine, train_step


def full_fp32(engine):
    """Collective: every rank must call it."""
    return {n: safe_get_full_fp32_param(p).detach().float().cpu().clone()
            for n, p in engine.module.named_parameters() if p.requires_grad}


def opt_steps(engine):
    opt = engine.optimizer
    base = getattr(opt, "optimizer", opt)
    return sorted({float(s["step"]) for s in base.state.values() if "step" in s})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", required=True)
    ap.add_argument("--model", choices=("llama", "plain"), required=True)
    ap.add_argument("--stage", type=int, choices=(1, 2, 3), required=True)
    ap.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--universal", action="store_true")
    a = ap.parse_args()

    deepspeed.init_distributed("gloo")
    rank = torch.distributed.get_rank()
    extra = {"checkpoint": {"load_universal": True}} if a.universal else None
    engine, _ = build_engine(a.model, a.stage, a.dtype, extra)
    path, _ = engine.load_checkpoint(a.src)
    assert path is not None, f"nothing loaded from {a.src}"

    # ZeRO-1/2 links the optimizer-state fragments only at the first step();
    # after a non-universal load safe_get_full_optimizer_state would fail.
    link = getattr(engine.optimizer, "_lazy_init_hp_params_optimizer_state", None)
    if link is not None:
        link()
    named = list(engine.module.named_parameters())
    res = {"world_size": torch.distributed.get_world_size(),
           "fp32": full_fp32(engine), "step": opt_steps(engine),
           "global_steps": engine.global_steps}
    for key in ("exp_avg", "exp_avg_sq"):
        res[key] = {n: safe_get_full_optimizer_state(p, key).detach().float().cpu().clone()
                    for n, p in named if p.requires_grad}
    frozen = [(n, p) for n, p in named if not p.requires_grad]
    with deepspeed.zero.GatheredParameters([p for _, p in frozen], enabled=a.stage == 3):
        res["frozen"] = {n: p.detach().float().cpu().clone() for n, p in frozen}
    res["buffers"] = {n: b.detach().float().cpu().clone()
                      for n, b in engine.module.named_buffers()}

    train_step(engine, batch(1234))   # the same batch on every rank
    res["after_step"] = full_fp32(engine)
    if rank == 0:
        torch.save(res, a.out)
    torch.distributed.barrier()


if __name__ == "__main__":
    main()
