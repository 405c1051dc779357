"""The fast paths of the read path, through a real mount, bytes checked
against the numpy oracle:

* strided rows of 64 KiB or more are read straight from the source (no
  cache block is ever built for them), short ones through the cache;
* a sequential reader gets the next blocks prefetched, a reader walking a
  directory in readdir order (cp -r) gets the next file's blocks too, and a
  random reader gets none;
* readdirplus listings give exact sizes; security.* and system.* xattrs
  are "not supported" (so ls -l stops asking), user.* ones work.

Every mount is passthrough=off: these are the daemon's own read paths.
"""
import errno
import json
import os
import random
import shutil
import subprocess

import pytest

from oracle import ExpectedView

# Every mount here tests the daemon's read path: with passthrough, reads
# would not reach it (tests/mount/test_passthrough.py).
READ_PATH = "passthrough=off"
FC2 = "decoder.layers.mlp.linear_fc2.weight"
PROJ = "decoder.layers.self_attention.linear_proj.weight"


def stats(m):
    return json.loads((m.mnt / ".reshardfs" / "stats").read_text())


def read_array_files(m, exp, key):
    """Reads every chunk file of a view array, checking each against the
    oracle; returns the bytes read."""
    n = 0
    for rel in exp.files:
        if rel.startswith(key + "/") and not rel.endswith(".zarray"):
            got = (m.mnt / rel).read_bytes()
            assert got == exp.read(rel), rel
            n += len(got)
    assert n > 0
    return n


def test_long_strided_rows_skip_the_cache(sample, mount):
    # fc2 [1, 8, 65536] split on its last axis at tp=2: bf16 rows of
    # 64 KiB, fp32 optimizer rows of 128 KiB: read straight from the source.
    src = sample(1, layers=1, hidden=8, ffn=65536, heads=2, groups=1,
                 vocab=256, divisor=8)
    exp = ExpectedView(src, 2)
    m = mount(src, ["tp=2", READ_PATH])
    for key in (FC2, "optimizer.state.exp_avg." + FC2):
        read_array_files(m, exp, key)
    st = stats(m)
    assert st["cache_misses"] == 0, st
    assert st["source_bytes_read"] == st["bytes_served"]
    # proj [1, 8, 8]: 8-byte rows go through the executor and the cache
    read_array_files(m, exp, PROJ)
    assert stats(m)["cache_misses"] > 0


def mounted_state_view(sample, mount):
    """(mount, oracle) of a tp=2 view of a tp=1 sample whose fp32 fc2
    state files are [1, 512, 4096] of 16 KiB rows: 8 MiB per file, two
    4 MiB blocks built by the executor."""
    src = sample(1, layers=1, hidden=512, ffn=8192, heads=4, groups=2,
                 vocab=256, divisor=8)
    return mount(src, ["tp=2", "cache_size=64M", READ_PATH]), \
        ExpectedView(src, 2)


STATE = "optimizer.state.exp_avg." + FC2


def test_sequential_reader_gets_prefetch(sample, mount):
    m, exp = mounted_state_view(sample, mount)
    rel = f"{STATE}/0.0.0"
    want = exp.read(rel)
    assert len(want) == 8 << 20
    got = bytearray()
    with open(m.mnt / rel, "rb", buffering=0) as f:
        while chunk := f.read(128 << 10):
            got += chunk
    assert bytes(got) == want
    st = stats(m)
    assert st["prefetch_blocks"] >= 1, st
    assert st["source_bytes_read"] <= st["bytes_served"]


def test_random_reader_gets_no_prefetch(sample, mount):
    m, exp = mounted_state_view(sample, mount)
    rel = f"{STATE}/0.0.1"
    want = exp.read(rel)
    rng = random.Random(5)
    fd = os.open(m.mnt / rel, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        for off in sorted(rng.sample(range(1, len(want) // 4096), 20),
                          reverse=True):
            assert os.pread(fd, 100, off * 4096) == \
                want[off * 4096:off * 4096 + 100]
    finally:
        os.close(fd)
    assert stats(m)["prefetch_blocks"] == 0


def test_cp_r_prefetches_into_next_files(sample, mount, tmp_path):
    m, exp = mounted_state_view(sample, mount)
    dst = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(m.mnt / STATE), str(dst)], check=True)
    names = sorted(p.name for p in dst.iterdir())
    assert names == sorted(r.split("/", 1)[1] for r in exp.files
                           if r.startswith(STATE + "/"))
    for name in names:
        assert (dst / name).read_bytes() == exp.read(f"{STATE}/{name}"), name
    st = stats(m)
    # every block of the directory was built once, most of them ahead
    assert st["source_bytes_read"] == st["bytes_served"] - \
        len(exp.read(f"{STATE}/.zarray")), st
    assert st["prefetch_blocks"] >= len(names), st
    shutil.rmtree(dst)


def test_listing_and_xattrs(sample, mount):
    src = sample(2)
    exp = ExpectedView(src, 8)
    m = mount(src, ["tp=8", READ_PATH])
    out = subprocess.run(["ls", "-alR", "--time-style=+", str(m.mnt)],
                         check=True, capture_output=True, text=True).stdout
    sizes = {}
    d = None
    for line in out.splitlines():
        if line.endswith(":"):
            d = line[:-1]
        elif line.startswith("-"):
            parts = line.split()
            sizes[os.path.relpath(os.path.join(d, parts[-1]), m.mnt)] = \
                int(parts[4])
    assert sizes == {rel: exp.size(rel) for rel in exp.files}
    f = m.mnt / FC2 / "0.0.0"
    for name in ("security.selinux", "system.posix_acl_access"):
        with pytest.raises(OSError) as e:
            os.getxattr(f, name)
        assert e.value.errno == errno.EOPNOTSUPP, name
    with pytest.raises(OSError) as e:
        os.getxattr(f, "user.nothing")
    assert e.value.errno == errno.ENODATA
    assert os.getxattr(f, "user.reshardfs.sources").startswith(
        FC2.encode() + b"/0.0.")
