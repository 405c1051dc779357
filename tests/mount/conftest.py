"""Fixtures for the mount tests, after libfuse's old pytest suite.

* The daemon is ``$RESHARDFS_BIN`` or ``<repo>/build/reshardfs``.
* ``mount(src, opts)`` starts ``reshardfs -f SRC MNT -o <opts>``, waits with a
  deadline for MNT to show up in /proc/self/mountinfo and returns a handle.
  At teardown the mount is unmounted strictly (``fusermount3 -u``) and the
  daemon must exit 0.  If anything goes wrong, cleanup escalates:
  ``fusermount3 -u``, then ``-u -z`` as a last resort, then terminate/kill.
* ``failing_mount(src, opts)`` runs a mount that must fail and returns
  ``(returncode, stderr)``.
* ``$RESHARDFS_EXTRA_OPTS`` (e.g. ``executor=cuda``) is added to every
  mount that must succeed.
* Tests that need the daemon (they use the ``reshardfs_bin`` fixture, which
  the others build on) are skipped with the reason when /dev/fuse,
  fusermount3 or the binary is missing.  Oracle-only tests always run.
"""

import importlib.util
import mmap
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

MOUNT_TIMEOUT = 10.0   # seconds for a mount to appear / a daemon to exit
POLL = 0.01            # seconds between mountinfo polls (bounded by deadline)


def _load_sample_writer():
    path = REPO / "scripts" / "make_sample_checkpoint.py"
    spec = importlib.util.spec_from_file_location("make_sample_checkpoint",
                                                  path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


sample_writer = _load_sample_writer()
make_checkpoint = sample_writer.make_checkpoint


# ---------------------------------------------------------------- helpers

def extra_mount_opts():
    """Options added to every mount: ``$RESHARDFS_EXTRA_OPTS`` (comma
    separated), e.g. ``executor=cuda`` to run the mount tests on a GPU
    (scripts/gpu_check)."""
    extra = os.environ.get("RESHARDFS_EXTRA_OPTS", "")
    return [o for o in extra.split(",") if o]


def bytes_delivered(st):
    """The view bytes a daemon produced for readers, from its stats file:
    read-path replies (``bytes_served``) plus the bytes of the snapshots
    built for passthrough opens, whose reads never reach the daemon
    (fs/passthrough.h)."""
    return st["bytes_served"] + st["passthrough"]["snapshots"]["bytes_built"]


def daemon_path():
    return os.environ.get("RESHARDFS_BIN") or str(REPO / "build" / "reshardfs")


def skip_reason():
    """Why mount tests cannot run here, or None."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing: FUSE mount tests need it"
    if shutil.which("fusermount3") is None:
        return "fusermount3 not found (install fuse3)"
    b = daemon_path()
    if not (os.path.isfile(b) and os.access(b, os.X_OK)):
        return f"reshardfs binary not found at {b} (build it or set " \
               "RESHARDFS_BIN)"
    return None


def _unescape_mountinfo(s):
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 3 < len(s) and s[i + 1:i + 4].isdigit():
            out.append(chr(int(s[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def mount_entry(mnt):
    """The /proc/self/mountinfo fields of the topmost mount at ``mnt``."""
    mnt = os.path.realpath(mnt)
    found = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if _unescape_mountinfo(fields[4]) == mnt:
                found = fields
    return found


def is_mounted(mnt):
    e = mount_entry(mnt)
    if e is None:
        return False
    fstype = e[e.index("-") + 1]
    return fstype.startswith("fuse")


def read_direct(path):
    """The whole file in O_DIRECT reads (no page cache on either side)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        size = os.fstat(fd).st_size
        buf = mmap.mmap(-1, max(size, 4096))
        got = os.preadv(fd, [buf], 0)
        return buf[:got]
    finally:
        os.close(fd)


def wait_for(pred, timeout=MOUNT_TIMEOUT, proc=None):
    """Poll ``pred`` until true or the deadline passes.  If ``proc`` is given
    the poll interval is spent waiting on it, and its exit ends the wait."""
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return True
        if time.monotonic() >= deadline:
            return False
        if proc is not None:
            try:
                proc.wait(timeout=POLL)
                return pred()
            except subprocess.TimeoutExpired:
                pass
        else:
            time.sleep(POLL)


def fusermount(mnt, lazy=False):
    cmd = ["fusermount3", "-u"] + (["-z"] if lazy else []) + [str(mnt)]
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=30)


def cleanup(proc, mnt):
    """Get rid of a mount and its daemon whatever state they are in."""
    if is_mounted(mnt):
        fusermount(mnt)
        if not wait_for(lambda: not is_mounted(mnt), 5):
            fusermount(mnt, lazy=True)   # last resort only
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


class Mount:
    """One running daemon.  ``mnt`` is the mount point (a Path)."""

    def __init__(self, binary, src, mnt, opts, logdir, extra_args=()):
        self.src = Path(src)
        self.mnt = Path(mnt)
        self.opts = list(opts) + extra_mount_opts()
        self.log_path = Path(logdir) / f"reshardfs-{self.mnt.name}.log"
        self.cmd = [binary, "-f", *extra_args, str(src), str(mnt)]
        if self.opts:
            self.cmd += ["-o", ",".join(self.opts)]
        self.proc = None
        self.unmounted = False

    def start(self):
        self.mnt.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log)
        if not wait_for(lambda: is_mounted(self.mnt), proc=self.proc):
            rc = self.proc.poll()
            cleanup(self.proc, self.mnt)
            self.unmounted = True   # nothing left for teardown to unmount
            pytest.fail(f"mount did not appear within {MOUNT_TIMEOUT}s "
                        f"(daemon rc={rc}): {' '.join(self.cmd)}\n"
                        f"{self.log()}")
        return self

    def log(self):
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    @property
    def pid(self):
        return self.proc.pid

    def unmount(self):
        """Strict unmount: fusermount3 -u must succeed, the mount must go
        and the daemon must exit 0."""
        if self.unmounted:
            return
        self.unmounted = True
        try:
            r = fusermount(self.mnt)
            assert r.returncode == 0, \
                f"fusermount3 -u {self.mnt} failed: {r.stderr}"
            try:
                rc = self.proc.wait(timeout=MOUNT_TIMEOUT)
            except subprocess.TimeoutExpired:
                pytest.fail("daemon did not exit after unmount\n" + self.log())
            assert rc == 0, f"daemon exited {rc}\n{self.log()}"
            assert not is_mounted(self.mnt)
        except BaseException:
            cleanup(self.proc, self.mnt)
            raise

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *a):
        if exc_type is None:
            self.unmount()
        else:
            self.unmounted = True
            cleanup(self.proc, self.mnt)
        return False


def run_failing_mount(binary, src, mnt, opts, logdir, timeout=MOUNT_TIMEOUT):
    """Run a mount that is expected to fail.  Returns (returncode, stderr).
    Fails the test if the mount comes up or the daemon hangs."""
    mnt = Path(mnt)
    mnt.mkdir(parents=True, exist_ok=True)
    cmd = [binary, "-f", str(src), str(mnt)]
    if opts:
        cmd += ["-o", ",".join(opts)]
    errp = Path(logdir) / f"failing-{mnt.name}.err"
    with open(errp, "wb") as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=err)
    exited = wait_for(lambda: proc.poll() is not None or is_mounted(mnt),
                      timeout, proc=proc)
    mounted = is_mounted(mnt)
    if mounted or not exited or proc.poll() is None:
        cleanup(proc, mnt)
        what = "mounted" if mounted else f"did not exit in {timeout}s"
        pytest.fail(f"expected the mount to fail, but it {what}: "
                    f"{' '.join(cmd)}\n{errp.read_text(errors='replace')}")
    return proc.returncode, errp.read_text(errors="replace")


# ---------------------------------------------------------------- hooks

_NEEDS_DAEMON = {"reshardfs_bin", "mount", "failing_mount"}


# The slow cases: more points of real-writer matrices whose other points
# run every time, listed in slow_cases.txt (docs/TESTING.md, "What runs
# where").  CI and scripts/test skip them; scripts/test --all
# (RESHARDFS_ALL=1) runs them.
SLOW_CASES = HERE / "slow_cases.txt"
SLOW_REASON = ("slow real-writer case (tests/mount/slow_cases.txt), run by "
               "scripts/test --all")


def slow_cases():
    """The node ids of slow_cases.txt, as FILE::TEST[PARAMS]."""
    ids = set()
    for line in SLOW_CASES.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            ids.add(line)
    return ids


def mark_slow(config, items):
    """Marks the listed cases slow, and skips them unless RESHARDFS_ALL=1.
    A line naming no test of a file that was collected whole (or of a test
    function that was, when node ids picked the tests) is an error: a
    renamed test must not quietly join the fast set."""
    ids = slow_cases()
    run_all = os.environ.get("RESHARDFS_ALL") == "1"
    skip = pytest.mark.skip(reason=SLOW_REASON)
    # what a line is checked against: its test function when node ids
    # picked the tests, else its file
    sep = "[" if any("::" in str(a) for a in config.args) else "::"
    seen, collected = set(), set()
    for item in items:
        key = f"{item.path.name}::{item.nodeid.split('::', 1)[1]}"
        collected.add(key.split(sep, 1)[0])
        if key in ids:
            seen.add(key)
            item.add_marker(pytest.mark.slow)
            if not run_all:
                item.add_marker(skip)
    stale = sorted(i for i in ids - seen if i.split(sep, 1)[0] in collected)
    if stale:
        raise pytest.UsageError(f"{SLOW_CASES}: no such test: {stale[0]}")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: a slow real-writer case (slow_cases.txt) that "
        "only scripts/test --all (RESHARDFS_ALL=1) runs")


def pytest_collection_modifyitems(config, items):
    mark_slow(config, items)
    reason = skip_reason()
    if reason is None:
        return
    mark = pytest.mark.skip(reason=reason)
    for item in items:
        if _NEEDS_DAEMON & set(getattr(item, "fixturenames", ())):
            item.add_marker(mark)


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="session")
def reshardfs_bin():
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    return daemon_path()


@pytest.fixture
def mount(reshardfs_bin, tmp_path):
    """Factory: ``mount(src, opts=["tp=8"], name=None, extra_args=())`` ->
    Mount (already mounted).  Everything still mounted at teardown is
    unmounted strictly and must exit 0."""
    mounts = []
    n = [0]

    def _mount(src, opts=("tp=8",), name=None, extra_args=()):
        n[0] += 1
        mnt = tmp_path / (name or f"mnt{n[0]}")
        m = Mount(reshardfs_bin, src, mnt, opts, tmp_path, extra_args)
        mounts.append(m)
        return m.start()

    yield _mount
    errors = []
    for m in reversed(mounts):
        if m.unmounted:
            continue
        try:
            m.unmount()
        except BaseException as e:  # keep cleaning up the others
            errors.append(e)
    if errors:
        raise errors[0]


@pytest.fixture
def failing_mount(reshardfs_bin, tmp_path):
    """``failing_mount(src, opts)`` -> (returncode, stderr)."""
    n = [0]

    def _run(src, opts, timeout=MOUNT_TIMEOUT):
        n[0] += 1
        return run_failing_mount(reshardfs_bin, src, tmp_path / f"fmnt{n[0]}",
                                 opts, tmp_path, timeout)
    return _run


@pytest.fixture(scope="session")
def sample(tmp_path_factory):
    """Factory of read-only sample checkpoints shared by the session:
    ``sample(tp, prefix="", **kw)`` -> Path.  Tests must not modify them;
    tests that corrupt a source make their own with ``make_checkpoint``."""
    made = {}
    base = tmp_path_factory.mktemp("samples")

    def _sample(tp, prefix="", **kw):
        key = (tp, prefix, tuple(sorted(kw.items())))
        if key not in made:
            name = f"tp{tp}{'_' + prefix.strip('.') if prefix else ''}" + \
                "".join(f"_{k}{v}" for k, v in sorted(kw.items()))
            d = base / name
            make_checkpoint(str(d), tp, prefix=prefix, **kw)
            made[key] = d
        return made[key]
    return _sample
