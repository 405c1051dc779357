"""Megatron-Bridge's HF -> megatron-core conversion against reshardfs's
names=mcore view of the same HF directory, tensor for tensor; run in
.venv (numpy, zarr): "ok" on success, exit status 1 with the reason on the
first difference.

    bridge_compare.py MNT OUT.npz
        MNT: a names=mcore,format=zarr,tp=1 view; OUT.npz: what
        tests/mount/bridge_oracle.py convert HFDIR OUT.npz --keys sharded
        wrote (Megatron-Bridge 0.6.2's megatron-core tensors under their
        dist-checkpoint names, float32).  Every tensor the bridge made must
        be in the view with the same shape - but the vocab, which
        Megatron-Bridge does not pad and the view pads as Megatron does
        (its extra rows must be zero) - and equal to it exactly; the view
        must hold no tensor the bridge did not make.
"""
import json
import sys
from pathlib import Path

import numpy as np
import zarr

VOCAB = ("embedding.word_embeddings.weight", "output_layer.weight")


def main(mnt, npz):
    want = np.load(npz)
    root = Path(mnt)
    have = {p.parent.relative_to(root).as_posix()
            for p in root.rglob(".zarray")}
    extra = have - set(want.files)
    assert not extra, f"the view holds tensors Megatron-Bridge did not make: {sorted(extra)}"
    for name in want.files:
        assert name in have, f"{name}: Megatron-Bridge made it, the view has none"
        got = zarr.open(str(root / name), mode="r")[...]
        w = want[name]
        if name in VOCAB:
            assert got.shape[1:] == w.shape[1:] and got.shape[0] >= w.shape[0], \
                (name, got.shape, w.shape)
            assert not np.any(got[w.shape[0]:]), f"{name}: padding rows not zero"
            got = got[:w.shape[0]]
        assert got.shape == w.shape, (name, got.shape, w.shape)
        assert got.dtype == w.dtype, (name, got.dtype, w.dtype)
        assert np.array_equal(got, w), \
            f"{name}: {int((got != w).sum())} elements differ"
    meta = json.loads(Path(str(npz) + ".json").read_text()) \
        if Path(str(npz) + ".json").exists() else {}
    print(f"bridge {meta.get('model_bridge', '')}: {len(want.files)} tensors equal")
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
