"""Kernel passthrough (fs/passthrough.h) through a real mount, every byte
checked against the numpy oracle:

* passthrough=auto: every view file read buffered, with O_DIRECT and
  through mmap from snapshots; the daemon sees no READ at all; the
  source is read once (the bytes a read-path mount reads for the same
  files); opens and snapshots counted in the stats file;
* snapshots are reused by later opens, and the least recently released
  one is freed when the budget needs its bytes; blocks and snapshots
  together stay within cache_size;
* fallbacks to the read path, each with its reason: passthrough=off,
  files over passthrough_max, a budget full of open files' snapshots,
  opens of a file already open on the read path (an inode cannot be open
  both ways: the kernel would fail the open with EIO), and opens of a file
  read on the read path before (the kernel holds its pages);
* whole source files that are immutable (chattr +i before the mount) are
  passed through to the source file itself, the rest are snapshots;
* option refusals.

Needs a kernel that offers passthrough (Linux >= 6.9) and CAP_SYS_ADMIN;
each test is skipped, with the reason the stats file gives, elsewhere.
"""
import errno
import json
import mmap
import os
import subprocess
import threading

import pytest

from conftest import make_checkpoint, read_direct, wait_for
from oracle import ExpectedView

FC1 = "decoder.layers.mlp.linear_fc1.weight"
FC2 = "decoder.layers.mlp.linear_fc2.weight"
SMALL = dict(layers=1, hidden=1024, ffn=4096, heads=8, groups=4, vocab=1024,
             divisor=128, optimizer=False)


def stats(m):
    return json.loads((m.mnt / ".reshardfs" / "stats").read_text())


def pt(m):
    return stats(m)["passthrough"]


def all_released(m):
    """Waits until the daemon has had every RELEASE (the kernel sends them
    in the background after close): an open after that decides afresh."""
    assert wait_for(lambda: not any(pt(m)["open_now"].values())), pt(m)


def need_passthrough(m):
    p = pt(m)
    if not p["active"]:
        pytest.skip(f"passthrough not available here: {p['inactive_because']}")


def read_mapped(path):
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return b""
        with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
            return m[:]


def check_three_ways(m, exp):
    """Every file of the view read whole, with O_DIRECT and mapped."""
    for rel in exp.files:
        want = exp.read(rel)
        assert (m.mnt / rel).read_bytes() == want, rel
        assert read_direct(m.mnt / rel) == want, rel
        assert read_mapped(m.mnt / rel) == want, rel


def data_files(exp, key=None):
    return [r for r in exp.files if not r.endswith(".zarray") and
            (key is None or r.startswith(key + "/"))]


def test_every_file_from_snapshots(sample, mount):
    """Every file of a tp=8 view of a tp=2 checkpoint (with optimizer
    states), three ways each, from snapshots: right bytes, no READ
    reaches the daemon, each snapshot built once, and the source read
    exactly as much as a read-path mount reads for the same files."""
    src = sample(2)
    exp = ExpectedView(src, 8)
    m = mount(src, ["tp=8"])
    need_passthrough(m)
    check_three_ways(m, exp)
    st = stats(m)
    p = st["passthrough"]
    n = len(exp.files)
    assert p["opens"] == {"read": 0, "snapshot": 3 * n, "source": 0}, p
    # (an open made before the last one's RELEASE arrived shares its
    # backing file without asking the store)
    assert p["snapshots"]["builds"] == n and p["snapshots"]["reuses"] <= 2 * n, p
    assert p["snapshots"]["bytes_built"] == exp.total_bytes(), p
    assert st["reads"] == 0 and st["bytes_served"] == 0, st
    assert p["snapshots"]["bytes_peak"] <= st["cache_budget"]
    m.unmount()
    # The read path, for the same files: the same source bytes.
    m = mount(src, ["tp=8", "passthrough=off"])
    for rel in exp.files:
        assert (m.mnt / rel).read_bytes() == exp.read(rel), rel
    off = stats(m)
    assert off["source_bytes_read"] == st["source_bytes_read"], (off, st)
    assert off["passthrough"]["opens"]["read"] == n
    assert off["passthrough"]["fallbacks"]["off"] == n
    assert not off["passthrough"]["active"]
    assert off["passthrough"]["inactive_because"] == "-o passthrough=off"


def test_reuse_and_lru(sample, mount):
    """A budget of 8 MiB, files of 1 MiB: snapshots are reused while held
    or idle; once more files have been read than fit, the least recently
    released go first, and reopening one of those builds it again."""
    src = sample(2, **SMALL)
    exp = ExpectedView(src, 8)
    files = data_files(exp, FC1)          # 16 files of 1 MiB
    assert len(files) == 16 and all(exp.size(r) == 1 << 20 for r in files)
    m = mount(src, ["tp=8", "cache_size=8M", "passthrough_max=2M"])
    need_passthrough(m)
    for rel in files[:4]:
        assert (m.mnt / rel).read_bytes() == exp.read(rel)
    all_released(m)
    for rel in files[:4]:
        assert (m.mnt / rel).read_bytes() == exp.read(rel)
    p = pt(m)["snapshots"]
    assert p["builds"] == 4 and p["reuses"] == 4 and p["evictions"] == 0, p
    for rel in files[4:]:
        assert (m.mnt / rel).read_bytes() == exp.read(rel)
    all_released(m)
    st = stats(m)
    p = st["passthrough"]["snapshots"]
    assert p["builds"] == 16 and p["evictions"] >= 8, p
    assert p["bytes"] <= 8 << 20 and p["bytes_peak"] <= 8 << 20, p
    assert st["cache_bytes"] + st["cache_charged"] <= 8 << 20, st
    # files[0] was released first: gone, built again
    assert (m.mnt / files[0]).read_bytes() == exp.read(files[0])
    assert pt(m)["snapshots"]["builds"] == 17
    # the last one read is still held idle: reused
    assert (m.mnt / files[-1]).read_bytes() == exp.read(files[-1])
    assert pt(m)["snapshots"]["builds"] == 17


def test_fallbacks(sample, mount):
    """Files over passthrough_max, and opens while the budget is full of
    open files' snapshots, use the read path; the bytes are right either
    way and every read-path open is counted with its reason."""
    src = sample(2, **SMALL)
    exp = ExpectedView(src, 8)
    fc1 = data_files(exp, FC1)            # 1 MiB each
    m = mount(src, ["tp=8", "cache_size=4M", "passthrough_max=512K"])
    need_passthrough(m)
    for rel in fc1:
        assert (m.mnt / rel).read_bytes() == exp.read(rel)
    p = pt(m)
    assert p["fallbacks"]["too_large"] == len(fc1), p
    assert p["opens"]["read"] == len(fc1), p
    m.unmount()

    m = mount(src, ["tp=8", "cache_size=4M", "passthrough_max=1M"])
    # four held open fill the budget: the fifth goes to the read path
    held = [open(m.mnt / rel, "rb") for rel in fc1[:4]]
    try:
        assert pt(m)["opens"]["snapshot"] == 4
        assert (m.mnt / fc1[4]).read_bytes() == exp.read(fc1[4])
        assert pt(m)["fallbacks"]["budget"] == 1
        for f, rel in zip(held, fc1):
            assert f.read() == exp.read(rel)
    finally:
        for f in held:
            f.close()
    all_released(m)
    st = stats(m)
    assert st["cache_bytes"] + st["cache_charged"] <= 4 << 20, st
    # released: fc1[4] would fit now, but it was read on the read path and
    # the kernel holds its pages: it stays there; fc1[5] was never read
    assert (m.mnt / fc1[4]).read_bytes() == exp.read(fc1[4])
    assert (m.mnt / fc1[5]).read_bytes() == exp.read(fc1[5])
    p = pt(m)
    assert p["fallbacks"]["read_before"] == 1, p
    assert p["opens"]["snapshot"] == 5 and p["opens"]["read"] == 2, p


def test_one_way_per_open_inode(sample, mount):
    """A file opened on the read path (the budget was full) stays on it for
    every open made while it is open, and after (its pages are the
    kernel's: read_before); a file open in passthrough is joined by later
    opens, which share its backing file.  The kernel refuses an open of
    the other way with EIO: none is seen."""
    src = sample(2, **SMALL)
    exp = ExpectedView(src, 8)
    fc1 = data_files(exp, FC1)
    m = mount(src, ["tp=8", "cache_size=2M", "passthrough_max=1M"])
    need_passthrough(m)
    a = open(m.mnt / fc1[0], "rb")
    b = open(m.mnt / fc1[1], "rb")       # the budget is full
    try:
        late = open(m.mnt / fc1[2], "rb")    # read path: budget
        a.close()
        b.close()                         # room again, but fc1[2] is open
        assert wait_for(lambda: pt(m)["open_now"]["snapshot"] == 0)
        with open(m.mnt / fc1[2], "rb") as again:
            assert again.read() == exp.read(fc1[2])
        assert read_direct(m.mnt / fc1[2]) == exp.read(fc1[2])
        assert late.read() == exp.read(fc1[2])
        late.close()
        all_released(m)
        p = pt(m)
        assert p["fallbacks"]["budget"] == 1, p
        assert p["fallbacks"]["open_on_read_path"] == 2, p
        # all closed: fc1[2] stays on the read path; fc1[3], never read,
        # goes to a snapshot, joined by the opens made while it is open
        assert (m.mnt / fc1[2]).read_bytes() == exp.read(fc1[2])
        first = open(m.mnt / fc1[3], "rb")
        with open(m.mnt / fc1[3], "rb") as second:
            assert second.read() == exp.read(fc1[3])
        assert read_mapped(m.mnt / fc1[3]) == exp.read(fc1[3])
        assert first.read() == exp.read(fc1[3])
        first.close()
        p = pt(m)
        assert p["fallbacks"]["read_before"] == 1, p
        assert p["opens"]["snapshot"] == 2 + 3, p
        assert p["snapshots"]["builds"] == 3, p
    finally:
        for f in (a, b):
            f.close()


def test_concurrent_opens_share_one_build(sample, mount):
    """16 threads open the same large file at once: one build, one backing
    file, every read right."""
    src = sample(2, **SMALL)
    exp = ExpectedView(src, 8)
    rel = max(data_files(exp), key=exp.size)
    want = exp.read(rel)
    m = mount(src, ["tp=8"])
    need_passthrough(m)
    bad, errors = [], []

    def reader():
        try:
            if (m.mnt / rel).read_bytes() != want:
                bad.append(rel)
        except OSError as e:
            errors.append(e)

    threads = [threading.Thread(target=reader) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and not bad, (errors, bad)
    p = pt(m)
    assert p["snapshots"]["builds"] == 1 and p["opens"]["snapshot"] == 16, p


def test_large_files_built_in_parts(sample, mount):
    """Files of up to 64 MiB, each built in 16 MiB parts by the opener and
    the build threads side by side (fs/snapshot.c): every byte right,
    each file built once, and the source read exactly as much as the read
    path reads for the same files (no block built by two parts)."""
    src = sample(2, **dict(SMALL, ffn=8192, optimizer=True))
    exp = ExpectedView(src, 1)
    big = [r for r in data_files(exp) if exp.size(r) > 16 << 20]
    assert len(big) >= 4, [(r, exp.size(r)) for r in data_files(exp)]
    m = mount(src, ["tp=1", "cache_size=1G"])
    need_passthrough(m)
    for rel in big:
        assert (m.mnt / rel).read_bytes() == exp.read(rel), rel
    st = stats(m)
    s = st["passthrough"]["snapshots"]
    assert s["builds"] == len(big), s
    assert s["parts"] >= sum(-(-exp.size(r) // (16 << 20)) for r in big), s
    assert s["build_threads"] >= 1, s
    m.unmount()
    m = mount(src, ["tp=1", "passthrough=off"])
    for rel in big:
        assert (m.mnt / rel).read_bytes() == exp.read(rel), rel
    assert stats(m)["source_bytes_read"] == st["source_bytes_read"]


@pytest.fixture
def immutable(tmp_path):
    """chattr +i on paths (before the mount: a chattr moves the ctime),
    undone at teardown."""
    made = []

    def _set(*paths):
        for p in paths:
            r = subprocess.run(["chattr", "+i", str(p)], capture_output=True,
                               text=True)
            if r.returncode != 0:
                pytest.skip(f"chattr +i: {r.stderr.strip()}")
            made.append(p)
    yield _set
    for p in made:
        subprocess.run(["chattr", "-i", str(p)], check=True)


def test_immutable_sources_passed_through(tmp_path, mount, immutable):
    """At tp=2 of a tp=2 checkpoint every chunk file is a whole source
    file: the immutable ones are passed through to the source itself, the
    others are snapshots; the bytes are the source's either way."""
    src = tmp_path / "ckpt"
    make_checkpoint(str(src), 2, **SMALL)
    exp = ExpectedView(src, 2)
    fc1 = data_files(exp, FC1)
    immutable(*[src / rel for rel in fc1])
    m = mount(src, ["tp=2"])
    need_passthrough(m)
    check_three_ways(m, exp)
    p = pt(m)
    assert p["opens"]["source"] == 3 * len(fc1), p
    assert p["opens"]["snapshot"] == 3 * (len(exp.files) - len(fc1)), p
    assert p["snapshots"]["bytes_built"] == exp.total_bytes() - sum(
        exp.size(r) for r in fc1), p


@pytest.mark.parametrize("threads", [1, 3])
def test_build_threads(sample, mount, threads):
    """-o threads=N: the opener and N - 1 snapshot build threads build
    large files in parts; every byte right either way."""
    src = sample(2, **dict(SMALL, ffn=8192))
    exp = ExpectedView(src, 1)
    m = mount(src, ["tp=1", "cache_size=1G", f"threads={threads}"])
    need_passthrough(m)
    for rel in data_files(exp):
        assert (m.mnt / rel).read_bytes() == exp.read(rel), rel
    s = pt(m)["snapshots"]
    assert s["build_threads"] == threads - 1, s
    if threads == 1:
        assert s["parts_on_threads"] == 0, s


def balloon_reports_free_pages():
    """Whether a virtio-balloon here has free page reporting (feature bit
    5, VIRTIO_BALLOON_F_REPORTING) on: -o snapshot_pages=auto's rule."""
    drv = "/sys/bus/virtio/drivers/virtio_balloon"
    if not os.path.isdir(drv):
        return False
    for d in os.listdir(drv):
        f = os.path.join(drv, d, "features")
        if d.startswith("virtio") and os.path.exists(f):
            bits = open(f).read().strip()
            if len(bits) > 5 and bits[5] == "1":
                return True
    return False


@pytest.mark.parametrize("pages", ["auto", "huge", "small"])
def test_snapshot_pages(sample, mount, pages):
    """-o snapshot_pages=: snapshots on the private huge-page tmpfs
    (passthrough's CAP_SYS_ADMIN is what making one needs), in memfds, or
    (auto, the default) the tmpfs unless a virtio-balloon reports free
    pages; every byte right either way, and the stats file says which and
    why."""
    src = sample(2, **SMALL)
    exp = ExpectedView(src, 4)
    m = mount(src, ["tp=4"] + ([] if pages == "auto" else
                               [f"snapshot_pages={pages}"]))
    need_passthrough(m)
    check_three_ways(m, exp)
    s = pt(m)["snapshots"]
    assert pt(m)["opens"]["snapshot"] == 3 * len(exp.files), pt(m)
    huge = pages == "huge" or (pages == "auto" and
                               not balloon_reports_free_pages())
    assert s["huge_pages"] == huge, s
    assert s["small_pages_because"] == (
        "" if huge else "-o snapshot_pages=small" if pages == "small"
        else "virtio-balloon free page reporting"), s


def test_options(sample, failing_mount):
    src = sample(2, **SMALL)
    for opts, msg in [
            (["snapshot_pages=2M"],
             "-o snapshot_pages=2M: must be auto, huge or small"),
            (["passthrough=on"], "-o passthrough=on: must be auto or off"),
            (["passthrough_max=x"], "-o passthrough_max=x: must be a size"),
            (["cache_size=4M", "passthrough_max=8M"],
             "-o passthrough_max=8M: must be at most cache_size")]:
        rc, err = failing_mount(src, opts)
        assert rc != 0 and msg in err, err
