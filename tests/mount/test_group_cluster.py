"""A job of 4 and 8 simulated nodes (tests/mount/cluster.py): each node a
network and mount namespace of its own with its own rate-limited link,
the source on a store namespace served over SFTP (sshfs on every node),
and MPI between the nodes over the links.

- Every view file on every node equals the numpy oracle.
- The bytes the store sent (its interface's counter) are at most 1.05x
  the source with -o group=mpi; independent mounts make it send the source
  once per node.
- megatron-core loads a view on every node at once, one process per
  node, and gets the tensors it gets from the source itself.
"""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster import Cluster, missing
from conftest import REPO, make_checkpoint
from mcore import MCORE_PY, needs_mcore, run_mcore
from oracle import expected_view

BIN = Path(os.environ.get("RESHARDFS_BIN", REPO / "build" / "reshardfs"))
HERE = Path(__file__).resolve().parent

pytestmark = pytest.mark.skipif(missing() is not None,
                                reason=f"simulated nodes: {missing()}")


def source_bytes(root):
    return sum(os.path.getsize(os.path.join(d, f))
               for d, _, fs in os.walk(root) for f in fs)


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    d = tmp_path_factory.mktemp("cluster") / "src"
    make_checkpoint(str(d), 1, layers=2, hidden=1024, ffn=4096, heads=8,
                    groups=4, vocab=8000, optimizer=False)
    return d


@pytest.fixture(scope="module")
def digests(src, tmp_path_factory):
    path = tmp_path_factory.mktemp("digests") / "tp2.json"
    path.write_text(json.dumps({rel: hashlib.sha256(b).hexdigest()
                                for rel, b in expected_view(src, 2).items()}))
    return path


def read_everywhere(cl, digests):
    """Every node reads its whole view at once: the readers' reports."""
    procs = [cl.node_run(k, [sys.executable, HERE / "group_reader.py",
                             cl.mnt(k), digests],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True) for k in range(cl.n)]
    out = []
    for p in procs:
        o, e = p.communicate(timeout=600)
        assert p.returncode == 0, e
        out.append(json.loads(o))
    return out


@pytest.mark.parametrize("n", [4, 8])
def test_job_reads_the_store_once(src, digests, tmp_path, n):
    total = source_bytes(src)
    served = {}
    with Cluster(tmp_path, n, src) as cl:
        for group in (True, False):
            cl.launch("tp=2" + (",group=mpi" if group else ""), group=group,
                      binary=BIN)
            tx0 = cl.store_tx()
            reports = read_everywhere(cl, digests)
            served[group] = cl.store_tx() - tx0
            for r in reports:
                assert r["bad"] == [] and r["errors"] == [], r
                assert (r["stats"]["group"] or {}).get("members", n) == n
            assert cl.stop_job() == 0, cl.log()
    grouped, alone = served[True], served[False]
    print(f"{n} nodes, {total} source bytes: the store sent {grouped} "
          f"with group=mpi, {alone} to independent mounts")
    # Read once by the job, not once per node.
    assert grouped <= 1.05 * total, (grouped, total)
    assert alone >= 0.95 * n * total, (alone, n, total)


@needs_mcore
def test_megatron_loads_on_every_node(tmp_path):
    """megatron-core saves at tp=2 (zarr); four nodes mount it at tp=1 as a
    group, and each loads its view with megatron-core, at once."""
    ckpt = tmp_path / "ckpt"
    run_mcore(ckpt, "--tp", "2", "--hidden", "256", "--ffn", "1024",
              "--vocab", "4000")
    want = tmp_path / "want"
    run_mcore(want, "--tp", "1", "--load-from", ckpt, "--hidden", "256",
              "--ffn", "1024", "--vocab", "4000")
    with Cluster(tmp_path / "nodes", 4, ckpt) as cl:
        cl.launch("tp=1,group=mpi", group=True, binary=BIN)
        tx0 = cl.store_tx()
        procs = [cl.node_run(
            k, [MCORE_PY, REPO / "scripts" / "make_mcore_checkpoint.py",
                tmp_path / f"got{k}", "--tp", "1", "--load-from", cl.mnt(k),
                "--hidden", "256", "--ffn", "1024", "--vocab", "4000"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for k in range(4)]
        for p in procs:
            out, _ = p.communicate(timeout=600)
            assert p.returncode == 0, out[-3000:]
        served = cl.store_tx() - tx0
        stats = [cl.node_stats(k)["group"] for k in range(4)]
        assert cl.stop_job() == 0, cl.log()
    import numpy as np
    ref = np.load(f"{want}.0.npz")
    for k in range(4):
        got = np.load(tmp_path / f"got{k}.0.npz")
        assert sorted(got.files) == sorted(ref.files)
        for name in ref.files:
            assert np.array_equal(got[name], ref[name]), (k, name)
    tensors = sum(os.path.getsize(os.path.join(d, f))
                  for d, _, fs in os.walk(ckpt) for f in fs
                  if f[0].isdigit())
    assert served <= 1.05 * source_bytes(ckpt), (served, tensors)
    assert sum(s["storage_bytes"] for s in stats) <= 1.05 * tensors
