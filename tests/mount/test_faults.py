"""Faults under a live mount (docs/ARCHITECTURE.md, "Invariants": never a wrong
byte, bounded memory).

The rule for every read: EIO, or exactly the oracle's bytes.  Never stale
bytes, never zeros, never a short read except at the end of the file.

Each test runs in each way a view file can be served (MODES): the read
path (passthrough=off), and snapshots read by the kernel
(passthrough=auto with room for the files: fs/passthrough.h).  A snapshot
holds the bytes the source held when it was built, so a file already open
before a change keeps reading them, where the read path gives EIO; every
open after a change gives EIO in both.  Whole source files passed
through because they are immutable (the third way) are tested by
test_immutable_source: they cannot change while the flag stays.

* A source chunk truncated, rewritten in place or replaced by a rename while
  mounted: reads of the view files built from it fail with EIO and a log
  line; the others still read right.
* The same while reads are in flight: readers read affected view files in
  small O_DIRECT reads, and in buffered reads with the page cache dropped
  between passes, while a writer changes the source and puts it back,
  thousands of times.  Putting it back includes the recorded mtime, so the
  daemon may serve the file again and every read races a change.  Both kinds
  of file: a row-parallel one (strided, built into the block cache) and a
  column-parallel one (one contiguous source range, served from the source
  without the cache).
* An I/O error from the source itself: the source is mounted through
  tests/fault/errfs.c, a passthrough FUSE server that fails reads of a chosen
  byte range of a chosen file, and reshardfs is mounted on top of it.
* The daemon killed by SIGKILL mid-read with -o auto_unmount: the mount
  goes away.  SIGTERM and fusermount3 -u with files held open: the daemon
  exits 0 (what -u does with open files is documented in the test).
* Memory pressure: cache_size=1M (the minimum) and 32 reader threads over a
  whole view: every byte right, peak RSS bounded.
"""

import errno
import hashlib
import json
import mmap
import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import (MOUNT_TIMEOUT, REPO, cleanup, fusermount, is_mounted,
                      make_checkpoint, read_direct, wait_for)
from oracle import ExpectedView

COL = "decoder.layers.mlp.linear_fc1.weight"   # tp 2->8: a source range
ROW = "decoder.layers.mlp.linear_fc2.weight"   # tp 2->8: strided, cached

# One layer, fc1 [1, 8192, 1024] and fc2 [1, 1024, 4096] in bf16: at tp=2
# each source chunk is 4 MiB; at tp=8 each view chunk is 1 MiB.  fc1's view
# chunks are 1 MiB ranges of a source chunk, fc2's are 1 KiB rows at a
# 4 KiB stride (gathered through a mapping into a cache block).
FAULT_MODEL = dict(layers=1, hidden=1024, ffn=4096, heads=8, groups=4,
                   vocab=1024, divisor=128, optimizer=False)

# Seconds each in-flight test runs its writer against its readers.
RACE_SECONDS = float(os.environ.get("RESHARDFS_FAULT_SECONDS", "4"))

# The ways a view file is served, as mount options (the snapshot default
# cache, 1 GiB, has room for every file; mode_opts() narrows it).
MODES = {"read": ["passthrough=off"], "snapshot": ["passthrough=auto"]}


def mode_opts(mode, *opts):
    """Options for a mount in `mode`: the read path's with `opts` as given;
    snapshot's with a 2 MiB cache instead (snapshots of the 1 MiB files,
    passthrough_max 1M, two at a time) so that passthrough is what the
    test exercises and snapshots keep being built."""
    opts = list(opts)
    if mode == "snapshot":
        opts = [o for o in opts if not o.startswith("cache_size=")]
        opts += ["cache_size=2M", "passthrough_max=1M"]
    return opts + MODES[mode]


def check_mode(m, mode):
    """The mount serves files the way `mode` says (skips snapshot where the
    kernel or the daemon's privileges do not allow passthrough)."""
    p = stats(m)["passthrough"]
    if mode == "snapshot" and not p["active"]:
        pytest.skip(f"passthrough not available: {p['inactive_because']}")
    if mode == "read":
        assert not p["active"], p


def stats(m):
    """The stats file of a mount (a Mount, or its mount point)."""
    mnt = getattr(m, "mnt", m)
    return json.loads((Path(mnt) / ".reshardfs" / "stats").read_bytes())


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


def assert_eio(fn, what):
    try:
        data = fn()
    except OSError as e:
        assert e.errno == errno.EIO, f"{what}: {e!r}, expected EIO"
        return
    pytest.fail(f"{what}: read {len(data)} bytes "
                f"({'all zero' if not any(data) else 'data'}), expected EIO")


def flipped(data):
    """Different bytes of the same length."""
    return (np.frombuffer(data, np.uint8) ^ 0x5A).tobytes()


def first_diff(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y),
                min(len(a), len(b)))


@pytest.fixture
def fault_ckpt(tmp_path):
    """A tp=2 checkpoint of its own (the tests damage it) and its oracle at
    tp=8, computed before anything is damaged."""
    src = tmp_path / "ckpt"
    make_checkpoint(str(src), 2, **FAULT_MODEL)
    return src, ExpectedView(src, 8)


def affected(exp, key, source_rel):
    """The view files of `key` built from the source chunk `source_rel`, and
    those of `key` that are not."""
    hit, miss = [], []
    for rel in exp.files:
        if rel.startswith(key + "/") and not rel.endswith(".zarray"):
            (hit if source_rel in exp.source_chunks(rel) else miss).append(rel)
    assert hit and miss
    return hit, miss


# ------------------------------------------------ a source changed at rest

def _truncate(p, tmp):
    os.truncate(p, os.path.getsize(p) // 2)


def _rewrite(p, tmp):
    """Same size, new bytes, a new mtime."""
    st = os.stat(p)
    data = flipped(p.read_bytes())
    with open(p, "r+b") as f:
        f.write(data)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert os.stat(p).st_size == st.st_size


def _rewrite_mtime_kept(p, tmp):
    """Same size, new bytes, and the mtime set back (cp -p, touch -r and
    tar do this): only the ctime tells."""
    st = os.stat(p)
    data = flipped(p.read_bytes())
    with open(p, "r+b") as f:
        f.write(data)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = os.stat(p)
    assert (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns)


def _replace(p, tmp):
    """A new file with new bytes renamed over the source."""
    new = tmp / "replacement"
    new.write_bytes(flipped(p.read_bytes()))
    os.rename(new, p)


CHANGES = {"truncate": _truncate, "rewrite": _rewrite,
           "rewrite_mtime_kept": _rewrite_mtime_kept, "replace": _replace}


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("key", [COL, ROW], ids=["column", "row"])
@pytest.mark.parametrize("change", sorted(CHANGES))
def test_changed_source_gives_eio(fault_ckpt, mount, tmp_path, change, key,
                                  mode):
    src, exp = fault_ckpt
    source_rel = f"{key}/0.0.0"
    hit, miss = affected(exp, key, source_rel)
    other = [r for r in exp.files if r.startswith(
        "decoder.layers.self_attention.linear_qkv.weight/")][:3]
    want = {rel: exp.read(rel) for rel in hit + miss + other}
    m = mount(src, ["tp=8"] + MODES[mode])
    check_mode(m, mode)
    # Read a file first: its blocks are cached (its snapshot built) and an
    # open handle has pages in the kernel's cache (reads the snapshot);
    # none of it may hide the change from a new open.
    held = os.open(m.mnt / hit[0], os.O_RDONLY | os.O_DIRECT)
    assert read_direct(m.mnt / hit[0]) == want[hit[0]]

    CHANGES[change](src / source_rel, tmp_path)

    for rel in hit:
        assert_eio(lambda: read_file(m.mnt / rel), f"{rel} (open after)")
        assert_eio(lambda: read_direct(m.mnt / rel), f"{rel} (O_DIRECT)")
    buf = mmap.mmap(-1, 65536)
    if mode == "read":
        assert_eio(lambda: os.preadv(held, [buf], 0), f"{hit[0]} (held open)")
    else:
        # opened before the change: the snapshot's bytes, as built
        assert os.preadv(held, [buf], 0) == 65536
        assert buf[:] == want[hit[0]][:65536], f"{hit[0]} (held open)"
    os.close(held)
    for rel in miss + other:
        assert read_file(m.mnt / rel) == want[rel], rel
        assert read_direct(m.mnt / rel) == want[rel], rel
    log = m.log()
    assert f"{source_rel}: source changed since mount" in log, log[-2000:]


# ------------------------- an immutable source passed through as it is

def test_immutable_source(tmp_path, mount):
    """At tp=2 of a tp=2 checkpoint a chunk file is one whole source file;
    made immutable before the mount it is passed through to the source
    itself.  Nothing can change it then: truncating, writing, renaming over
    or removing it fail with EPERM, and every read stays right.  Clearing
    the flag (CAP_LINUX_IMMUTABLE) moves its ctime: every later open gives
    EIO.  (A file already open keeps reading the source directly: the one
    read the daemon can no longer vouch for, documented in SECURITY.md.)"""
    src = tmp_path / "ckpt"
    make_checkpoint(str(src), 2, **FAULT_MODEL)
    exp = ExpectedView(src, 2)
    rel = f"{COL}/0.0.0"
    path = src / rel
    want = exp.read(rel)
    r = subprocess.run(["chattr", "+i", str(path)], capture_output=True,
                       text=True)
    if r.returncode != 0:
        pytest.skip(f"chattr +i: {r.stderr.strip()}")
    try:
        m = mount(src, ["tp=2"])
        check_mode(m, "snapshot")
        held = open(m.mnt / rel, "rb")
        assert held.read() == want
        assert stats(m)["passthrough"]["opens"]["source"] == 1
        new = tmp_path / "new"
        new.write_bytes(flipped(want))
        for attempt in (lambda: os.truncate(path, 10),
                        lambda: open(path, "r+b"),
                        lambda: os.rename(new, path),
                        lambda: os.unlink(path)):
            with pytest.raises(OSError) as e:
                attempt()
            assert e.value.errno == errno.EPERM, e.value
        held.seek(0)
        assert held.read() == want
        assert read_direct(m.mnt / rel) == want
        subprocess.run(["chattr", "-i", str(path)], check=True)
        assert_eio(lambda: read_file(m.mnt / rel), f"{rel} (after chattr -i)")
        held.close()
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


# ---------------------------------------------- a source changed mid-read

class Race:
    """Readers of view files against a writer that changes their source and
    puts it back.  Every read is classified: ok (the oracle's bytes), eio,
    or bad (anything else: kept with its details)."""

    def __init__(self, mnt, want, seconds):
        self.mnt = Path(mnt)
        self.want = want              # rel -> expected bytes
        self.deadline = time.monotonic() + seconds
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.counts = {"ok": 0, "eio": 0, "bad": 0, "cycles": 0}
        self.bad = []
        self.errors = []

    def done(self):
        return self.stop.is_set() or time.monotonic() >= self.deadline

    def count(self, what, detail=None):
        with self.lock:
            self.counts[what] += 1
            if detail and len(self.bad) < 10:
                self.bad.append(detail)
        if what == "bad" and self.counts["bad"] >= 10:
            self.stop.set()

    def check(self, rel, off, n, data):
        want = self.want[rel]
        exp = want[off:off + n]
        if data == exp:
            self.count("ok")
            return
        kind = "short" if len(data) < len(exp) else "long" \
            if len(data) > len(exp) else "wrong bytes"
        at = first_diff(data, exp)
        zeros = not any(data[at:at + 64]) if at < len(data) else False
        self.count("bad", f"{rel} [{off}, +{n}): {kind}: got {len(data)} "
                          f"bytes of {len(exp)}, first difference at "
                          f"+{at}{' (zeros)' if zeros else ''}")

    def guarded(self, fn, *args):
        try:
            fn(*args)
        except BaseException as e:  # reported by the test
            self.errors.append(e)
            self.stop.set()

    def direct_reader(self, seed, size=65536):
        """Small O_DIRECT reads at random aligned offsets."""
        rnd = random.Random(seed)
        buf = mmap.mmap(-1, size)
        rels = sorted(self.want)
        while not self.done():
            rel = rnd.choice(rels)
            try:
                fd = os.open(self.mnt / rel, os.O_RDONLY | os.O_DIRECT)
            except OSError as e:
                if e.errno != errno.EIO:
                    raise
                self.count("eio")
                continue
            try:
                flen = len(self.want[rel])
                for _ in range(16):
                    off = rnd.randrange(0, flen, 4096)
                    n = min(size, flen - off)
                    try:
                        got = os.preadv(fd, [memoryview(buf)[:n]], off)
                    except OSError as e:
                        if e.errno != errno.EIO:
                            raise
                        self.count("eio")
                        continue
                    self.check(rel, off, n, buf[:got])
            finally:
                os.close(fd)

    def buffered_reader(self, seed, size=32768):
        """Sequential buffered reads of whole files through the kernel's
        page cache, dropped after every pass (POSIX_FADV_DONTNEED).

        A buffered read that meets a failed page returns the bytes before
        it (Linux returns a partial count rather than the error when some
        bytes were read): those bytes must be right, and the read that
        continues there must give EIO or the right bytes, never the end
        of the file."""
        rnd = random.Random(seed)
        rels = sorted(self.want)
        while not self.done():
            rel = rnd.choice(rels)
            try:
                fd = os.open(self.mnt / rel, os.O_RDONLY)
            except OSError as e:
                if e.errno != errno.EIO:
                    raise
                self.count("eio")
                continue
            try:
                flen = len(self.want[rel])
                off = 0
                while off < flen and not self.done():
                    n = min(size, flen - off)
                    try:
                        got = os.pread(fd, n, off)
                    except OSError as e:
                        if e.errno != errno.EIO:
                            raise
                        self.count("eio")
                        off += n
                        continue
                    if 0 < len(got) < n and \
                            got == self.want[rel][off:off + len(got)]:
                        self.count("ok")
                        off += len(got)     # continue after the partial
                        continue
                    self.check(rel, off, n, got)
                    off += n
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)

    def run(self, writer, readers):
        threads = [threading.Thread(target=self.guarded, args=(writer,))]
        threads += [threading.Thread(target=self.guarded, args=(r, i))
                    for i, r in enumerate(readers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=RACE_SECONDS + 120)
        assert not any(t.is_alive() for t in threads), "a thread hung"
        if self.errors:
            raise self.errors[0]


class SourceChanger:
    """Changes one source file and puts its bytes and mtime back (as
    cp -p, touch -r and tar would leave them): the ctime still moves, so
    the mount that saw the change must keep refusing the file."""

    def __init__(self, path, lo, hi, tmp):
        self.path = Path(path)
        self.orig = self.path.read_bytes()
        st = os.stat(path)
        self.times = (st.st_atime_ns, st.st_mtime_ns)
        self.lo, self.hi = lo, hi    # the source bytes the readers read
        self.tmp = Path(tmp)
        # replace: a garbage file to rename over the source, and a second
        # name for the source's own inode to rename it back from
        self.other = flipped(self.orig)
        self.garbage = self.tmp / "garbage"
        self.garbage.write_bytes(self.other)
        self.keep = self.tmp / "original"
        os.link(self.path, self.keep)
        self.ino = os.stat(path).st_ino

    def restore_identity(self):
        os.utime(self.path, ns=self.times)

    def truncate(self, rnd):
        cut = rnd.randrange(self.lo, self.hi)
        os.truncate(self.path, cut)
        time.sleep(rnd.random() * 0.001)
        fd = os.open(self.path, os.O_WRONLY)
        try:
            os.pwrite(fd, self.orig[cut:], cut)
        finally:
            os.close(fd)
        self.restore_identity()

    def rewrite(self, rnd):
        """New bytes over part of the range, then the old ones back."""
        a = rnd.randrange(self.lo, self.hi)
        b = min(self.hi, a + rnd.randrange(1, 256 << 10))
        fd = os.open(self.path, os.O_WRONLY)
        try:
            os.pwrite(fd, self.other[a:b], a)
            time.sleep(rnd.random() * 0.001)
            os.pwrite(fd, self.orig[a:b], a)
        finally:
            os.close(fd)
        self.restore_identity()

    def replace(self, rnd):
        tmp = self.tmp / "incoming"
        os.link(self.garbage, tmp)
        os.rename(tmp, self.path)
        time.sleep(rnd.random() * 0.001)
        os.rename(self.keep, self.path)
        os.link(self.path, self.keep)

    def finish(self):
        """The source as it was: same inode, bytes and mtime."""
        assert os.stat(self.path).st_ino == self.ino
        assert self.path.read_bytes() == self.orig
        self.restore_identity()


def source_range(exp, rel, source_rel):
    """[lo, hi) of the source chunk `source_rel` that view file `rel` reads
    when it is a single contiguous range (column-parallel), else the whole
    source file."""
    size = os.path.getsize(Path(exp.root) / source_rel)
    key, name = rel.rsplit("/", 1)
    if key != COL:
        return 0, size
    per = exp.size(rel)
    j = int(name.split(".")[1])
    n = size // per
    return (j % n) * per, (j % n + 1) * per


@pytest.mark.parametrize("serve", sorted(MODES))
@pytest.mark.parametrize("mode", ["truncate", "rewrite", "replace"])
@pytest.mark.parametrize("key", [COL, ROW], ids=["column", "row"])
def test_source_changes_during_reads(fault_ckpt, mount, tmp_path, key, mode,
                                     serve):
    """Readers against a writer that changes the source while they read
    and puts it back: every read is EIO or right; once changed, the file
    stays EIO in that mount though its bytes and mtime are back (its ctime
    is not); a new mount of the restored source reads right.  Each round
    is a fresh mount, so the change races reads again and again: in snapshot
    mode it races snapshot builds (a 2 MiB budget holds two of the 1 MiB
    files, so the readers' opens keep building them anew)."""
    src, exp = fault_ckpt
    source_rel = f"{key}/0.0.0"
    hit, _ = affected(exp, key, source_rel)
    want = {rel: exp.read(rel) for rel in hit}
    lo = min(source_range(exp, r, source_rel)[0] for r in hit)
    hi = max(source_range(exp, r, source_rel)[1] for r in hit)
    changer = SourceChanger(src / source_rel, lo, hi, tmp_path)
    rnd = random.Random(1)
    totals = {"ok": 0, "eio": 0, "bad": 0, "cycles": 0}
    bad = []
    deadline = time.monotonic() + RACE_SECONDS
    while time.monotonic() < deadline or totals["cycles"] < 4:
        # A 1 MiB cache holds one block: the row files, read in turn,
        # keep evicting each other, so blocks are rebuilt while the
        # source changes.
        m = mount(src, ["tp=8"] + mode_opts(serve, "cache_size=1M"))
        if totals["cycles"] == 0:
            check_mode(m, serve)
            for rel in hit:
                assert read_direct(m.mnt / rel) == want[rel], rel
            st = stats(m)
            if serve == "snapshot":
                assert st["passthrough"]["snapshots"]["builds"] > 0, st
            elif key == COL:
                assert st["cache_misses"] == 0, st   # from the source
            else:
                assert st["cache_misses"] > 0, st    # built into the cache
        race = Race(m.mnt, want, 0.3)

        def writer():
            # after the readers are under way
            while race.counts["ok"] < 4 and not race.done():
                time.sleep(0.001)
            getattr(changer, mode)(rnd)
            race.counts["cycles"] += 1

        race.run(writer, [race.direct_reader, race.direct_reader,
                          race.buffered_reader, race.buffered_reader])
        for k in totals:
            totals[k] += race.counts[k]
        bad += race.bad
        # changed, and put back: refused for good in this mount
        for rel in hit:
            with pytest.raises(OSError) as e:
                read_direct(m.mnt / rel)
            assert e.value.errno == errno.EIO, rel
        m.unmount()
        changer.finish()
    print(f"{key} {mode} {serve}: {totals}")
    assert not bad, f"{totals}: " + "\n".join(bad[:10])
    assert totals["ok"] > 0 and totals["eio"] > 0, totals
    # The source is as it was: a new mount reads every byte right.
    m = mount(src, ["tp=8"] + mode_opts(serve, "cache_size=1M"))
    for rel in hit:
        assert read_direct(m.mnt / rel) == want[rel], rel
        assert read_file(m.mnt / rel) == want[rel], rel


# ---------------------------------------- an I/O error under the source

def errfs_bin():
    """tests/fault/errfs.c, built next to the daemon."""
    from conftest import daemon_path
    for d in (Path(daemon_path()).parent, REPO / "build"):
        if (d / "errfs").is_file():
            return str(d / "errfs")
    pytest.skip("errfs not built (scripts/build builds it)")


class ErrFs:
    """tests/fault/errfs.c over `src` at `mnt`; what it fails is set by
    rewriting its control file (``fail(rel, off, len)``)."""

    def __init__(self, src, mnt, logdir, extra=()):
        self.mnt = Path(mnt)
        self.ctl = Path(logdir) / f"{self.mnt.name}.ctl"
        self.ctl.write_text("")
        self.log_path = Path(logdir) / f"{self.mnt.name}.log"
        self.mnt.mkdir()
        opts = ",".join([f"ctl={self.ctl}", *extra])
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [errfs_bin(), str(src), str(self.mnt), "-f", "-o", opts],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        if not wait_for(lambda: is_mounted(self.mnt), proc=self.proc):
            cleanup(self.proc, self.mnt)
            pytest.fail(f"errfs did not mount: {self.log()}")

    def fail(self, rel=None, off=0, length=None):
        tmp = self.ctl.with_suffix(".new")
        line = "" if rel is None else \
            f"{rel} {off}" + ("" if length is None else f" {length}")
        tmp.write_text(line + "\n")
        os.rename(tmp, self.ctl)

    def log(self):
        return self.log_path.read_text(errors="replace")

    def unmount(self):
        r = fusermount(self.mnt)
        assert r.returncode == 0, r.stderr
        assert self.proc.wait(timeout=MOUNT_TIMEOUT) == 0, self.log()


@pytest.fixture
def errfs(tmp_path):
    """Factory: errfs(src, extra_opts) -> ErrFs, unmounted at teardown
    (after the reshardfs mounts on top of it, which the `mount` fixture
    set up earlier tears down first)."""
    made = []

    def _make(src, extra=()):
        e = ErrFs(src, tmp_path / f"errfs{len(made)}", tmp_path, extra)
        made.append(e)
        return e
    yield _make
    for e in made:
        if is_mounted(e.mnt):
            cleanup(e.proc, e.mnt)
        elif e.proc.poll() is None:
            e.proc.terminate()
            e.proc.wait(timeout=MOUNT_TIMEOUT)


def read_range_direct(path, off, n):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        buf = mmap.mmap(-1, n)
        got = os.preadv(fd, [buf], off)
        return buf[:got]
    finally:
        os.close(fd)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_source_read_error(fault_ckpt, errfs, mount, mode):
    """errfs fails a few bytes of one source chunk: the reads that need
    them give EIO and a log line, everything else reads right, and once
    the error is gone every file reads right (no failure was cached).  In
    snapshot mode the snapshot build of a file meeting the error fails, and
    its opens fall back to the read path, where only the reads that need
    the failing bytes fail; once the error is gone they are snapshots."""
    src, exp = fault_ckpt
    e = errfs(src)
    m = mount(e.mnt, ["tp=8"] + mode_opts(mode, "cache_size=1M"))
    check_mode(m, mode)
    col = [f"{COL}/0.{j}.0" for j in range(4)]     # 1 MiB ranges of 0.0.0
    row = [f"{ROW}/0.0.{k}" for k in range(4)]     # 1 KiB of each 4 KiB row
    want = {rel: exp.read(rel) for rel in col + row}
    for j, rel in enumerate(col):
        assert exp.source_chunks(rel) == [f"{COL}/0.0.0"], rel
        assert source_range(exp, rel, f"{COL}/0.0.0") == \
            (j << 20, (j + 1) << 20), rel
    for rel in row:
        assert exp.source_chunks(rel) == [f"{ROW}/0.0.0"], rel

    # column-parallel (served from the source): 100 bytes 300 KiB into
    # the range of view file 0.1.0
    bad = 300 << 10
    e.fail(f"{COL}/0.0.0", (1 << 20) + bad, 100)
    assert_eio(lambda: read_direct(m.mnt / col[1]), f"{col[1]} whole")
    assert_eio(lambda: read_range_direct(m.mnt / col[1], bad & ~4095, 4096),
               f"{col[1]} the failing page")
    assert_eio(lambda: read_file(m.mnt / col[1]), f"{col[1]} buffered")
    for off in (0, bad - (64 << 10), bad + (64 << 10)):
        off &= ~4095
        assert read_range_direct(m.mnt / col[1], off, 65536) == \
            want[col[1]][off:off + 65536], off
    for rel in (col[0], col[2], col[3]):
        assert read_direct(m.mnt / rel) == want[rel], rel

    # row-parallel (strided, built in 1 MiB blocks): 20 bytes of row 100
    # of the source, in the 1 KiB that view file 0.0.2 takes from it
    e.fail(f"{ROW}/0.0.0", 100 * 4096 + 2 * 1024 + 10, 20)
    assert_eio(lambda: read_direct(m.mnt / row[2]), f"{row[2]} whole")
    assert_eio(lambda: read_range_direct(m.mnt / row[2], 900 << 10, 4096),
               f"{row[2]} in the same block")
    for rel in (row[0], row[1], row[3]):
        assert read_direct(m.mnt / rel) == want[rel], rel

    if mode == "snapshot":
        p = stats(m)["passthrough"]
        assert p["fallbacks"]["build_failed"] > 0, p
        built = p["snapshots"]["builds"]
    e.fail(None)
    for rel in col + row:
        assert read_direct(m.mnt / rel) == want[rel], rel
        assert read_file(m.mnt / rel) == want[rel], rel
    if mode == "snapshot":
        assert stats(m)["passthrough"]["snapshots"]["builds"] > built
    assert "errfs: EIO" in e.log()
    log = m.log()
    assert f"read of {col[1].split('/')[-1]} at" in log and \
        "Input/output error" in log, log[-2000:]


@pytest.mark.parametrize("mode", sorted(MODES))
def test_source_read_error_mapped(fault_ckpt, errfs, mount, mode):
    """errfs through the kernel's page cache (kernel_cache), so the
    daemon's strided gathers map the source and an I/O error arrives as
    SIGBUS: the reads built from the failing file give EIO, the rest read
    right, and after the error is gone everything does."""
    src, exp = fault_ckpt
    e = errfs(src, ["kernel_cache"])
    e.fail(f"{ROW}/0.0.0")              # before anything reads it
    m = mount(e.mnt, ["tp=8"] + mode_opts(mode, "cache_size=1M"))
    check_mode(m, mode)
    hit, miss = affected(exp, ROW, f"{ROW}/0.0.0")
    col = [f"{COL}/0.{j}.0" for j in range(4)]
    want = {rel: exp.read(rel) for rel in hit + miss + col}
    for rel in hit:
        assert_eio(lambda: read_direct(m.mnt / rel), rel)
    for rel in miss + col:
        assert read_direct(m.mnt / rel) == want[rel], rel
    e.fail(None)
    for rel in hit + miss:
        assert read_direct(m.mnt / rel) == want[rel], rel
    assert "Input/output error" in m.log()


# ------------------------------------------------ signals and unmounting

def _reader(mnt, rels, stop, seen):
    """Reads files until `stop` or an error; records the errno."""
    buf = mmap.mmap(-1, 1 << 20)
    while not stop.is_set():
        for rel in rels:
            try:
                fd = os.open(mnt / rel, os.O_RDONLY | os.O_DIRECT)
                try:
                    while os.preadv(fd, [buf], 0) and not stop.is_set():
                        seen["reads"] = seen.get("reads", 0) + 1
                        break
                finally:
                    os.close(fd)
            except OSError as e:
                seen["errno"] = e.errno
                return


def test_sigkill_auto_unmount(fault_ckpt, mount):
    """SIGKILL mid-read with -o auto_unmount: the mount point is released
    (fusermount3, which libfuse leaves watching the session, unmounts it),
    and the reader gets an error, not a hang."""
    src, exp = fault_ckpt
    m = mount(src, ["tp=8", "auto_unmount"])
    rels = [r for r in exp.files if r.startswith(COL + "/")]
    stop, seen = threading.Event(), {}
    readers = [threading.Thread(target=_reader, args=(m.mnt, rels, stop, seen))
               for _ in range(4)]
    for t in readers:
        t.start()
    try:
        assert wait_for(lambda: seen.get("reads", 0) > 20), seen
        os.kill(m.pid, signal.SIGKILL)
        assert m.proc.wait(timeout=MOUNT_TIMEOUT) == -signal.SIGKILL
        m.unmounted = True     # nothing left for the fixture to unmount
        assert wait_for(lambda: not is_mounted(m.mnt), 5), \
            "mount still there 5 s after the daemon was killed"
    finally:
        stop.set()
        for t in readers:
            t.join(timeout=30)
        cleanup(m.proc, m.mnt)
    assert not any(t.is_alive() for t in readers), "a reader hung"


def _open_and_read(path):
    f = open(path, "rb", buffering=0)
    assert f.read(4096)
    return f


@pytest.mark.parametrize("mode", sorted(MODES))
def test_sigterm_with_open_files(fault_ckpt, mount, mode):
    """SIGTERM while files are held open: the daemon unmounts (libfuse
    detaches the mount, MNT_DETACH) and exits 0; reads of the open files
    that reach the daemon then fail with ENOTCONN, they do not hang (pages
    already in the kernel's cache may still be read).  A file open in
    passthrough keeps reading its snapshot, which the kernel holds: the
    right bytes, without the daemon."""
    src, exp = fault_ckpt
    m = mount(src, ["tp=8"] + MODES[mode])
    check_mode(m, mode)
    rel = f"{COL}/0.0.0"
    held = [_open_and_read(m.mnt / "common.pt")]
    fd = os.open(m.mnt / rel, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, 65536)
    try:
        assert os.preadv(fd, [buf], 0) == 65536
        os.kill(m.pid, signal.SIGTERM)
        rc = m.proc.wait(timeout=MOUNT_TIMEOUT)
        m.unmounted = True
        assert rc == 0, m.log()
        assert not is_mounted(m.mnt)
        if mode == "snapshot":
            assert os.preadv(fd, [buf], 65536) == 65536
            assert buf[:] == exp.read(rel)[65536:2 * 65536]
        else:
            with pytest.raises(OSError) as ei:
                os.preadv(fd, [buf], 65536)
            assert ei.value.errno in (errno.ENOTCONN, errno.ECONNABORTED), \
                ei.value
    finally:
        for close in (lambda: os.close(fd), held[0].close):
            try:
                close()
            except OSError as e:    # the connection is gone
                assert e.errno == errno.ENOTCONN, e


def test_fusermount_u_with_open_files(fault_ckpt, mount):
    """fusermount3 -u refuses a mount with files open (EBUSY: it unmounts
    with umount2(2) without MNT_DETACH, like umount); the mount and the open
    files carry on.  -u -z detaches it at once; the daemon keeps serving the
    open files and exits 0 when the last one is closed."""
    src, exp = fault_ckpt
    m = mount(src, ["tp=8"])
    rel = f"{COL}/0.0.0"
    want = exp.read(rel)
    f = _open_and_read(m.mnt / rel)
    try:
        r = fusermount(m.mnt)
        assert r.returncode != 0 and "busy" in r.stderr.lower(), \
            (r.returncode, r.stderr)
        assert is_mounted(m.mnt) and m.proc.poll() is None
        f.seek(0)
        assert f.read() == want

        r = fusermount(m.mnt, lazy=True)
        assert r.returncode == 0, r.stderr
        m.unmounted = True
        assert not is_mounted(m.mnt)
        assert m.proc.poll() is None, "daemon exited with a file open"
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        f.seek(0)
        assert f.read() == want        # still served after the detach
    finally:
        f.close()
    assert m.proc.wait(timeout=MOUNT_TIMEOUT) == 0, m.log()


# ------------------------------------------------------- memory pressure

# VmHWM allowed to the daemon with a 1 MiB cache, whatever the view size:
# the blocks the (at most 10) FUSE threads and 2 prefetch threads hold at
# once (4 MiB each, two per request at most), their 1 MiB read buffers, and
# the process itself.  The view read is several times larger.
PRESSURE_RSS_MIB = 160


def vm_hwm_kib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


# The cache of each way: the read path, and the default (snapshots of the
# files up to 256 KiB, the read path for the others), at the 1 MiB
# minimum; snapshot with room for 16 of the 1 MiB files at once.
PRESSURE_OPTS = {"read": ["cache_size=1M", "passthrough=off"],
                 "mixed": ["cache_size=1M"],
                 "snapshot": ["cache_size=16M", "passthrough_max=1M"]}


@pytest.mark.parametrize("mode", sorted(PRESSURE_OPTS))
def test_memory_pressure(sample, mount, mode):
    """A small cache and 32 threads reading every file of a tp=8 view of a
    tp=2 checkpoint at once (buffered and O_DIRECT, whole files and
    ranges): every byte right, the daemon's peak RSS bounded, and its
    snapshots' bytes within the cache's budget."""
    src = sample(2, layers=1, hidden=1024, ffn=4096, heads=8, groups=4,
                 vocab=4096)
    exp = ExpectedView(src, 8)
    digest = {rel: hashlib.sha256(exp.read(rel)).digest() for rel in exp.files}
    total = sum(exp.size(r) for r in exp.files)
    assert total > 2 * PRESSURE_RSS_MIB << 20, total
    m = mount(src, ["tp=8"] + PRESSURE_OPTS[mode])
    if mode != "read":
        check_mode(m, "snapshot")
    work = [(rel, k) for k in range(2) for rel in exp.files]
    random.Random(3).shuffle(work)
    lock = threading.Lock()
    bad, errors, done = [], [], [0]

    def worker(i):
        try:
            while True:
                with lock:
                    if not work:
                        return
                    rel, k = work.pop()
                if (i + k) % 2:
                    data = read_file(m.mnt / rel)
                else:
                    data = read_direct(m.mnt / rel)
                if hashlib.sha256(data).digest() != digest[rel]:
                    bad.append(rel)
                with lock:
                    done[0] += len(data)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads), "a reader hung"
    if errors:
        raise errors[0]
    assert not bad, bad[:10]
    assert done[0] == 2 * total
    hwm = vm_hwm_kib(m.pid) >> 10
    # Sanitizer runtimes (scripts/sanitize, RESHARDFS_BIN) add their own
    # shadow memory: ASan about 3x, TSan 5-10x.
    maps = Path(f"/proc/{m.pid}/maps").read_text()
    bound = PRESSURE_RSS_MIB * (8 if "libtsan" in maps or "libasan" in maps
                                else 1)
    st = stats(m)
    held = st["passthrough"]["snapshots"]["bytes_peak"]
    print(f"memory pressure ({mode}): {2 * total >> 20} MiB read, daemon "
          f"VmHWM {hwm} MiB (bound {bound} MiB), snapshots' peak {held >> 20} "
          f"MiB, opens {st['passthrough']['opens']}")
    assert hwm < bound, f"daemon VmHWM {hwm} MiB"
    assert held <= st["cache_budget"], st
    if mode != "read":
        assert st["passthrough"]["opens"]["snapshot"] > 0, st
