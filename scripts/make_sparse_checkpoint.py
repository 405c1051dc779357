#!/usr/bin/env python3
"""Write a sparse (holey) Megatron zarr checkpoint with a full-size catalog.

    scripts/make_sparse_checkpoint.py OUT [--model 70b|7b|tiny|dsv3]
                                      [--tp 8] [--etp 1] [--ep 8]
                                      [--layers N] [--hidden H] [--ffn F]
                                      [--heads A] [--groups G] [--vocab V]
                                      [--experts E] [--dense-layers D]
                                      [--moe-ffn F]

The tree is exactly what ``make_sample_checkpoint.make_checkpoint`` writes
(metadata.json, common.pt, one zarr v2 directory per parameter and per
optimizer state exp_avg / exp_avg_sq / fp32_param, chunk files ``i.j.k``,
``*_extra_state`` and ``rng_state`` ShardedObjects), but every chunk file
is created with ``os.truncate`` at its exact size and never written: the
70B default is about 1 TB apparent and a few tens of MB of metadata blocks
on disk.  All tensor values read as 0.  It exists to measure what grows
with the catalog (mount, lookup, ``ls -lR``, planning), not bandwidth.

Presets (``--model``; any explicit size option overrides it):

* ``70b``: Llama-2/3 70B: 80 layers, hidden 8192, ffn 28672 (gated fc1
  stored as [2*ffn, hidden]), 64 heads / 8 query groups (head dim 128),
  vocab 128256.
* ``7b``: Llama-2 7B: 32 layers, hidden 4096, ffn 11008, 32 heads / 32
  groups, vocab 32000.
* ``tiny``: 2 layers of the 70B widths (the small catalog of the scale
  benchmark is the 70B one with fewer layers: ``--layers 8``).
* ``dsv3``: a DeepSeek-V3-like Mixture-of-Experts GPTModel under
  megatron-core names (``make_moe_sparse_checkpoint``): 61 layers, the
  first 3 dense (ffn 18432), the other 58 with 256 routed experts (expert
  ffn 2048, gated) and one shared expert (ffn 2048), multi-latent
  attention (128 heads, q LoRA rank 1536, kv LoRA rank 512, qk head dim
  128 + rope 64, v head dim 128), hidden 7168, vocab 129280.  Keys are
  per layer (``decoder.layers.<n>.…``: a mixed dense/MoE stack is saved
  per layer).  Routed experts are one array per layer and weight with a
  global expert axis first, ``mlp.experts.experts.linear_fc1.weight``
  (256, 2*2048, 7168) and ``…linear_fc2.weight`` (256, 7168, 2048), one
  expert per chunk; fc1 is cut into 2*etp chunks along its rows (W and
  V, as megatron-core's swiglu factory saves it) and fc2 into etp along
  its columns.  Routers: ``mlp.router.weight`` [256, 7168] (bf16, with
  optimizer states) and ``mlp.router.expert_bias`` [256] (fp32 buffer, no
  optimizer state).  bf16 params plus exp_avg, exp_avg_sq, fp32_param as
  for 70b.  At tp=1 etp=1 that is 3,450 arrays and 181,406 chunk files
  (178,176 of them routed-expert chunks: 58 layers x 256 experts x 3
  chunks (fc1 W, fc1 V, fc2) x 4 (param and 3 states)), 9.39 TB apparent,
  about 32 MB on disk; without optimizer states (--no-optimizer) 45,395
  chunk files.  reshardfs has no TP rules for the MLA weights (q/kv down
  and up projections, q/kv layernorms) yet: they keep their stored grid;
  at tp=1 that is the whole tensor.  Only the rng_state ShardedObject is
  written (no per-layer _extra_state).

Usable as a module: ``make_sparse_checkpoint(outdir, tp, **sizes)`` and
``make_moe_sparse_checkpoint(outdir, tp, etp, **sizes)``.
"""

import argparse
import json
import os
import sys
from pathlib import Path



sys.path.insert(0, str(Path(__file__).resolve().parent))
import venv_python  # noqa: E402

if __name__ == "__main__":
    venv_python.reexec_if_needed()

import make_sample_checkpoint as msc  # noqa: E402

MODELS = {
    "70b": dict(layers=80, hidden=8192, ffn=28672, heads=64, groups=8,
                vocab=128256),
    "7b": dict(layers=32, hidden=4096, ffn=11008, heads=32, groups=32,
               vocab=32000),
    "tiny": dict(layers=2, hidden=8192, ffn=28672, heads=64, groups=8,
                 vocab=128256),
}
# Mixture-of-Experts presets: written by make_moe_sparse_checkpoint.
MOE_MODELS = {
    "dsv3": dict(layers=61, dense_layers=3, hidden=7168, ffn=18432,
                 moe_ffn=2048, shared_ffn=2048, experts=256, heads=128,
                 q_lora=1536, kv_lora=512, qk_head=128, qk_rope=64,
                 v_head=128, vocab=129280),
}


def make_sparse_checkpoint(outdir, tp=8, layers=80, hidden=8192, ffn=28672,
                           heads=64, groups=8, vocab=128256, divisor=128,
                           prefix="", optimizer=True, seed=0):
    """Write the sparse checkpoint; returns make_checkpoint's manifest
    (with "chunk_files" and "apparent_bytes")."""
    return msc.make_checkpoint(outdir, tp, layers=layers, hidden=hidden,
                               ffn=ffn, heads=heads, groups=groups,
                               vocab=vocab, divisor=divisor, prefix=prefix,
                               seed=seed, optimizer=optimizer, sparse=True)


def moe_tensors(layers=61, dense_layers=3, hidden=7168, ffn=18432,
                moe_ffn=2048, shared_ffn=2048, experts=256, heads=128,
                q_lora=1536, kv_lora=512, qk_head=128, qk_rope=64,
                v_head=128, padded=129280, tp=1, etp=1):
    """(key, shape, chunks, dtype, has optimizer states) of every tensor of
    the MoE model saved at tp / etp (per-layer keys)."""
    H = hidden
    bf, f4 = "bfloat16", "<f4"
    out = [("embedding.word_embeddings.weight", (padded, H),
            (padded // tp, H), bf, True)]

    def col(rows, cols, frag=1):  # split along rows by tp (x frag)
        return (rows, cols), (rows // (tp * frag), cols)

    for n in range(layers):
        p = f"decoder.layers.{n}."
        a = p + "self_attention."
        qd = (q_lora, H)
        kvd = (kv_lora + qk_rope, H)
        qu = col(heads * (qk_head + qk_rope), q_lora)
        kvu = col(heads * (qk_head + v_head), kv_lora)
        out += [
            (p + "input_layernorm.weight", (H,), (H,), bf, True),
            (a + "linear_q_down_proj.weight", qd, qd, bf, True),
            (a + "linear_q_up_proj.weight", qu[0], qu[1], bf, True),
            (a + "q_layernorm.weight", (q_lora,), (q_lora,), bf, True),
            (a + "linear_kv_down_proj.weight", kvd, kvd, bf, True),
            (a + "linear_kv_up_proj.weight", kvu[0], kvu[1], bf, True),
            (a + "kv_layernorm.weight", (kv_lora,), (kv_lora,), bf, True),
            (a + "linear_proj.weight", (H, heads * v_head),
             (H, heads * v_head // tp), bf, True),
            (p + "pre_mlp_layernorm.weight", (H,), (H,), bf, True),
        ]
        m = p + "mlp."
        if n < dense_layers:
            fc1 = col(2 * ffn, H, 2)
            out += [(m + "linear_fc1.weight", fc1[0], fc1[1], bf, True),
                    (m + "linear_fc2.weight", (H, ffn), (H, ffn // tp), bf,
                     True)]
            continue
        sfc1 = col(2 * shared_ffn, H, 2)
        e = m + "experts.experts."
        out += [
            (m + "router.weight", (experts, H), (experts, H), bf, True),
            (m + "router.expert_bias", (experts,), (experts,), f4, False),
            (e + "linear_fc1.weight", (experts, 2 * moe_ffn, H),
             (1, moe_ffn // etp, H), bf, True),
            (e + "linear_fc2.weight", (experts, H, moe_ffn),
             (1, H, moe_ffn // etp), bf, True),
            (m + "shared_experts.linear_fc1.weight", sfc1[0], sfc1[1], bf,
             True),
            (m + "shared_experts.linear_fc2.weight", (H, shared_ffn),
             (H, shared_ffn // tp), bf, True),
        ]
    out += [("decoder.final_layernorm.weight", (H,), (H,), bf, True),
            ("output_layer.weight", (padded, H), (padded // tp, H), bf,
             True)]
    return out


def make_moe_sparse_checkpoint(outdir, tp=1, etp=1, ep=8, layers=61,
                               dense_layers=3, hidden=7168, ffn=18432,
                               moe_ffn=2048, shared_ffn=2048, experts=256,
                               heads=128, q_lora=1536, kv_lora=512,
                               qk_head=128, qk_rope=64, v_head=128,
                               vocab=129280, divisor=128, prefix="",
                               optimizer=True, seed=0, iteration=1000):
    """Write the sparse MoE checkpoint (the ``dsv3`` preset's tree) saved
    at tp / etp (ep is only recorded in the args: one expert per chunk
    whatever ep was).  Returns {"tp", "etp", "padded_vocab", "arrays",
    "chunk_files", "apparent_bytes", "expert_chunk_files"}."""
    if tp < 1 or etp < 1 or ep < 1:
        raise ValueError("tp, etp and ep must be >= 1")
    if experts % ep:
        raise ValueError(f"experts ({experts}) not divisible by ep={ep}")
    for what, n, by in (("moe ffn", moe_ffn, etp), ("ffn", ffn, tp),
                        ("shared ffn", shared_ffn, tp),
                        ("heads", heads, tp)):
        if n % by:
            raise ValueError(f"{what} ({n}) not divisible by {by}")
    if not 0 <= dense_layers <= layers:
        raise ValueError("dense_layers must be from 0 to layers")
    os.makedirs(outdir, exist_ok=True)
    P = msc.padded_vocab(vocab, divisor, tp)
    msc._write_text(os.path.join(outdir, "metadata.json"), json.dumps({
        "sharded_backend": "zarr", "sharded_backend_version": 1,
        "common_backend": "torch", "common_backend_version": 1}))
    args = argparse.Namespace(
        num_layers=layers, hidden_size=hidden, ffn_hidden_size=ffn,
        moe_ffn_hidden_size=moe_ffn,
        moe_shared_expert_intermediate_size=shared_ffn,
        num_experts=experts, moe_layer_freq=[0] * dense_layers +
        [1] * (layers - dense_layers), num_attention_heads=heads,
        multi_latent_attention=True, q_lora_rank=q_lora,
        kv_lora_rank=kv_lora, qk_head_dim=qk_head,
        qk_pos_emb_head_dim=qk_rope, v_head_dim=v_head, swiglu=True,
        tensor_model_parallel_size=tp, expert_tensor_parallel_size=etp,
        expert_model_parallel_size=ep, pipeline_model_parallel_size=1,
        padded_vocab_size=P, make_vocab_size_divisible_by=divisor,
        iteration=iteration, bf16=True, use_distributed_optimizer=True,
        ckpt_format="zarr")
    msc._save_pt({"args": args, "checkpoint_version": 3.0,
                  "iteration": iteration,
                  "optimizer": {"param_groups": [
                      {"lr": 3e-4, "weight_decay": 0.1,
                       "betas": (0.9, 0.95)}]},
                  "opt_param_scheduler": {"num_steps": iteration}},
                 os.path.join(outdir, "common.pt"))
    m = {"tp": tp, "etp": etp, "ep": ep, "padded_vocab": P, "arrays": {},
         "chunk_files": 0, "apparent_bytes": 0, "expert_chunk_files": 0}
    for key, shape, chunks, dt, opt in moe_tensors(
            layers, dense_layers, hidden, ffn, moe_ffn, shared_ffn, experts,
            heads, q_lora, kv_lora, qk_head, qk_rope, v_head, P, tp, etp):
        full_key = prefix + key
        keys = [(full_key, dt)]
        keys += [(f"optimizer.state.{st}.{full_key}", "<f4")
                 for st in (msc.OPTIMIZER_STATES if optimizer and opt
                            else ())]
        for k, kdt in keys:
            n, nb = msc.write_sparse_zarr_array(outdir, k, shape, chunks,
                                                kdt)
            m["arrays"][k] = (list(shape), list(chunks), kdt)
            m["chunk_files"] += n
            m["apparent_bytes"] += nb
            if ".experts.experts." in k:
                m["expert_chunk_files"] += n
    d_rng = os.path.join(outdir, "rng_state")
    os.makedirs(d_rng, exist_ok=True)
    for r in range(tp):
        msc._save_pt([{"random_rng_state": None, "np_rng_state": None,
                       "torch_rng_state": None, "cuda_rng_state": None,
                       "rng_tracker_states": {"model-parallel-rng": r}}],
                     os.path.join(d_rng, f"shard_0.{r}_1.{tp}.pt"))
    return m


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--model", choices=sorted(MODELS) + sorted(MOE_MODELS),
                    default="70b")
    ap.add_argument("--tp", type=int, default=None,
                    help="source tp (default 8; 1 for an MoE preset)")
    ap.add_argument("--etp", type=int, default=1,
                    help="MoE presets: the source's expert tp (default 1)")
    ap.add_argument("--ep", type=int, default=8,
                    help="MoE presets: the expert parallel size recorded "
                         "in the args (default 8; chunks are per expert "
                         "whatever it is)")
    for k in ("layers", "hidden", "ffn", "heads", "groups", "vocab",
              "experts", "dense-layers", "moe-ffn"):
        ap.add_argument(f"--{k}", type=int, default=None,
                        help=f"override the preset's {k}")
    ap.add_argument("--divisor", type=int, default=128)
    ap.add_argument("--prefix", default="", choices=["", "model."])
    ap.add_argument("--no-optimizer", action="store_true")
    a = ap.parse_args(argv)
    if a.model in MOE_MODELS:
        sizes = dict(MOE_MODELS[a.model])
        for k in sizes:
            if getattr(a, k, None) is not None:
                sizes[k] = getattr(a, k)
        if a.groups is not None:
            ap.error("--groups: the MoE presets use multi-latent attention")
        try:
            m = make_moe_sparse_checkpoint(
                a.outdir, a.tp or 1, a.etp, a.ep, divisor=a.divisor,
                prefix=a.prefix, optimizer=not a.no_optimizer, **sizes)
        except ValueError as e:
            print(f"make_sparse_checkpoint: {e}", file=sys.stderr)
            return 2
        print(f"wrote {len(m['arrays'])} arrays, {m['chunk_files']} sparse "
              f"chunk files ({m['expert_chunk_files']} of routed experts), "
              f"{m['apparent_bytes'] / 1e12:.3f} TB apparent, to "
              f"{a.outdir} (tp={m['tp']}, etp={m['etp']})")
        return 0
    if a.experts is not None or a.dense_layers is not None or \
            a.moe_ffn is not None:
        ap.error("--experts, --dense-layers, --moe-ffn: MoE presets only")
    sizes = dict(MODELS[a.model])
    for k in sizes:
        if getattr(a, k) is not None:
            sizes[k] = getattr(a, k)
    a.tp = a.tp or 8
    try:
        m = make_sparse_checkpoint(a.outdir, a.tp, divisor=a.divisor,
                                   prefix=a.prefix,
                                   optimizer=not a.no_optimizer, **sizes)
    except ValueError as e:
        print(f"make_sparse_checkpoint: {e}", file=sys.stderr)
        return 2
    print(f"wrote {len(m['arrays'])} arrays, {m['chunk_files']} sparse "
          f"chunk files, {m['apparent_bytes'] / 1e12:.3f} TB apparent, to "
          f"{a.outdir} (tp={a.tp}, padded vocab {m['padded_vocab']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
