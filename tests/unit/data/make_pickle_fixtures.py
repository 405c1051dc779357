"""Writes the pickle fixtures test_pickle.c parses, with real torch.

    /path/to/python-with-torch tests/unit/data/make_pickle_fixtures.py

pickle_dcp.metadata  the `.metadata` of torch.distributed.checkpoint.save of a small
              state dict (single process, no process group).
pickle_torch.pkl     data.pkl of a torch.save zip holding a tensor, a view of it
              with a storage offset and non-contiguous strides, an
              nn.Parameter and a bf16 tensor.
"""
import io
import os
import shutil
import sys
import tempfile
import warnings
import zipfile

import torch
import torch.distributed.checkpoint as dcp

here = os.path.dirname(os.path.abspath(__file__))
warnings.filterwarnings("ignore")

state = {
    "model.w": torch.arange(12, dtype=torch.float32).reshape(3, 4),
    "model.b": torch.zeros(5, dtype=torch.bfloat16),
    "step": 7,
}
tmp = tempfile.mkdtemp()
try:
    dcp.save(state, checkpoint_id=tmp)
    shutil.copyfile(os.path.join(tmp, ".metadata"),
                    os.path.join(here, "pickle_dcp.metadata"))
finally:
    shutil.rmtree(tmp)

base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
obj = {
    "w": base,
    "view": base[1:, ::2],
    "p": torch.nn.Parameter(torch.ones(2, 2)),
    "h": torch.zeros(3, dtype=torch.bfloat16),
}
buf = io.BytesIO()
torch.save(obj, buf)
with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
    name = next(n for n in z.namelist() if n.endswith("/data.pkl"))
    with open(os.path.join(here, "pickle_torch.pkl"), "wb") as f:
        f.write(z.read(name))
print("ok", file=sys.stderr)
