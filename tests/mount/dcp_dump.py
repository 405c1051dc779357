"""Oracle for torch_dist sources: torch's own DCP reader loads every tensor
of a checkpoint whole, and the arrays go to an .npz (raw bits for bf16 and
fp8).

    .venv-mcore/bin/python tests/mount/dcp_dump.py CKPT OUT.npz
"""
import sys

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata


def main(src, out):
    # Unpickling mcore's .metadata imports megatron.core, which tries to
    # JIT-build a CUDA extension at import; on a machine without a GPU that
    # must fail fast and quietly (megatron catches it).
    import torch.utils.cpp_extension as cpp_ext

    def no_jit(*args, **kwargs):
        raise RuntimeError("no JIT extensions without a GPU")
    cpp_ext.load_inline = no_jit
    meta = dcp.FileSystemReader(src).read_metadata()
    sd = {k: torch.zeros(tuple(v.size), dtype=v.properties.dtype)
          for k, v in meta.state_dict_metadata.items()
          if isinstance(v, TensorStorageMetadata)}
    dcp.load(sd, checkpoint_id=src, no_dist=True)
    arrays = {}
    for k, t in sd.items():
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        elif t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            t = t.view(torch.uint8)     # numpy has no fp8
        arrays[k] = t.numpy()
    np.savez(out, **arrays)


if __name__ == "__main__":
    main(*sys.argv[1:])
