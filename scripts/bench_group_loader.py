#!/usr/bin/env python3
"""One node's megatron-core load for scripts/bench_group (--mcore).

    .venv-mcore/bin/python scripts/bench_group_loader.py CKPT ORACLE.npz
        [--rank R --world N --master ADDR --port P] [--exchange ALGO]
        [--layers L --hidden H --ffn F --heads A --groups G --vocab V]

Builds scripts/make_mcore_checkpoint.py's GPTModel at tp=1 (weights not
initialised: the load must overwrite them), one torch thread, then prints
"ready" and waits for a line on stdin.  On it, it loads CKPT:

  world 1 (the default)  the ordinary dist_checkpointing.load with the
                         checkpoint's default strategy, as a node loading
                         its reshardfs view does;
  world N                rank R of a gloo job of N data-parallel replicas
                         (rendezvous at ADDR:P, gloo over eth0, the node's
                         link): dist_checkpointing.load with
                         FullyParallelLoadStrategyWrapper(default strategy,
                         the data-parallel group, exchange_algo=ALGO), so
                         that each rank reads a share of CKPT and the
                         shares are exchanged over gloo.

then load_state_dict, and prints "done <json>" (the load's seconds and
the bytes the process read).  Then it compares every tensor of the model
with ORACLE.npz (scripts/make_mcore_checkpoint.py --load-from's dump of
one load of the source) and prints "checked <json>" with the tensors that
differ.  Exit status 0 unless the load failed.

ALGO: megatron-core's default, broadcast (and gather_rounds), make CUDA
tensors for the exchange (exchange_utils.py: .cuda(), init_data("cuda"),
device="cuda"), which a CPU-only job cannot; gather_object
(all_gather_object of each rank's loaded tensors) runs on the CPU and is
the default here.
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_mcore_checkpoint as mm  # noqa: E402
from bench_lib import proc_io  # noqa: E402


def proc_read_bytes():
    return proc_io()["rchar"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("oracle")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--master", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--exchange", default="gather_object")
    for name, default in mm.TINY.items():
        ap.add_argument(f"--{name}", type=int, default=default)
    a = ap.parse_args()
    size = {k: getattr(a, k) for k in mm.TINY}

    os.environ["MASTER_ADDR"] = a.master
    os.environ["MASTER_PORT"] = str(a.port or mm._free_port())
    if a.world > 1:
        # The node's own link; otherwise gloo takes the address the host
        # name resolves to, which other nodes cannot reach.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0")
    mm._cpu_workarounds()
    import numpy as np
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=a.rank, world_size=a.world)
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.dist_checkpointing.serialization import (
        get_default_load_sharded_strategy)
    from megatron.core.dist_checkpointing.strategies.fully_parallel import (
        FullyParallelLoadStrategyWrapper)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    model = mm.build_model(1, 1235, size, init=False)
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 1

    r0, t0 = proc_read_bytes(), time.monotonic()
    strategy = None
    if a.world > 1:
        strategy = FullyParallelLoadStrategyWrapper(
            get_default_load_sharded_strategy(a.ckpt),
            parallel_state.get_data_parallel_group(with_context_parallel=True),
            exchange_algo=a.exchange)
    loaded = dist_checkpointing.load(model.sharded_state_dict(prefix=""),
                                     a.ckpt, sharded_strategy=strategy)
    model.load_state_dict(loaded, strict=False)
    seconds = time.monotonic() - t0
    print("done " + json.dumps({"rank": a.rank, "seconds": seconds,
                                "rchar": proc_read_bytes() - r0}), flush=True)
    del loaded

    ref = np.load(a.oracle)
    got = {k: v.detach().numpy() for k, v in model.state_dict().items()
           if isinstance(v, torch.Tensor) and not k.endswith("_extra_state")}
    bad = sorted(set(ref.files) ^ set(got))
    bad += [k for k in ref.files if k in got and
            not np.array_equal(got[k], ref[k])]
    print("checked " + json.dumps({"rank": a.rank, "tensors": len(got),
                                   "bad": bad}), flush=True)
    if a.world > 1:
        dist.barrier()
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
