"""Re-run a script under the repo's .venv when this interpreter lacks
numpy (scripts/setup installs the test clients there).  Imported first by
the scripts that need numpy, before anything that imports it:

    import venv_python
    venv_python.reexec_if_needed()
"""
import os
import sys
from pathlib import Path


def reexec_if_needed(module="numpy", venv=".venv"):
    """Exec sys.argv under REPO/venv/bin/python unless `module` imports."""
    try:
        __import__(module)
    except ImportError:
        root = Path(__file__).resolve().parents[1] / venv
        py = root / "bin" / "python"
        if py.exists() and Path(sys.prefix).resolve() != root.resolve():
            os.execv(str(py), [str(py), *sys.argv])
        raise
