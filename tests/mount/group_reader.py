"""Reads every file a JSON of {relpath: sha256} names under MNT, at
once on a few threads, as a node's loader would, and prints what it
found as JSON: {"files", "bad", "errors", "seconds", "stats"}.  Run
inside a simulated node (tests/mount/cluster.py, node_run)."""
import hashlib
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def main(mnt, digests):
    mnt = Path(mnt)
    want = json.loads(Path(digests).read_text())
    bad, errors = [], []

    def one(rel):
        try:
            got = hashlib.sha256((mnt / rel).read_bytes()).hexdigest()
        except OSError as e:
            errors.append([rel, e.errno])
            return
        if got != want[rel]:
            bad.append(rel)
    t0 = time.monotonic()
    with ThreadPoolExecutor(4) as ex:
        list(ex.map(one, sorted(want)))
    seconds = time.monotonic() - t0
    stats = json.loads((mnt / ".reshardfs" / "stats").read_text())
    print(json.dumps({"files": len(want), "bad": bad, "errors": errors,
                      "seconds": seconds, "stats": stats}))


if __name__ == "__main__":
    main(*sys.argv[1:])
