"""The stress test (tests/stress/stress.py), briefly, in the normal suite:
16 threads for 10 s of random preads (some O_DIRECT, some across the end),
mapped reads, whole-file reads, dropped page caches, readdir, stat and
user.reshardfs.sources over a tp=8 view of a tp=2 checkpoint with a small
cache, every byte compared with the oracle.  The full run (64 threads,
60 s, a 2.5 GB view) is `tests/stress/stress.py`; scripts/sanitize runs it
under ASan+UBSan and TSan."""

import json
import os
import subprocess
import sys

from conftest import REPO

SECONDS = os.environ.get("RESHARDFS_STRESS_SECONDS", "10")
MODEL = "layers=2,hidden=512,ffn=2048,heads=8,groups=4,vocab=4096"


def test_stress_briefly(reshardfs_bin, tmp_path):
    out = tmp_path / "stress.json"
    r = subprocess.run(
        [sys.executable, str(REPO / "tests" / "stress" / "stress.py"),
         "--seconds", SECONDS, "--threads", "16", "--bin", reshardfs_bin,
         "--model", MODEL, "--cache-size", "8M",
         "--dir", str(tmp_path / "stress"), "--json", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    res = json.loads(out.read_text())
    print({k: res[k] for k in ("threads", "seconds", "reads",
                               "bytes_verified", "mismatches", "errors")})
    assert res["mismatches"] == 0 and res["errors"] == 0, res["problems"]
    assert res["reads"] > 1000 and res["bytes_verified"] > 0, res
    for op in ("pread", "mmap", "whole", "drop", "readdir", "stat", "xattr"):
        assert res["ops"].get(op, 0) > 0, (op, res["ops"])
