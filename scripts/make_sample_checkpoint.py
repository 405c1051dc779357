#!/usr/bin/env python3
"""Write a small, realistic Megatron-core GPT dist checkpoint (zarr backend).

The checkpoint looks as though mcore <= 0.15 saved it with
``dist_checkpointing.save(..., sharded_strategy="zarr")`` at tensor-parallel
size TP (docs/FORMATS.md, "Megatron-core dist checkpoints" and "zarr"):

* ``metadata.json`` and ``common.pt`` at the top;
* one zarr v2 array directory per sharded tensor, layer-stacked
  (axis 0 = layer, chunk size 1 along it), whose chunk grid is the TP
  sharding grid, chunk files ``i.j.k`` holding raw C-order little-endian
  bytes with no compressor;
* optimizer states ``optimizer.state.{exp_avg,exp_avg_sq,fp32_param}.<key>``
  in float32, sharded like their parameter;
* ShardedObjects (``*_extra_state`` per layer, ``rng_state`` per TP rank) as
  opaque ``shard_*.pt`` files.

Data are deterministic for a given seed and do not depend on TP, so the same
model saved at two TP sizes holds the same logical tensors (up to vocab
padding).  Only numpy is needed; torch is used for ``.pt`` files if it is
importable, otherwise they are written in torch.save's zip container with
zipfile and pickle.

Usable as a script and as a module: ``make_checkpoint(outdir, tp, **kw)``.
"""

import argparse
import itertools
import json
import os
import pickle
import zipfile
import sys
from pathlib import Path



sys.path.insert(0, str(Path(__file__).resolve().parent))
import venv_python  # noqa: E402

if __name__ == "__main__":
    venv_python.reexec_if_needed()

import numpy as np  # noqa: E402

try:  # optional: real torch.save files when torch is around
    import torch  # noqa: F401
    _HAVE_TORCH = True
except Exception:  # pragma: no cover - depends on the environment
    _HAVE_TORCH = False

OPTIMIZER_STATES = ("exp_avg", "exp_avg_sq", "fp32_param")


def padded_vocab(vocab, divisor, tp):
    """Megatron's vocab padding: ceil(V / (divisor*tp)) * divisor*tp."""
    m = divisor * tp
    return -(-vocab // m) * m


def to_bf16_bytes(a):
    """float32 array -> uint16 array of bfloat16 bit patterns (round to
    nearest even; NaN stays NaN)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    u = a.view(np.uint32)
    rounding = ((u >> 16) & np.uint32(1)) + np.uint32(0x7FFF)
    out = ((u + rounding) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        out[nan] = ((u[nan] >> 16) | np.uint32(0x0040)).astype(np.uint16)
    return out


def _save_pt(obj, path):
    if _HAVE_TORCH:
        import torch
        torch.save(obj, path)
        return
    # torch.save's container for an object holding no tensors: a zip of
    # STORED records under one archive prefix, data.pkl at protocol 2
    # (torch.load reads it; so does reshardfs when it re-wraps objects).
    archive = os.path.splitext(os.path.basename(path))[0]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{archive}/data.pkl", pickle.dumps(obj, protocol=2))
        z.writestr(f"{archive}/byteorder", "little")
        z.writestr(f"{archive}/version", "3\n")


def _write_text(path, text):
    with open(path, "w") as f:
        f.write(text)


def zarray_dict(shape, chunks, dtype):
    return {
        "chunks": list(chunks),
        "compressor": None,
        "dtype": dtype,
        "fill_value": None,
        "filters": None,
        "order": "C",
        "shape": list(shape),
        "zarr_format": 2,
    }


def _write_zarray(d, shape, chunks, dtype_name):
    os.makedirs(d, exist_ok=True)
    _write_text(os.path.join(d, ".zarray"),
                json.dumps(zarray_dict(shape, chunks, dtype_name),
                           indent=4, sort_keys=True))
    return [-(-s // c) for s, c in zip(shape, chunks)]


def chunk_file_name(idx):
    """zarr v2 chunk key with "." separators; "0" for a 0-d array."""
    return ".".join(str(i) for i in idx) if idx else "0"


def write_zarr_array(outdir, key, arr, chunks, dtype_name):
    """Write ``arr`` (already in its storage dtype, C order) as a zarr v2
    array directory with uncompressed chunks named ``i.j.k``.  Edge chunks
    (shape not a multiple of chunks) are stored zero padded at full size."""
    d = os.path.join(outdir, key)
    shape = arr.shape
    grid = _write_zarray(d, shape, chunks, dtype_name)
    for idx in itertools.product(*[range(g) for g in grid]):
        box = tuple(slice(i * c, min((i + 1) * c, s))
                    for i, c, s in zip(idx, chunks, shape))
        piece = arr[box]
        if piece.shape != tuple(chunks):
            full = np.zeros(chunks, dtype=arr.dtype)
            full[tuple(slice(0, n) for n in piece.shape)] = piece
            piece = full
        name = chunk_file_name(idx)
        with open(os.path.join(d, name), "wb") as f:
            f.write(np.ascontiguousarray(piece).astype(
                piece.dtype.newbyteorder("<"), copy=False).tobytes())


def write_sparse_zarr_array(outdir, key, shape, chunks, dtype_name):
    """Same directory as write_zarr_array (same .zarray, same chunk names
    and sizes) but every chunk file is a hole made with os.truncate: the
    apparent size is exact, no data block is written and every value
    reads as 0.  Returns (chunk files, their apparent bytes)."""
    d = os.path.join(outdir, key)
    grid = _write_zarray(d, shape, chunks, dtype_name)
    nbytes = int(np.dtype(dtype_name if dtype_name != "bfloat16"
                          else "<u2").itemsize)
    for c in chunks:
        nbytes *= c
    n = 0
    for idx in itertools.product(*[range(g) for g in grid]):
        path = os.path.join(d, chunk_file_name(idx))
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
        os.truncate(path, nbytes)
        n += 1
    return n, n * nbytes


class _Data:
    """Deterministic float32 data.  ``fast`` tiles one random pool, which is
    what the benchmark uses to write gigabytes quickly."""

    def __init__(self, seed, fast):
        self.rng = np.random.default_rng(seed)
        self.fast = fast
        if fast:
            # a prime-ish length so that tiles of different tensors do not
            # line up with their rows
            self.pool = self.rng.standard_normal(
                (1 << 22) + 17, dtype=np.float32)
            self.pos = 0

    def normal(self, shape, scale=0.02):
        n = int(np.prod(shape))
        if not self.fast:
            return (self.rng.standard_normal(n, dtype=np.float32)
                    * np.float32(scale)).reshape(shape)
        out = np.empty(n, dtype=np.float32)
        done = 0
        p = self.pool
        while done < n:
            take = min(n - done, len(p) - self.pos)
            np.multiply(p[self.pos:self.pos + take], np.float32(scale),
                        out=out[done:done + take])
            done += take
            self.pos = (self.pos + take) % len(p)
        return out.reshape(shape)


def model_tensors(layers, hidden, ffn, heads, groups, vocab):
    """(key, logical shape [unpadded vocab], kind) of every parameter.
    kind: 'col', 'row', 'fc1', 'vocab', 'rep'."""
    L, H, F = layers, hidden, ffn
    d = H // heads
    qkv_rows = (heads + 2 * groups) * d
    return [
        ("embedding.word_embeddings.weight", (vocab, H), "vocab"),
        ("decoder.layers.self_attention.linear_qkv.layer_norm_weight",
         (L, H), "norm"),
        ("decoder.layers.self_attention.linear_qkv.weight",
         (L, qkv_rows, H), "col"),
        ("decoder.layers.self_attention.linear_proj.weight",
         (L, H, heads * d), "row"),
        ("decoder.layers.mlp.linear_fc1.layer_norm_weight", (L, H), "norm"),
        ("decoder.layers.mlp.linear_fc1.weight", (L, 2 * F, H), "fc1"),
        ("decoder.layers.mlp.linear_fc2.weight", (L, H, F), "row"),
        ("decoder.final_layernorm.weight", (H,), "norm1d"),
        ("output_layer.weight", (vocab, H), "vocab"),
    ]


def stored_layout(shape, kind, tp, padded):
    """Stored (padded) shape and chunk shape of a parameter saved at TP."""
    shape = list(shape)
    if kind == "vocab":
        shape[0] = padded
        return shape, [padded // tp, shape[1]]
    if kind == "col":
        return shape, [1, shape[1] // tp, shape[2]]
    if kind == "fc1":
        return shape, [1, shape[1] // (2 * tp), shape[2]]
    if kind == "row":
        return shape, [1, shape[1], shape[2] // tp]
    if kind == "norm":
        return shape, [1, shape[1]]
    return shape, list(shape)


def make_checkpoint(outdir, tp, layers=4, hidden=64, ffn=128, heads=4,
                    groups=2, vocab=1000, divisor=128, prefix="", seed=0,
                    optimizer=True, fast=False, iteration=1000,
                    sparse=False):
    """Write the checkpoint into ``outdir`` (created if needed) and return a
    small manifest dict: {"tp", "padded_vocab", "arrays": {key: (shape,
    chunks, dtype)}}.

    ``sparse=True`` writes the same tree (same metadata.json, common.pt,
    .zarray files, chunk names and sizes, ShardedObjects) but every chunk
    file is a hole of the right size (os.truncate, never written), so a
    70B catalog costs only metadata blocks; all tensor values read as 0.
    The manifest then also holds "chunk_files" and "apparent_bytes"."""
    if tp < 1:
        raise ValueError("tp must be >= 1")
    if hidden % heads or heads % groups:
        raise ValueError("hidden must divide by heads, heads by groups")
    d = hidden // heads
    for what, n in (("qkv rows", (heads + 2 * groups) * d),
                    ("proj cols", heads * d), ("ffn", ffn)):
        if n % tp:
            raise ValueError(f"{what} ({n}) not divisible by tp={tp}")
    os.makedirs(outdir, exist_ok=True)
    P = padded_vocab(vocab, divisor, tp)
    L = layers

    _write_text(os.path.join(outdir, "metadata.json"), json.dumps({
        "sharded_backend": "zarr", "sharded_backend_version": 1,
        "common_backend": "torch", "common_backend_version": 1}))
    args = argparse.Namespace(
        num_layers=L, hidden_size=hidden, ffn_hidden_size=ffn,
        num_attention_heads=heads, num_query_groups=groups,
        group_query_attention=groups != heads, swiglu=True,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=1,
        padded_vocab_size=P, make_vocab_size_divisible_by=divisor,
        iteration=iteration, bf16=True, use_distributed_optimizer=True,
        ckpt_format="zarr")
    _save_pt({"args": args, "checkpoint_version": 3.0,
              "iteration": iteration,
              "optimizer": {"param_groups": [
                  {"lr": 3e-4, "weight_decay": 0.1, "betas": (0.9, 0.95)}]},
              "opt_param_scheduler": {"num_steps": iteration}},
             os.path.join(outdir, "common.pt"))

    data = None if sparse else _Data(seed, fast)
    manifest = {"tp": tp, "padded_vocab": P, "arrays": {}}
    if sparse:
        manifest["chunk_files"] = 0
        manifest["apparent_bytes"] = 0
    for key, shape, kind in model_tensors(L, hidden, ffn, heads, groups,
                                          vocab):
        sshape, chunks = stored_layout(shape, kind, tp, P)
        if sparse:
            full_key = prefix + key
            keys = [(full_key, "bfloat16")]
            keys += [(f"optimizer.state.{st}.{full_key}", "<f4")
                     for st in (OPTIMIZER_STATES if optimizer else ())]
            for k, dt in keys:
                n, nb = write_sparse_zarr_array(outdir, k, sshape, chunks,
                                                dt)
                manifest["arrays"][k] = (sshape, chunks, dt)
                manifest["chunk_files"] += n
                manifest["apparent_bytes"] += nb
            continue
        # logical values are independent of tp: draw the unpadded tensor
        if kind.startswith("norm"):
            master = (np.float32(1.0) + data.normal(shape, 0.1))
        else:
            master = data.normal(shape)
        states = {}
        if optimizer:
            states["exp_avg"] = data.normal(shape, 1e-3)
            states["exp_avg_sq"] = np.abs(data.normal(shape, 1e-5))
            states["fp32_param"] = master
        if kind == "vocab" and P != shape[0]:
            def pad(a):
                out = np.zeros(sshape, dtype=a.dtype)
                out[:shape[0]] = a
                return out
            master = pad(master)
            states = {k: pad(v) for k, v in states.items()}
        full_key = prefix + key
        write_zarr_array(outdir, full_key, to_bf16_bytes(master), chunks,
                         "bfloat16")
        manifest["arrays"][full_key] = (sshape, chunks, "bfloat16")
        for st in OPTIMIZER_STATES if optimizer else ():
            okey = f"optimizer.state.{st}.{full_key}"
            write_zarr_array(outdir, okey, states[st].astype("<f4"), chunks,
                             "<f4")
            manifest["arrays"][okey] = (sshape, chunks, "<f4")
        del master, states

    # ShardedObjects: per-layer extra state (replicated over TP) and the
    # per-rank RNG state with sharded shape (PP, TP) = (1, tp).
    for obj in ("decoder.layers.self_attention.linear_proj._extra_state",
                "decoder.layers.mlp.linear_fc2._extra_state"):
        d_obj = os.path.join(outdir, prefix + obj)
        os.makedirs(d_obj, exist_ok=True)
        for layer in range(L):
            _save_pt({"layer": layer, "fp8_meta": None,
                      "name": prefix + obj},
                     os.path.join(d_obj, f"shard_{layer}_{L}.pt"))
    d_rng = os.path.join(outdir, "rng_state")
    os.makedirs(d_rng, exist_ok=True)
    for r in range(tp):
        rs = np.random.default_rng([seed, r])
        _save_pt([{"random_rng_state": ("MT19937",
                                        rs.integers(0, 2**32, 16).tolist()),
                   "np_rng_state": None, "torch_rng_state": None,
                   "cuda_rng_state": None,
                   "rng_tracker_states": {"model-parallel-rng": r}}],
                 os.path.join(d_rng, f"shard_0.{r}_1.{tp}.pt"))
    return manifest


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--tp", type=int, required=True)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--ffn", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--divisor", type=int, default=128)
    ap.add_argument("--prefix", default="", choices=["", "model."])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-optimizer", action="store_true")
    ap.add_argument("--fast", action="store_true",
                    help="tile one random pool (for multi-GB checkpoints)")
    ap.add_argument("--sparse", action="store_true",
                    help="chunk files are holes of the right size (all "
                         "zeros, almost no disk): for catalog-scale tests")
    a = ap.parse_args(argv)
    try:
        m = make_checkpoint(a.outdir, a.tp, layers=a.layers, hidden=a.hidden,
                            ffn=a.ffn, heads=a.heads, groups=a.groups,
                            vocab=a.vocab, divisor=a.divisor, prefix=a.prefix,
                            seed=a.seed, optimizer=not a.no_optimizer,
                            fast=a.fast, sparse=a.sparse)
    except ValueError as e:
        print(f"make_sample_checkpoint: {e}", file=sys.stderr)
        return 2
    print(f"wrote {len(m['arrays'])} arrays to {a.outdir} "
          f"(tp={a.tp}, padded vocab {m['padded_vocab']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
