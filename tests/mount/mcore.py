"""The torch/megatron-core side of the tests: scripts run in .venv-mcore
(it needs numpy<2 and torch), and the skip marker for when it is absent or
its torch or megatron-core does not import."""
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MCORE_PY = REPO / ".venv-mcore" / "bin" / "python"
SCRIPT = REPO / "scripts" / "make_mcore_checkpoint.py"
CHECK = REPO / "scripts" / "check_clients.py"
SETUP = "scripts/setup installs torch and megatron-core there " \
        "(unless RESHARDFS_NO_MCORE=1)"


def _missing():
    """Why .venv-mcore cannot run the torch tests, or None."""
    if not MCORE_PY.exists():
        return f".venv-mcore missing: {SETUP}"
    try:
        r = subprocess.run([str(MCORE_PY), str(CHECK), "torch",
                            "torch.distributed.checkpoint", "megatron.core",
                            "safetensors"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f".venv-mcore/bin/python does not run ({e}): {SETUP}"
    if r.returncode != 0:
        return f".venv-mcore: {r.stdout.strip() or 'check failed'}: {SETUP}"
    return None


MISSING = _missing()
needs_mcore = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


def clients_missing(modules, what):
    """Why .venv-mcore's python does not import `modules`, or None; `what`
    names what scripts/setup installs there for them."""
    if not MCORE_PY.exists():
        return ".venv-mcore missing"
    r = subprocess.run([str(MCORE_PY), str(CHECK), *modules],
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                       text=True, timeout=300)
    if r.returncode != 0:
        return (f".venv-mcore: {r.stdout.strip()}: scripts/setup installs "
                f"{what} there (requirements-mcore.txt)")
    return None


def _transformers_missing():
    """Why .venv-mcore cannot run transformers too, or None."""
    return MISSING or clients_missing(
        ["torch", "megatron.core", "transformers", "safetensors"],
        "transformers")


# the tests that check with megatron-core and transformers both
TRANSFORMERS_MISSING = _transformers_missing()
needs_transformers = [needs_mcore, pytest.mark.skipif(
    TRANSFORMERS_MISSING is not None, reason=TRANSFORMERS_MISSING or "")]


# megatron-core 0.13.1 beside 0.15.3 (scripts/setup, requirements-mcore13.txt).
MCORE13 = REPO / ".venv-mcore" / "mcore-0.13.1"
needs_mcore13 = pytest.mark.skipif(
    not (MCORE13 / "megatron" / "core").is_dir(),
    reason=f"{MCORE13} missing: scripts/setup installs megatron-core 0.13.1 there")


# transformers 5.24.0 beside 4.57 (scripts/setup, requirements-tf5.txt):
# .venv-mcore's python with this folder first on PYTHONPATH.
TF5 = REPO / ".venv-mcore" / "transformers-5.24.0"
needs_tf5 = pytest.mark.skipif(
    not (TF5 / "transformers").is_dir(),
    reason=f"{TF5} missing: scripts/setup installs transformers 5 there")


def run_py(*args, mcore=None):
    """Runs .venv-mcore's python with args (with the folder `mcore` first
    on PYTHONPATH when given: megatron-core 0.13.1, transformers 5); fails
    the test on an error."""
    env = dict(os.environ, PYTHONPATH=str(mcore)) if mcore else None
    r = subprocess.run([str(MCORE_PY), *map(str, args)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-4000:]
    return r.stdout


def run_mcore(*args):
    """scripts/make_mcore_checkpoint.py with args."""
    return run_py(SCRIPT, *args)
