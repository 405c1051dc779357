#!/usr/bin/env python3
"""Write a real Megatron-core distributed checkpoint of a tiny GPTModel on CPU.

Usage:
    python make_mcore_checkpoint.py OUTDIR [--tp T] [--backend zarr|torch_dist]
                                   [--verify-load] [--with-optimizer] [--seed S]
                                   [--with-args] [--legacy DIR] [--oracle DIR]
                                   [--prefix P] [MODEL SIZE] [ARCH]
    python make_mcore_checkpoint.py DUMP --tp T --load-from CKPT [MODEL SIZE]
                                   [ARCH] [--timing]
    python make_mcore_checkpoint.py ORACLE --logits-from CKPT [MODEL SIZE]
                                   [ARCH]

MODEL SIZE: --layers, --hidden, --ffn, --heads, --groups, --vocab (default
the tiny model below; --ffn defaults to twice --hidden).  With --timing a load writes DUMP.<rank>.json (the
load's wall time between two barriers, the bytes the rank read, its peak
RSS) instead of the tensors, and the model is built without initialising
its weights (the load overwrites them): what scripts/bench_mcore measures.

ARCH: --tied (share_embeddings_and_output_weights: no output_layer.weight),
--rope-base (RoPE theta, default 10000), --norm-eps (RMSNorm epsilon,
default 1e-5).  A load must be given the ARCH the checkpoint was saved with.

--with-args saves the state dict the way Megatron-LM's training loop does
(checkpointing.py's generate_state_dict: the model's sharded state dict
under 'model', beside it 'args' - an argparse.Namespace of the run's
arguments - 'checkpoint_version' and 'iteration'); the non-sharded part,
args included, lands in the dist checkpoint's common.pt.

--legacy DIR also saves the same model per TP rank the way Megatron-LM's
--ckpt-format torch does (DIR/mp_rank_TT/model_optim_rng.pt: args,
checkpoint_version, iteration and model.state_dict_for_save_checkpoint()).

--logits-from CKPT loads CKPT into a tp=1 model in this one process and
writes into the directory ORACLE: tokens.npy (a fixed int64 token batch
[2, 24] below --vocab, seed 7), logits.npy (the model's float32 logits of
it, [2, 24, padded vocab]: megatron-core's own forward of the checkpoint)
state.npz (the loaded model.state_dict()) and model.json (MODEL SIZE and
ARCH).  --oracle DIR does the same after a save, in the same run.

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


def _no_jit_extensions():
    """megatron/core/inference/unified_memory.py JIT-compiles a CUDA
    extension at import time.  Without a GPU and without
    TORCH_CUDA_ARCH_LIST it dies with IndexError in _get_cuda_arch_flags
    (not caught); with the arch list set it spends ~17 s in g++/nvcc and
    then fails (caught).  Make it fail fast with an exception that megatron
    catches."""
    import torch.utils.cpp_extension as cpp_ext

    def _no_jit(*args, **kwargs):
        raise RuntimeError("JIT CUDA extensions disabled (CPU-only run)")

    cpp_ext.load_inline = _no_jit


def _cpu_workarounds():
    """Patches needed to run megatron-core 0.15 on a machine without a GPU."""
    import torch
    _no_jit_extensions()

    # zarr strategy calls torch.cuda.synchronize() after every tensor copy.
    if not torch.cuda.is_available():
        torch.cuda.synchronize = lambda *a, **k: None
        # torch_dist save finalize (state_dict_saver.py) and async_utils build
        # small int tensors on device=torch.cuda.current_device() for an
        # all_reduce; on CPU/gloo they must live on the CPU.
        torch.cuda.current_device = lambda: "cpu"


# What every rank imports before its first step.  spawn_ranks imports them
# once, in the parent, so that forked ranks start with them loaded.
RANK_IMPORTS = (
    "torch.distributed",
    "megatron.core.parallel_state",
    "megatron.core.dist_checkpointing",
    "megatron.core.models.gpt",
    "megatron.core.optimizer",
)


def spawn_ranks(fn, args, nprocs, imports=RANK_IMPORTS):
    """torch.multiprocessing.spawn(fn, args, nprocs), but the ranks are
    forked from this process once it has imported `imports`: a spawned rank
    imports torch and megatron-core anew (about 8 s here), a forked one has
    them already.  Call it only from a process that has run no torch
    computation yet: OpenMP's thread pool does not survive a fork."""
    import importlib

    import torch.multiprocessing as mp
    _no_jit_extensions()
    for name in imports:
        importlib.import_module(name)
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True,
                       start_method="fork")


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
# What the sizes do not tell: tied embeddings, RoPE theta, RMSNorm epsilon
# (the defaults are the models the other tests save).
ARCH = dict(tied=False, rope_base=10000.0, norm_eps=1e-5)
MAX_SEQ = 128
TOKENS_SHAPE = (2, 24)


def fixed_tokens(vocab):
    """The token batch of the logits oracles."""
    import torch
    g = torch.Generator().manual_seed(7)
    return torch.randint(0, vocab, TOKENS_SHAPE, generator=g)


def build_model(tp, seed, size=None, init=True, arch=None, vocab_divisor=128):
    import torch
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    size = dict(size or TINY)
    size["ffn"] = size["ffn"] or 2 * size["hidden"]
    arch = dict(ARCH, **(arch or {}))
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
        layernorm_epsilon=arch["norm_eps"],
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
        vocab_size=pad_vocab(size["vocab"], tp, vocab_divisor),
        max_sequence_length=MAX_SEQ,
        pre_process=True,
        post_process=True,
        share_embeddings_and_output_weights=arch["tied"],
        position_embedding_type="rope",
        rotary_base=arch["rope_base"],
    )
    return model


def megatron_lm_args(size, arch, tp):
    """The args a Megatron-LM run of this model saves (an argparse.Namespace
    as its arguments.py leaves it; the fields a converter reads)."""
    import torch
    size = dict(size or TINY)
    size["ffn"] = size["ffn"] or 2 * size["hidden"]
    arch = dict(ARCH, **(arch or {}))
    return argparse.Namespace(
        num_layers=size["layers"], hidden_size=size["hidden"],
        ffn_hidden_size=size["ffn"], num_attention_heads=size["heads"],
        group_query_attention=size["groups"] != size["heads"],
        num_query_groups=size["groups"],
        kv_channels=size["hidden"] // size["heads"],
        norm_epsilon=arch["norm_eps"], rotary_base=arch["rope_base"],
        rotary_percent=1.0, rotary_interleaved=False,
        max_position_embeddings=MAX_SEQ, seq_length=MAX_SEQ,
        untie_embeddings_and_output_weights=not arch["tied"],
        swiglu=True, normalization="RMSNorm",
        position_embedding_type="rope", add_bias_linear=False,
        add_qkv_bias=False, padded_vocab_size=pad_vocab(size["vocab"], tp),
        vocab_size=size["vocab"], make_vocab_size_divisible_by=128,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=1,
        virtual_pipeline_model_parallel_size=None,
        params_dtype=torch.float32, bf16=False, fp16=False,
        use_dist_ckpt=True, ckpt_format="torch_dist", iteration=1)


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
            size=None, arch=None, with_args=False, legacy=None):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    _cpu_workarounds()

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world_size)

    from megatron.core import dist_checkpointing, parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=world_size)

    model = build_model(world_size, seed, size, arch=arch)
    prefix = (arch or {}).get("prefix", "")   # NeMo's: "model."
    sharded_sd = model.sharded_state_dict(prefix=prefix)
    if with_optimizer:
        # step first (changes the weights), then rebuild the model part
        opt_sd, loss = optimizer_sharded_state_dict(model, sharded_sd, seed,
                                                     (size or TINY)["vocab"])
        sharded_sd = model.sharded_state_dict(prefix=prefix)
        if rank == 0:
            print(f"one AdamW step done, loss={loss:.4f}", flush=True)
        sharded_sd = {"model": sharded_sd, "optimizer": opt_sd}
    if with_args:
        if not with_optimizer:
            sharded_sd = {"model": sharded_sd}
        args = megatron_lm_args(size, arch, world_size)
        args.ckpt_format = backend
        sharded_sd.update(args=args, checkpoint_version=3.0, iteration=1)

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
    if legacy:
        # Megatron-LM's --ckpt-format torch (checkpointing.py save_checkpoint,
        # generate_state_dict with use_dist_ckpt False): per TP rank
        # mp_rank_TT/model_optim_rng.pt holding args and
        # model.state_dict_for_save_checkpoint() - the local module names,
        # layers numbered, the linear layers' _extra_state (None) included
        args = megatron_lm_args(size, arch, world_size)
        args.ckpt_format, args.use_dist_ckpt = "torch", False
        d = os.path.join(legacy, f"mp_rank_{rank:02d}")
        os.makedirs(d, exist_ok=True)
        torch.save({"args": args, "checkpoint_version": 3.0, "iteration": 1,
                    "model": model.state_dict_for_save_checkpoint(),
                    "num_floating_point_operations_so_far": 0},
                   os.path.join(d, "model_optim_rng.pt"))
        dist.barrier()
        if rank == 0:
            print(f"saved the same model per rank (Megatron-LM --ckpt-format "
                  f"torch) to {legacy}", flush=True)

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
        if with_optimizer or with_args:
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


def _load_worker(rank, world_size, port, ckpt, dump, seed, size=None, timing=False,
                 arch=None):
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
    model = build_model(world_size, seed + 1, size, init=not timing, arch=arch)
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


def write_logits(oracle, ckpt, seed, size=None, arch=None):
    """--logits-from: CKPT loaded at tp=1 here; its forward on the fixed
    tokens (explicit causal mask and a no-op rng fork: on CPU)."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(_free_port())
    _cpu_workarounds()
    import contextlib
    import json

    import numpy as np
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=0, world_size=1)
    from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
    from megatron.core.dist_checkpointing.strategies.zarr import (
        ZarrLoadShardedStrategy,
    )
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    if not torch.cuda.is_available():
        tensor_parallel.get_cuda_rng_tracker().fork = \
            lambda *a, **k: contextlib.nullcontext()
    model = build_model(1, seed + 1, size, arch=arch)
    ckpt = resolve_load_dir(ckpt)
    with open(os.path.join(ckpt, "metadata.json")) as f:
        backend = json.load(f)["sharded_backend"]
    strategy = ZarrLoadShardedStrategy() if backend == "zarr" else None
    prefix = (arch or {}).get("prefix", "")
    loaded = dist_checkpointing.load(model.sharded_state_dict(prefix=prefix),
                                     ckpt, sharded_strategy=strategy)
    if prefix:
        loaded = {k[len(prefix):]: v for k, v in loaded.items()}
    model.load_state_dict(loaded, strict=False)
    model.eval()
    tokens = fixed_tokens((size or TINY)["vocab"])
    b, s = tokens.shape
    pos = torch.arange(s).unsqueeze(0).expand(b, -1)
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)[None, None]
    with torch.no_grad():
        logits = model(tokens, pos, attention_mask=mask)
    os.makedirs(oracle, exist_ok=True)
    np.save(os.path.join(oracle, "tokens.npy"), tokens.numpy())
    np.save(os.path.join(oracle, "logits.npy"), logits.float().numpy())
    with open(os.path.join(oracle, "model.json"), "w") as f:
        json.dump({"size": dict(size or TINY), "arch": dict(ARCH, **(arch or {})),
                   "max_seq": MAX_SEQ, "padded_vocab": int(logits.shape[-1])}, f)
    np.savez(os.path.join(oracle, "state.npz"),
             **{k: v.detach().cpu().numpy() for k, v in model.state_dict().items()
                if isinstance(v, torch.Tensor) and not k.endswith("_extra_state")})
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
    ap.add_argument("--tied", action="store_true",
                    help="share the embedding and the output layer's weight")
    ap.add_argument("--rope-base", type=float, default=ARCH["rope_base"],
                    help="RoPE theta (default %(default)s)")
    ap.add_argument("--norm-eps", type=float, default=ARCH["norm_eps"],
                    help="RMSNorm epsilon (default %(default)s)")
    ap.add_argument("--with-args", action="store_true",
                    help="save as Megatron-LM does: the model under 'model', "
                         "its args (an argparse.Namespace) in common.pt")
    ap.add_argument("--logits-from", metavar="CKPT",
                    help="instead of saving: load CKPT at tp=1 and write "
                         "OUTDIR/{tokens,logits}.npy and OUTDIR/state.npz")
    ap.add_argument("--legacy", metavar="DIR",
                    help="also save the same model as Megatron-LM's "
                         "--ckpt-format torch does: DIR/mp_rank_TT/"
                         "model_optim_rng.pt with args (DIR is the "
                         "iteration directory)")
    ap.add_argument("--prefix", default="",
                    help="key prefix of the saved sharded state dict "
                         "(NeMo saves its GPTModel under \"model.\")")
    ap.add_argument("--oracle", metavar="DIR",
                    help="after saving: what --logits-from DIR writes, from "
                         "the saved checkpoint (loaded back at tp=1 here)")
    ap.add_argument("--timing", action="store_true",
                    help="with --load-from: write the load's time, bytes read "
                         "and peak RSS to OUTDIR.<rank>.json, not its tensors")
    ap.add_argument("--load-from", metavar="CKPT",
                    help="instead of saving: load the checkpoint CKPT (an "
                         "iteration directory, or a root with its tracker "
                         "file, as --load takes) into a model at --tp and "
                         "write each rank's tensors to OUTDIR.<rank>.npz")
    args = ap.parse_args(argv)

    size = {k: getattr(args, k) for k in TINY}
    arch = dict(tied=args.tied, rope_base=args.rope_base, norm_eps=args.norm_eps,
                prefix=args.prefix)
    if args.logits_from:
        write_logits(os.path.abspath(args.outdir), os.path.abspath(args.logits_from),
                     args.seed, size, arch)
        return 0
    if args.load_from:
        spawn_ranks(_load_worker, (args.tp, _free_port(), os.path.abspath(args.load_from),
                                   os.path.abspath(args.outdir), args.seed, size,
                                   args.timing, arch), args.tp)
        return 0

    outdir = os.path.abspath(args.outdir)
    if os.path.exists(outdir) and os.listdir(outdir):
        ap.error(f"{outdir} exists and is not empty")

    port = _free_port()
    spawn_ranks(_worker, (args.tp, port, outdir, args.backend, args.verify_load, args.seed,
                          args.with_optimizer, size, arch, args.with_args,
                          args.legacy and os.path.abspath(args.legacy)), args.tp)
    if args.oracle:
        write_logits(os.path.abspath(args.oracle), outdir, args.seed, size, arch)


if __name__ == "__main__":
    sys.exit(main())
