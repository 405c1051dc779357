"""The transformers 5 side of tests/mount/test_families_oracles.py, run
by .venv-mcore's python with .venv-mcore/transformers-5.24.0 first on
PYTHONPATH (transformers 5.x): "ok" on success, exit status 1 with the
reason on the first difference.

    tf5_check.py hf MNT ORACLE
        MNT: a format=hf view of a megatron-core checkpoint that
        tests/mount/family_check.py `save` wrote (per-expert or, with
        -o hf_experts=packed, transformers 5's packed experts); ORACLE:
        its oracle directory (tokens.npy, logits.npy: megatron-core's own
        forward, model.json).  AutoModelForCausalLM.from_pretrained(MNT)
        in transformers 5 must report no missing, unexpected or mismatched
        key, and its float32 logits, cut to the true vocab, must equal
        megatron-core's within 1e-4 * max(1, max |want|).

    tf5_check.py hfdir HFDIR ORACLE
        The same for an HF directory (transformers 5 reading it), with
        ORACLE the make_hf_family.py oracle (transformers 4.57's logits).
"""
import json
import os
import sys
from pathlib import Path

import numpy as np

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parent))

from hf_load import from_pretrained_strict  # noqa: E402

RTOL = 1e-4


def logits_of(mnt, tokens):
    import torch
    import transformers
    assert transformers.__version__.split(".")[0] == "5", transformers.__version__
    model = from_pretrained_strict(transformers.AutoModelForCausalLM, mnt,
                                   dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        return model(torch.from_numpy(tokens)).logits.float().numpy()


def compare(got, want):
    vocab = got.shape[-1]
    want = want[..., :vocab].astype(np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    err = float(np.abs(got - want).max())
    tol = RTOL * max(1.0, float(np.abs(want).max()))
    assert err <= tol, f"logits differ by {err} (tolerance {tol})"
    return err


def main(argv):
    cmd, mnt, oracle = argv[1], argv[2], Path(argv[3])
    tokens = np.load(oracle / "tokens.npy")
    want = np.load(oracle / "logits.npy")
    got = logits_of(mnt, tokens)
    err = compare(got, want)
    cfg = json.loads((Path(mnt) / "config.json").read_text())
    print(f"tf5 {cmd} {cfg.get('architectures')}: logits within {err:.3g}")
    print("ok")


if __name__ == "__main__":
    main(sys.argv)
