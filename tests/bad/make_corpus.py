#!/usr/bin/env python3
"""Write the malformed-checkpoint corpus (tests/bad/cases.py) into OUT.

    make_corpus.py OUT [--reshardfs BIN] [--only NAME ...]

OUT/_base/zarr     a valid tp=2 zarr sample (scripts/make_sample_checkpoint.py)
OUT/_base/td       the same shown as torch_dist at tp=2 by reshardfs and
                   copied out (so BIN must run, and /dev/fuse be usable)
OUT/_outside/      symlink targets that lie outside every case
OUT/<case>/        one malformed checkpoint per case
OUT/cases.json     name, base, what is wrong, mount options and the
                   expected outcome of every case

Needs numpy only (no torch): pickles and zips are edited with tests/bad/edit.py.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import cases  # noqa: E402

sys.path.insert(0, str(REPO / "scripts"))
import make_sample_checkpoint  # noqa: E402

MOUNT_TIMEOUT = 10.0


def _mounted(mnt):
    mnt = os.path.realpath(mnt)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == mnt for line in f)


def copy_of_view(binary, src, dst, opts):
    """Mounts src with opts, copies the whole view to dst (made writable),
    unmounts.  Raises RuntimeError with the daemon's stderr on failure."""
    mnt = Path(tempfile.mkdtemp(prefix="rs-corpus-mnt-"))
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([binary, "-f", str(src), str(mnt), "-o", opts],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while not _mounted(mnt):
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise RuntimeError(f"cannot mount {src} -o {opts}: "
                                   f"{log.read().decode(errors='replace')}")
            time.sleep(0.01)
        shutil.copytree(mnt, dst)
    finally:
        if _mounted(mnt):
            subprocess.run(["fusermount3", "-u", str(mnt)], check=False,
                           stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=30)
        try:
            proc.wait(timeout=MOUNT_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        try:
            mnt.rmdir()
        except OSError:
            pass
    for root, dirs, files in os.walk(dst):
        for n in dirs + files:
            p = os.path.join(root, n)
            os.chmod(p, os.stat(p).st_mode | 0o200)
    os.chmod(dst, os.stat(dst).st_mode | 0o200)


class Context:
    def __init__(self, out):
        self.out = Path(out)
        self.zarr = self.out / "_base" / "zarr"
        self.td = self.out / "_base" / "td"
        self.outside = self.out / "_outside"


def make_bases(ctx, binary):
    ctx.zarr.parent.mkdir(parents=True, exist_ok=True)
    make_sample_checkpoint.make_checkpoint(str(ctx.zarr), 2, layers=2,
                                     optimizer=False)
    copy_of_view(binary, ctx.zarr, ctx.td, "format=torch_dist,tp=2")
    o = ctx.outside
    o.mkdir()
    fc2 = ctx.zarr / cases.FC2
    shutil.copy(fc2 / "0.0.0", o / "chunk_8192")
    shutil.copytree(fc2, o / "fc2_array")
    shutil.copy(ctx.zarr / "metadata.json", o / "metadata.json")
    shutil.copy(ctx.td / ".metadata", o / "td_metadata")
    shutil.copy(ctx.td / "__0_0.distcp", o / "td_distcp0")
    shutil.copy(ctx.td / "metadata.json", o / "td_metadata.json")


def _expect_json(e):
    d = asdict(e)
    d["kind"] = type(e).__name__
    return d


def make_corpus(out, binary, only=None):
    """Writes the corpus into `out` (which must not exist or be empty);
    returns the list of cases written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        raise SystemExit(f"{out}: not empty")
    ctx = Context(out)
    make_bases(ctx, binary)
    chosen = [c for c in cases.CASES if not only or c.name in only]
    manifest = []
    for c in chosen:
        d = out / c.name
        shutil.copytree(ctx.zarr if c.base == "zarr" else ctx.td, d,
                        symlinks=True)
        c.build(d, ctx)
        manifest.append({"name": c.name, "base": c.base, "what": c.what,
                         "options": c.options(),
                         "expect": _expect_json(c.expect)})
    (out / "cases.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return chosen


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--reshardfs", default=os.environ.get(
        "RESHARDFS_BIN", str(REPO / "build" / "reshardfs")))
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args(argv)
    written = make_corpus(a.out, a.reshardfs, a.only)
    print(f"{len(written)} cases in {a.out}")


if __name__ == "__main__":
    main()
