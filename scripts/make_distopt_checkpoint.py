#!/usr/bin/env python3
"""megatron-core's DistributedOptimizer on CPU: save its checkpoint forms, and
load one back and dump what the optimizer then holds.

  save OUT [--tp 2] [--world 4] [--forms a,b] [--buckets N] [--swiglu]
           [--pp N] [--experts E --ep N [--etp N] [--topk K]
           [--shared-expert] [--first-dense]]
           [--dump FILE] [--layers 2 --hidden 64 --ffn 256 --heads 4
           --vocab 128]
      trains a tiny bf16 GPTModel two steps at tp, pp, ep (dp =
      world/(tp*pp)) and saves
      model + optimizer as OUT/<form> for every form (torch_dist; a form
      written FORM:fully_parallel is saved as Megatron-LM's default
      --ckpt-fully-parallel-save does, into OUT/FORM_fully_parallel); --dump
      writes what the optimizer holds then, as load does.
  load CKPT --form F --tp T [--pp P] [--ep E] [--world W] [--swiglu]
       --dump FILE [--timing FILE] (and the model options save took)
      builds the same model at tp T (pp P, ep E), loads model + optimizer
      from CKPT with the metadata its common.pt records (as Megatron-LM
      does: the form it names, F when it names
      none), and writes FILE: for every rank and parameter, the fp32
      main param, exp_avg and exp_avg_sq shard the optimizer now holds, plus
      the model weights of that shard and the param groups' steps
      (torch.save of a list of per-rank dicts).  --timing FILE writes
      the seconds of the load itself (dist_checkpointing.load and the
      optimizer's load_state_dict, barrier to barrier) as JSON; with it,
      --dump may be left out.
  compare GOT WANT
      fails unless two dumps hold the same values, WANT's being trained.

Both run in .venv-mcore (torch, megatron-core) over gloo, one process per
rank. Only device placement is patched (see _cpu_patches): the code that
builds, saves and loads the optimizer's sharded state dicts is mcore's own.

With pipeline stages or experts (--pp > 1, --experts) the two steps take
made-up gradients (train_synthetic): the harness runs no pipeline schedule
or MoE forward on CPU, and the optimizer state, which is all these saves
are for, comes from megatron-core's own step either way.  --experts builds
an MoE model of local SequentialMLP experts (the allgather dispatcher; no
linear biases, which megatron-core 0.15.3 takes only at etp 1);
--first-dense makes layer 0 a dense MLP, so every layer is saved under
keys of its own.  load takes the same layout and model options.

--buckets 1 turns overlap_grad_reduce off, so DDP uses one bucket per
buffer; with more buckets megatron-core 0.15.3 writes a wrong
fully_reshardable checkpoint (its save gathers padded bucket shards that its
load does not expect), so tests use one bucket as the oracle's layout.
"""
import argparse
import contextlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_mcore_checkpoint import _cpu_workarounds, _free_port, spawn_ranks  # noqa: E402

FORMS = ("fully_reshardable", "dp_reshardable", "fully_sharded_model_space")


def _cpu_patches():
    """What DistributedOptimizer needs beyond make_mcore_checkpoint's patches
    to run without a GPU: tensors asked for on 'cuda' are made on the CPU,
    .cuda() is the identity, and Tensor.type() names the CUDA type it checks
    for (distrib_optimizer.py compares it to 'torch.cuda.BFloat16Tensor')."""
    import torch
    _cpu_workarounds()
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.empty_cache = lambda *a, **k: None

    def on_cpu(kw):
        if "cuda" in str(kw.get("device", "")):
            kw["device"] = "cpu"
        kw.pop("pin_memory", None)
        return kw
    for name in ("tensor", "zeros", "ones", "empty", "full", "arange"):
        orig = getattr(torch, name)
        setattr(torch, name, lambda *a, _f=orig, **k: _f(*a, **on_cpu(k)))
    torch.Tensor.cuda = lambda self, *a, **k: self
    orig_type = torch.Tensor.type

    def cuda_type(self, *a, **k):
        t = orig_type(self, *a, **k)
        if a or k or not t.startswith("torch.") or t.startswith("torch.cuda."):
            return t
        return "torch.cuda." + t[len("torch."):]
    torch.Tensor.type = cuda_type


def _torch_adamw_patches():
    """Without TE or Apex megatron-core falls back to torch.optim.AdamW, whose
    state has a 0-d 'step' per param; sharded_param_state_dp_reshardable
    wants every state a 1-d bucket slice. FusedAdam keeps no per-param step
    (the step is in the param groups, saved anyway), so drop it from the
    bucket state and restore only the tensors the checkpoint has."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer as DO
    # megatron-core 0.13 has no dp_reshardable form.
    orig_get = getattr(DO, "get_parameter_state_dp_reshardable", None)

    def get(self):
        state = orig_get(self)
        for k, v in state.items():
            if isinstance(k, int):
                for buckets in v.values():
                    for bucket in buckets:
                        for t in bucket:
                            t.pop("step", None)
        return state
    if orig_get:
        DO.get_parameter_state_dp_reshardable = get
    orig_set = DO._set_main_param_and_optimizer_states

    def set_states(self, model_param, tensors):
        if "step" in tensors:
            return orig_set(self, model_param, tensors)
        gi, go = self.model_param_group_index_map[model_param]
        main = self.optimizer.param_groups[gi]["params"][go]
        for key, dst in {"param": main, **self.optimizer.state[main]}.items():
            if key in tensors:
                dst.copy_(tensors[key])
    DO._set_main_param_and_optimizer_states = set_states


def _moe_patches():
    """megatron-core 0.15.3's model_parallel_config.py warns through a
    `warnings` it does not import (reached with ep > 1 and tp > 1)."""
    import warnings
    from megatron.core import model_parallel_config
    model_parallel_config.warnings = warnings


SIZE = dict(layers=2, hidden=64, ffn=256, heads=4, vocab=128)


def build(tp, buckets, swiglu=False, size=SIZE, pp=1, moe=None, tied=False):
    """The model of this rank's pipeline stage (embedding on the first,
    final norm and output layer on the last), DDP and the optimizer.  moe:
    dict(experts, topk, ep, shared, first_dense) for an MoE model of local
    SequentialMLP experts."""
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel
    from megatron.core.distributed import (DistributedDataParallel,
                                           DistributedDataParallelConfig)
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_decoder_block_spec, get_gpt_layer_local_spec)
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import Float16Module

    torch.manual_seed(1234)
    more = {}
    if moe:
        more.update(num_moe_experts=moe["experts"], moe_router_topk=moe["topk"],
                    expert_model_parallel_size=moe["ep"],
                    moe_token_dispatcher_type="allgather",
                    moe_grouped_gemm=False, moe_ffn_hidden_size=size["ffn"],
                    moe_router_load_balancing_type="none",
                    expert_tensor_parallel_size=moe["etp"],
                    # megatron-core 0.15.3 takes MoE biases only at etp 1
                    add_bias_linear=False)
        if moe["shared"]:
            more["moe_shared_expert_intermediate_size"] = size["ffn"]
        if moe["first_dense"]:
            more["moe_layer_freq"] = [0] + [1] * (size["layers"] - 1)
    cfg = TransformerConfig(
        num_layers=size["layers"], hidden_size=size["hidden"],
        ffn_hidden_size=size["ffn"], num_attention_heads=size["heads"],
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        pipeline_dtype=torch.bfloat16,
        use_cpu_initialization=True, hidden_dropout=0.0, attention_dropout=0.0,
        params_dtype=torch.bfloat16, bf16=True, sequence_parallel=False,
        gradient_accumulation_fusion=False, bias_activation_fusion=False,
        masked_softmax_fusion=False, bias_dropout_fusion=False,
        apply_rope_fusion=False, persist_layer_norm=False,
        **(dict(gated_linear_unit=True, activation_func=torch.nn.functional.silu)
           if swiglu else {}), **more)
    if moe and moe["first_dense"]:
        spec = get_gpt_decoder_block_spec(cfg, use_transformer_engine=False)
    else:
        spec = get_gpt_layer_local_spec(
            num_experts=moe["experts"] if moe else None, moe_grouped_gemm=False)
    gpt = GPTModel(config=cfg, transformer_layer_spec=spec,
                   vocab_size=size["vocab"], max_sequence_length=16,
                   share_embeddings_and_output_weights=tied,
                   position_embedding_type="rope",
                   pre_process=ps.is_pipeline_first_stage(),
                   post_process=ps.is_pipeline_last_stage())
    # The CUDA RNG tracker cannot fork without CUDA; dropout is 0 anyway.
    tensor_parallel.get_cuda_rng_tracker().fork = \
        lambda *a, **k: contextlib.nullcontext()
    # As Megatron-LM's get_model(): every param, norms too, in bf16.
    model = Float16Module(cfg, gpt)
    ddp = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=buckets != 1,
        use_distributed_optimizer=True, bucket_size=20000)
    model = DistributedDataParallel(config=cfg, ddp_config=ddp, module=model)
    ocfg = OptimizerConfig(optimizer="adam", lr=1e-2, weight_decay=0.01,
                           bf16=True, params_dtype=torch.bfloat16,
                           use_distributed_optimizer=True, clip_grad=0.0)
    return gpt, model, get_megatron_optimizer(ocfg, [model])


def train(model, opt, steps, dp_rank, vocab):
    import torch
    mask = torch.triu(torch.ones(16, 16, dtype=torch.bool), diagonal=1)[None, None]
    pos = torch.arange(16).unsqueeze(0).expand(2, -1)
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + dp_rank)
        tokens = torch.randint(0, vocab, (2, 16), generator=g)
        labels = torch.randint(0, vocab, (2, 16), generator=g)
        model.zero_grad_buffer()
        opt.zero_grad()
        model(tokens, pos, attention_mask=mask, labels=labels).float().mean().backward()
        model.finish_grad_sync()
        opt.step()


def train_synthetic(gpt, model, opt, steps, ps):
    """Two steps of made-up gradients, for pipeline stages and experts,
    whose forward and backward over gloo the CPU harness does not run: each
    param's grad is drawn from a seed of its name (which names the stage's
    local layer and expert), the step, the DP rank and, for params split
    over TP or EP, that rank (params replicated over TP get the same grads
    on every TP rank, as a real backward gives them).  DDP reduces them
    over DP and the optimizer steps as in training."""
    import zlib
    import torch
    where = (ps.get_pipeline_model_parallel_rank(), ps.get_data_parallel_rank())
    for step in range(steps):
        model.zero_grad_buffer()
        opt.zero_grad()
        for name, p in gpt.named_parameters():
            tp = ps.get_tensor_model_parallel_rank() \
                if getattr(p, "tensor_model_parallel", False) else 0
            ep = ps.get_expert_model_parallel_rank() \
                if not getattr(p, "allreduce", True) else 0
            key = f"{name}/{step}/{where}/{tp}/{ep}"
            if getattr(p, "shared_embedding", False):
                # Tied weights over stages: the embedding and the last
                # stage's output layer copy get the same grads, as the
                # all-reduce of Megatron-LM's finalize_model_grads gives.
                key = f"shared_embedding/{step}/{where[1]}/{tp}"
            seed = zlib.crc32(key.encode())
            g = torch.Generator().manual_seed(seed)
            p.main_grad.copy_(torch.randn(p.shape, generator=g) * 1e-2)
        model.finish_grad_sync()
        opt.step()


def dump_states(gpt, opt):
    """{param name: {state: fp32 1-d shard}} of this rank's optimizer."""
    inners = getattr(opt, "chained_optimizers", [opt])
    out, steps = {}, set()
    for name, p in gpt.named_parameters():
        for inner in inners:
            if p not in inner.model_param_group_index_map:
                continue
            t = inner._get_main_param_and_optimizer_states(p)
            out[name] = {k: v.detach().clone() for k, v in t.items()
                         if k in ("param", "exp_avg", "exp_avg_sq")}
            # The model weights this shard of main params belongs to.
            r = inner._get_model_param_range_map(p)["param"]
            out[name]["model"] = p.detach().view(-1)[r.start:r.end].clone()
    # torch AdamW keeps a step per param (a load sets them from the groups).
    for inner in inners:
        steps |= {float(st["step"]) for st in inner.optimizer.state.values()
                  if "step" in st}
    return out, sorted(steps)


def write_dump(a, rank, gpt, opt, ps):
    import torch
    states, steps = dump_states(gpt, opt)
    torch.save({"tp_rank": ps.get_tensor_model_parallel_rank(),
                "dp_rank": ps.get_data_parallel_rank(),
                "pp_rank": ps.get_pipeline_model_parallel_rank(),
                "ep_rank": ps.get_expert_model_parallel_rank(), "steps": steps,
                "states": states}, f"{a.dump}.rank{rank}")


def worker(rank, world, port, a):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    _cpu_patches()
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import dist_checkpointing
    from megatron.core import parallel_state as ps
    _torch_adamw_patches()
    _moe_patches()
    ps.initialize_model_parallel(tensor_model_parallel_size=a.tp,
                                 pipeline_model_parallel_size=a.pp,
                                 expert_model_parallel_size=a.ep,
                                 expert_tensor_parallel_size=a.etp)
    dp_rank = ps.get_data_parallel_rank()
    size = {k: getattr(a, k) for k in SIZE}
    moe = dict(experts=a.experts, topk=a.topk, ep=a.ep, etp=a.etp,
               shared=a.shared_expert,
               first_dense=a.first_dense) if a.experts else None
    gpt, model, opt = build(a.tp, a.buckets, a.swiglu, size, a.pp, moe, a.tied)
    # What Megatron-LM passes to every sharded_state_dict and records in
    # common.pt's content_metadata (the form aside).
    base_md = {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}
    if a.mode == "save":
        if a.pp > 1 or moe:
            train_synthetic(gpt, model, opt, 2, ps)
        else:
            train(model, opt, 2, dp_rank, size["vocab"])
        for entry in a.forms.split(","):
            form, _, how = entry.partition(":")
            d = os.path.join(a.dir, form + ("_" + how if how else ""))
            if rank == 0:
                os.makedirs(d, exist_ok=True)
            dist.barrier()
            md = dict(base_md, distrib_optim_sharding_type=form)
            msd = gpt.sharded_state_dict(metadata=md)
            osd = opt.sharded_state_dict(msd, metadata=md)
            strategy = None
            if how == "fully_parallel":
                # Megatron-LM's --ckpt-fully-parallel-save (its default):
                # each DP rank writes a share of the replicated tensors.
                from megatron.core.dist_checkpointing.strategies.fully_parallel import \
                    FullyParallelSaveStrategyWrapper
                from megatron.core.dist_checkpointing.strategies.torch import \
                    TorchDistSaveShardedStrategy
                strategy = FullyParallelSaveStrategyWrapper(
                    TorchDistSaveShardedStrategy("torch_dist", 1),
                    ps.get_data_parallel_group(with_context_parallel=True))
            # As Megatron-LM does: the form goes into common.pt too, and
            # its load asks for the form found there.
            dist_checkpointing.save({"model": msd, "optimizer": osd}, d,
                                    sharded_strategy=strategy,
                                    content_metadata=md)
            dist.barrier()
        if a.dump:
            write_dump(a, rank, gpt, opt, ps)
    else:
        # torch AdamW has no state before a step; load overwrites these.
        for o in getattr(opt, "chained_optimizers", [opt]):
            o._init_optimizer_states_with_dummy_values()
        # As Megatron-LM does: the metadata common.pt records, else its own.
        found = dist_checkpointing.load_content_metadata(a.dir) or {}
        md = {**base_md, "distrib_optim_sharding_type": a.form, **found}
        msd = gpt.sharded_state_dict(metadata=md)
        osd = opt.sharded_state_dict(msd, is_loading=True, metadata=md)
        dist.barrier()
        t0 = time.time()
        loaded = dist_checkpointing.load({"model": msd, "optimizer": osd}, a.dir)
        gpt.load_state_dict(loaded["model"], strict=False)
        opt.load_state_dict(loaded["optimizer"])
        dist.barrier()
        if a.timing and rank == 0:
            with open(a.timing, "w") as f:
                json.dump({"load_s": time.time() - t0}, f)
        if a.dump:
            write_dump(a, rank, gpt, opt, ps)
    dist.barrier()
    dist.destroy_process_group()


def compare(got_path, want_path):
    """Asserts two dumps hold the same ranks, params, states and steps, and
    that `want` holds trained states (its bf16 model weights are its fp32
    main params rounded; not the dummy values a load starts from)."""
    import torch
    got = torch.load(got_path, weights_only=False)
    want = torch.load(want_path, weights_only=False)
    assert len(got) == len(want), (len(got), len(want))
    n, names = 0, set()
    for g, w in zip(got, want):
        where = ("tp_rank", "dp_rank", "pp_rank", "ep_rank")
        assert [g.get(k) for k in where] == [w.get(k) for k in where]
        assert g["steps"] == w["steps"], (g["steps"], w["steps"])
        assert w["steps"] == [2.0], w["steps"]
        assert sorted(g["states"]) == sorted(w["states"])
        for name, ws in w["states"].items():
            names.add(name)
            for s in ("param", "exp_avg", "exp_avg_sq"):
                assert torch.equal(g["states"][name][s], ws[s]), (name, s)
                n += 1
            assert torch.equal(ws["param"].bfloat16(), ws["model"]), name
            assert ws["exp_avg_sq"].abs().sum() > 0, name
    print(f"same: {n} state shards of {len(names)} params on {len(want)} ranks")
    return n


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["save", "load", "compare"])
    ap.add_argument("dir", help="OUT (save), CKPT (load) or GOT (compare)")
    ap.add_argument("want", nargs="?", help="WANT (compare)")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--forms", default=",".join(FORMS))
    ap.add_argument("--form", default="fully_reshardable")
    ap.add_argument("--buckets", type=int, default=1, help="1, or more (any other value)")
    ap.add_argument("--dump")
    ap.add_argument("--swiglu", action="store_true",
                    help="a gated fc1 ([W; V], stored in 2*tp chunks)")
    ap.add_argument("--timing", help="load: the load's seconds, as JSON")
    ap.add_argument("--pp", type=int, default=1, help="pipeline stages")
    ap.add_argument("--tied", action="store_true",
                    help="embedding and output layer share their weights")
    ap.add_argument("--experts", type=int, default=0,
                    help="MoE: experts per layer (SequentialMLP)")
    ap.add_argument("--ep", type=int, default=1, help="MoE: expert parallel")
    ap.add_argument("--etp", type=int, help="MoE: expert TP (default: tp)")
    ap.add_argument("--topk", type=int, default=2)
    ap.add_argument("--shared-expert", action="store_true")
    ap.add_argument("--first-dense", action="store_true",
                    help="MoE: layer 0 a dense MLP (per-layer keys)")
    for k, v in SIZE.items():
        ap.add_argument(f"--{k}", type=int, default=v)
    a = ap.parse_args(argv)
    if a.mode == "load" and not (a.dump or a.timing):
        ap.error("load needs --dump or --timing")
    if a.mode == "compare":
        if not a.want:
            ap.error("compare needs GOT and WANT")
        compare(a.dir, a.want)
        return
    import torch
    t0 = time.time()
    spawn_ranks(worker, (a.world, _free_port(), a), a.world)
    if a.dump:
        ranks = [torch.load(f"{a.dump}.rank{r}", weights_only=False)
                 for r in range(a.world)]
        torch.save(ranks, a.dump)
        for r in range(a.world):
            os.remove(f"{a.dump}.rank{r}")
    print(f"{a.mode} done in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
