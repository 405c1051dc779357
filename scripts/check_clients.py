"""Imports the given modules in this interpreter and prints one line: their
versions, or the first that does not import and why (exit status 1).

    .venv/bin/python scripts/check_clients.py numpy zarr ml_dtypes
    .venv-mcore/bin/python scripts/check_clients.py torch megatron.core

scripts/setup runs it last on each venv, scripts/test to say which optional
parts are present, tests/mount/mcore.py for the skip reason.  Libraries'
own warnings go to stderr; the verdict is the one line on stdout.
"""
import contextlib
import importlib
import importlib.metadata
import sys
import warnings

# Distributions whose name differs from the module's.
DIST = {"megatron.core": "megatron-core"}


def no_jit():
    """megatron.core JIT-builds a CUDA extension when imported; make that
    fail fast, as scripts/make_mcore_checkpoint.py does before using it."""
    try:
        import torch.utils.cpp_extension as cpp_ext
    except ImportError:
        return

    def refuse(*args, **kwargs):
        raise RuntimeError("no JIT CUDA extensions in an import check")
    cpp_ext.load_inline = refuse


def version(name, mod):
    v = getattr(mod, "__version__", None)
    if isinstance(v, str):
        return v
    try:
        return importlib.metadata.version(DIST.get(name, name))
    except importlib.metadata.PackageNotFoundError:
        return None


def main(names):
    found = []
    for name in names:
        if name.startswith("megatron"):
            no_jit()
        try:
            # what a library prints while it imports (DeepSpeed logs its
            # accelerator choice to stdout) is not the verdict line
            with warnings.catch_warnings(), \
                    contextlib.redirect_stdout(sys.stderr):
                warnings.simplefilter("ignore")
                mod = importlib.import_module(name)
        except BaseException as e:  # noqa: BLE001 (any failure is the answer)
            msg = str(e).strip().splitlines()
            print(f"cannot import {name}: {type(e).__name__}: "
                  f"{msg[-1] if msg else ''}".rstrip(": "))
            return 1
        v = version(name, mod)
        found.append(f"{name} {v}" if v else name)
    py = ".".join(map(str, sys.version_info[:3]))
    print(f"Python {py} ({sys.base_prefix}): " + ", ".join(found))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
