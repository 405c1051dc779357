#!/usr/bin/env python3
"""Write a sparse (holey) Megatron zarr checkpoint with a full-size catalog.

    scripts/make_sparse_checkpoint.py OUT [--model 70b|8b|7b|tiny] [--tp 8]
                                      [--layers N] [--hidden H] [--ffn F]
                                      [--heads A] [--groups G] [--vocab V]

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

Usable as a module: ``make_sparse_checkpoint(outdir, tp, **sizes)``.
"""

import argparse
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


def make_sparse_checkpoint(outdir, tp=8, layers=80, hidden=8192, ffn=28672,
                           heads=64, groups=8, vocab=128256, divisor=128,
                           prefix="", optimizer=True, seed=0):
    """Write the sparse checkpoint; returns make_checkpoint's manifest
    (with "chunk_files" and "apparent_bytes")."""
    return msc.make_checkpoint(outdir, tp, layers=layers, hidden=hidden,
                               ffn=ffn, heads=heads, groups=groups,
                               vocab=vocab, divisor=divisor, prefix=prefix,
                               seed=seed, optimizer=optimizer, sparse=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--model", choices=sorted(MODELS), default="70b")
    ap.add_argument("--tp", type=int, default=8)
    for k in ("layers", "hidden", "ffn", "heads", "groups", "vocab"):
        ap.add_argument(f"--{k}", type=int, default=None,
                        help=f"override the preset's {k}")
    ap.add_argument("--divisor", type=int, default=128)
    ap.add_argument("--prefix", default="", choices=["", "model."])
    ap.add_argument("--no-optimizer", action="store_true")
    a = ap.parse_args(argv)
    sizes = dict(MODELS[a.model])
    for k in sizes:
        if getattr(a, k) is not None:
            sizes[k] = getattr(a, k)
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
