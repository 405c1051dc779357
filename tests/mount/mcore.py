"""The torch/megatron-core side of the tests: scripts run in .venv-mcore
(it needs numpy<2 and torch), and the skip marker for when it is absent."""
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MCORE_PY = REPO / ".venv-mcore" / "bin" / "python"
SCRIPT = REPO / "scripts" / "make_mcore_checkpoint.py"

needs_mcore = pytest.mark.skipif(
    not MCORE_PY.exists(),
    reason=".venv-mcore missing: scripts/setup installs torch and "
           "megatron-core (unless RESHARDFS_NO_MCORE=1)")


def run_py(*args):
    """Runs .venv-mcore's python with args; fails the test on an error."""
    r = subprocess.run([str(MCORE_PY), *map(str, args)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:]
    return r.stdout


def run_mcore(*args):
    """scripts/make_mcore_checkpoint.py with args."""
    return run_py(SCRIPT, *args)
