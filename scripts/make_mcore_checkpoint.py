#!/usr/bin/env python3
"""Write a real Megatron-core distributed checkpoint of a tiny GPTModel on CPU.

Usage:
    python make_mcore_checkpoint.py OUTDIR [--tp T] [--backend zarr|torch_dist]
                                   [--verify-load] [--with-optimizer] [--seed S]
                                   [MODEL SIZE]
    python make_mcore_checkpoint.py DUMP --tp T --load-from CKPT [MODEL SIZE]
                                   [--timing]

MODEL SIZE: --layers, --hidden, --ffn, --heads, --groups, --vocab (default
the tiny model below; --ffn defaults to twice --hidden).  With --timing a load writes DUMP.<rank>.json (the
load's wall time between two barriers, the bytes the rank read, its peak
RSS) instead of the tensors, and the model is built without initialising
its weights (the load overwrites them): what scripts/bench_mcore measures.

Spawns T processes (torch.multiprocessing), joins them with torch.distributed
over gloo on 127.0.0.1, builds a tiny GPTModel (2 layers, hidden 64, ffn 128,
8 heads, 4 query groups (GQA), SwiGLU, RMSNorm, RoPE, vocab 1000 padded per
Megatron rules) at tensor-parallel size T with the local (non-TE) layer spec,
and saves its sharded_state_dict with megatron.core.dist_checkpointing.save.

Needs: torch (the PyPI CUDA build works without a GPU), megatron-core <= 0.15.x
(0.16 removed the zarr backend), numpy<2, zarr<3 (for --backend zarr).
No GPU, transformer_engine or apex required.
"""

import argparse
import os
import socket
import sys


def _cpu_workarounds():
    """Patches needed to run megatron-core 0.15 on a machine without a GPU."""
    import torch
    import torch.utils.cpp_extension as cpp_ext

    # megatron/core/inference/unified_memory.py JIT-compiles a CUDA extension
    # at import time. Without a GPU and without TORCH_CUDA_ARCH_LIST it dies
    # with IndexError in _get_cuda_arch_flags (not caught); with the arch list
    # set it spends ~17 s in g++/nvcc and then fails (caught). Make it fail
    # fast with an exception that megatron catches.
    def _no_jit(*args, **kwargs):
        raise RuntimeError("JIT CUDA extensions disabled (CPU-only run)")

    cpp_ext.load_inline = _no_jit

    # zarr strategy calls torch.cuda.synchronize() after every tensor copy.
    if not torch.cuda.is_available():
        torch.cuda.synchronize = lambda *a, **k: None
        # torch_dist save finalize (state_dict_saver.py) and async_utils build
        # small int tensors on device=torch.cuda.current_device() for an
        # all_reduce; on CPU/gloo they must live on the CPU.
        torch.cuda.current_device = lambda: "cpu"


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pad_vocab(vocab_size, tp, divisible_by=128):
    """Megatron-LM's _vocab_size_with_padding rule."""
    multiple = divisible_by * tp
    return ((vocab_size + multiple - 1) // multiple) * multiple


# The tiny model of the tests: 2 layers, hidden 64, ffn 128, 8 heads, 4
# query groups, vocab 1000.  ffn None: twice the hidden size.
TINY = dict(layers=2, hidden=64, ffn=None, heads=8, groups=4, vocab=1000)


def build_model(tp, seed, size=None, init=True):
    import torch
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    size = dict(size or TINY)
    size["ffn"] = size["ffn"] or 2 * size["hidden"]
    torch.manual_seed(seed)
    config = TransformerConfig(
        num_layers=size["layers"],
        hidden_size=size["hidden"],
        ffn_hidden_size=size["ffn"],
        num_attention_heads=size["heads"],
        num_query_groups=size["groups"],  # GQA, and TP up to 4
        gated_linear_unit=True,  # SwiGLU
        activation_func=F.silu,
        normalization="RMSNorm",
        add_bias_linear=False,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=1,
        use_cpu_initialization=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        perform_initialization=init,
        params_dtype=torch.float32,
        bf16=False,
        fp16=False,
        sequence_parallel=False,
        gradient_accumulation_fusion=False,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
    )
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
        vocab_size=pad_vocab(size["vocab"], tp),
        max_sequence_length=128,
        pre_process=True,
        post_process=True,
        share_embeddings_and_output_weights=False,
        position_embedding_type="rope",
    )
    return model


def optimizer_sharded_state_dict(model, model_sharded_sd, seed, vocab=1000):
    """AdamW state after one training step, as Megatron's FP32Optimizer
    (non-distributed optimizer) lays it out in a checkpoint:
    'optimizer.state.exp_avg.<param key>', 'optimizer.state.exp_avg_sq.<param key>',
    param_groups and the common step as common (non-sharded) state.

    megatron.core's FP32Optimizer/DDP wrappers allocate on 'cuda' in __init__,
    so this mirrors FP32Optimizer.sharded_state_dict() on a plain torch AdamW.
    """
    import torch
    from megatron.core.dist_checkpointing.optimizer import (
        get_param_id_to_sharded_param_map,
        optim_state_to_sharding_state,
    )

    import contextlib
    from megatron.core import tensor_parallel

    # attention dropout runs under get_cuda_rng_tracker().fork(); the tracker
    # cannot be seeded without CUDA (model_parallel_cuda_manual_seed calls
    # torch.cuda.manual_seed), so make fork() a no-op (dropout is 0 anyway).
    if not torch.cuda.is_available():
        tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
    # one real forward/backward step on random tokens
    g = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, vocab, (2, 16), generator=g)
    pos = torch.arange(16).unsqueeze(0).expand(2, -1)
    labels = torch.randint(0, vocab, (2, 16), generator=g)
    # explicit CPU causal mask (True = masked); the default one is built on 'cuda'
    mask = torch.triu(torch.ones(16, 16, dtype=torch.bool), diagonal=1)[None, None]
    loss = model(tokens, pos, attention_mask=mask, labels=labels).float().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()

    state_dict = opt.state_dict()
    id_map = get_param_id_to_sharded_param_map(model_sharded_sd, params)
    step = None
    for st in state_dict["state"].values():
        step = st.get("step", step)
    optim_state_to_sharding_state(state_dict, id_map, exclude_keys="step")
    if step is not None:
        state_dict["state"]["common_step"] = step
    return state_dict, float(loss.detach())


def _worker(rank, world_size, port, outdir, backend, verify_load, seed, with_optimizer=False,
            size=None):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    _cpu_workarounds()

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world_size)

    from megatron.core import dist_checkpointing, parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=world_size)

    model = build_model(world_size, seed, size)
    sharded_sd = model.sharded_state_dict(prefix="")
    if with_optimizer:
        # step first (changes the weights), then rebuild the model part
        opt_sd, loss = optimizer_sharded_state_dict(model, sharded_sd, seed,
                                                     (size or TINY)["vocab"])
        sharded_sd = model.sharded_state_dict(prefix="")
        if rank == 0:
            print(f"one AdamW step done, loss={loss:.4f}", flush=True)
        sharded_sd = {"model": sharded_sd, "optimizer": opt_sd}

    if backend == "zarr":
        strategy = ("zarr", 1)
    else:
        strategy = None  # default: torch_dist
    if rank == 0:
        os.makedirs(outdir, exist_ok=True)
    dist.barrier()
    dist_checkpointing.save(sharded_sd, outdir, sharded_strategy=strategy)
    dist.barrier()
    if rank == 0:
        print(f"saved {backend} checkpoint (tp={world_size}) to {outdir}", flush=True)

    if verify_load:
        ref = {k: v.detach().clone() for k, v in model.state_dict().items() if v is not None
               and isinstance(v, torch.Tensor)}
        # perturb the model, load the checkpoint back, compare
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
        load_sd = model.sharded_state_dict(prefix="")  # model part only
        load_strategy = None  # torch_dist: default TorchDistLoadShardedStrategy
        if backend == "zarr":
            # default zarr *load* strategy is tensorstore-based; use the
            # zarr-python one so that tensorstore is not needed
            from megatron.core.dist_checkpointing.strategies.zarr import (
                ZarrLoadShardedStrategy,
            )
            load_strategy = ZarrLoadShardedStrategy()
        if with_optimizer:
            loaded = dist_checkpointing.load({"model": load_sd}, outdir,
                                             sharded_strategy=load_strategy)["model"]
        else:
            loaded = dist_checkpointing.load(load_sd, outdir, sharded_strategy=load_strategy)
        model.load_state_dict(loaded, strict=False)
        bad = [k for k, v in model.state_dict().items()
               if k in ref and isinstance(v, torch.Tensor) and not torch.equal(v, ref[k])]
        status = "OK" if not bad else f"MISMATCH {bad}"
        print(f"rank {rank}: load check {status} ({len(ref)} tensors)", flush=True)
        if bad:
            raise SystemExit(1)

    dist.barrier()
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


def resolve_load_dir(path):
    """What Megatron-LM's --load does with a checkpoint root (its
    checkpointing.read_metadata and get_checkpoint_name): the tracker
    file holds an iteration number or 'release', and names the directory
    loaded.  A directory without a tracker is loaded as it is."""
    tracker = os.path.join(path, "latest_checkpointed_iteration.txt")
    if not os.path.exists(tracker):
        return path
    with open(tracker) as f:
        text = f.read().strip()
    try:
        name = "iter_{:07d}".format(int(text))
    except ValueError:
        if text != "release":
            raise SystemExit(f"{tracker}: invalid metadata file")
        name = "release"
    return os.path.join(path, name)


def _proc_io():
    with open("/proc/self/io") as f:
        return {k: int(v) for k, v in (ln.split(":") for ln in f if ":" in ln)}


def _load_worker(rank, world_size, port, ckpt, dump, seed, size=None, timing=False):
    """Builds the model at tp=world_size, loads `ckpt` (zarr or torch_dist) into it with
    megatron's own loader and writes each rank's tensors to dump.<rank>.npz
    (with `timing`: the load's figures to dump.<rank>.json)."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    _cpu_workarounds()

    import numpy as np
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world_size)

    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.dist_checkpointing.strategies.zarr import (
        ZarrLoadShardedStrategy,
    )

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=world_size)
    # a different init (none when timing): it must be overwritten
    model = build_model(world_size, seed + 1, size, init=not timing)
    ckpt = resolve_load_dir(ckpt)
    import json
    import resource
    import time
    dist.barrier()
    io0, t0 = _proc_io(), time.monotonic()
    with open(os.path.join(ckpt, "metadata.json")) as f:
        backend = json.load(f)["sharded_backend"]
    # zarr: the zarr-python strategy (the default one needs tensorstore);
    # torch_dist: megatron's default.
    strategy = ZarrLoadShardedStrategy() if backend == "zarr" else None
    loaded = dist_checkpointing.load(model.sharded_state_dict(prefix=""), ckpt,
                                     sharded_strategy=strategy)
    t1 = time.monotonic()
    model.load_state_dict(loaded, strict=False)
    rank_s = time.monotonic() - t0
    dist.barrier()
    wall_s, io1 = time.monotonic() - t0, _proc_io()
    if timing:
        with open(f"{dump}.{rank}.json", "w") as f:
            json.dump({"rank": rank, "load_s": wall_s, "rank_s": rank_s,
                       "dist_load_s": t1 - t0,
                       "rchar": io1["rchar"] - io0["rchar"],
                       "read_bytes": io1["read_bytes"] - io0["read_bytes"],
                       "max_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                       "params": sum(p.numel() for p in model.parameters())}, f)
    else:
        arrays = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()
                  if isinstance(v, torch.Tensor) and not k.endswith("_extra_state")}
        np.savez(f"{dump}.{rank}.npz", **arrays)
    dist.barrier()
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--backend", choices=["zarr", "torch_dist"], default="zarr")
    ap.add_argument("--verify-load", action="store_true",
                    help="load the checkpoint back with dist_checkpointing.load and compare")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--with-optimizer", action="store_true",
                    help="take one AdamW step and also save the optimizer state")
    for name, default in TINY.items():
        ap.add_argument(f"--{name}", type=int, default=default,
                        help=f"model size (default {default or 'twice --hidden'})")
    ap.add_argument("--timing", action="store_true",
                    help="with --load-from: write the load's time, bytes read "
                         "and peak RSS to OUTDIR.<rank>.json, not its tensors")
    ap.add_argument("--load-from", metavar="CKPT",
                    help="instead of saving: load the checkpoint CKPT (an "
                         "iteration directory, or a root with its tracker "
                         "file, as --load takes) into a model at --tp and "
                         "write each rank's tensors to OUTDIR.<rank>.npz")
    args = ap.parse_args(argv)

    import torch.multiprocessing as mp

    size = {k: getattr(args, k) for k in TINY}
    if args.load_from:
        mp.spawn(_load_worker, args=(args.tp, _free_port(), os.path.abspath(args.load_from),
                                     os.path.abspath(args.outdir), args.seed, size,
                                     args.timing),
                 nprocs=args.tp, join=True)
        return 0

    outdir = os.path.abspath(args.outdir)
    if os.path.exists(outdir) and os.listdir(outdir):
        ap.error(f"{outdir} exists and is not empty")

    port = _free_port()
    mp.spawn(_worker, args=(args.tp, port, outdir, args.backend, args.verify_load, args.seed,
                               args.with_optimizer, size),
             nprocs=args.tp, join=True)


if __name__ == "__main__":
    sys.exit(main())
