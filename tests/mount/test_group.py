"""-o group=mpi: daemons started together by mpirun read each source byte
once (fs/group.h).

The members here share one host, each with its own mount point, as a job
with several daemons per node would.  Every view file on every member is
compared with the numpy oracle (oracle.py); the bytes each member read
from storage come from its stats file, and their sum is checked against
the source's size.  Faults: a member stopped (SIGSTOP) or killed in
mid-read, replies corrupted on purpose (the reshardfs-testhooks build,
RESHARDFS_TEST_CORRUPT_REPLIES), a source changed during the job, and
members that see different sources at mount.  The NCCL lane runs on
the test build's emulated GPU and stand-in libnccl (tests/nccl_emu),
since NCCL needs a GPU per member.
"""
import errno
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import REPO, is_mounted, make_checkpoint
from oracle import expected_view

MPIRUN = shutil.which("mpirun")
BIN = Path(os.environ.get("RESHARDFS_BIN", REPO / "build" / "reshardfs"))
HOOKS = BIN.parent / "reshardfs-testhooks"


pytestmark = pytest.mark.skipif(
    MPIRUN is None or not HOOKS.exists(),
    reason="needs Open MPI (scripts/setup installs openmpi-bin and "
           "libopenmpi-dev; the build then makes reshardfs-testhooks)")


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    """A zarr checkpoint of 190 MB: its big tensors span several 4 MiB
    extents, so every member owns a stripe of most of them."""
    d = tmp_path_factory.mktemp("group") / "src"
    make_checkpoint(str(d), 1, layers=2, hidden=1024, ffn=4096, heads=8,
                    groups=4, vocab=8000, optimizer=False)
    return d


def source_bytes(root):
    return sum(os.path.getsize(os.path.join(d, f))
               for d, _, fs in os.walk(root) for f in fs)


class Job:
    """mpirun of n members, member r mounting srcs[r] at base/mnt<r>.
    recovery: mpirun --enable-recovery, so that the job outlives a member
    killed on purpose (without it, as users run it, mpirun ends the job
    and returns non-zero when a member fails)."""

    def __init__(self, tmp, n, srcs, opts, binary=BIN, env=None,
                 recovery=True):
        self.tmp, self.n = Path(tmp), n
        self.mnts = [self.tmp / f"mnt{r}" for r in range(n)]
        for m in self.mnts:
            m.mkdir(exist_ok=True)
        srclist = self.tmp / "sources.txt"
        srclist.write_text("".join(f"{s}\n" for s in srcs))
        launcher = self.tmp / "member.sh"
        launcher.write_text(
            "#!/bin/sh\n"
            "r=$OMPI_COMM_WORLD_RANK\n"
            f"exec {binary} \"$(sed -n \"$((r + 1))p\" {srclist})\" "
            f"{self.tmp}/mnt$r -o {opts}\n")
        launcher.chmod(0o755)
        self.log = open(self.tmp / "job.log", "w+")
        self.proc = subprocess.Popen(
            [MPIRUN, "--allow-run-as-root", "--oversubscribe",
             *(["--enable-recovery"] if recovery else []),
             "-np", str(n), str(launcher)],
            stdout=self.log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, env=dict(os.environ, **(env or {})),
            start_new_session=True)

    def wait_mounted(self, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(is_mounted(m) for m in self.mnts):
                return
            assert self.proc.poll() is None, self.text()
            time.sleep(0.05)
        raise AssertionError("members did not mount:\n" + self.text())

    def text(self):
        self.log.flush()
        return (self.tmp / "job.log").read_text()

    def member_pids(self):
        """Member rank -> pid (the daemons' command lines name their mount)."""
        out = subprocess.run(["pgrep", "-a", "-f", str(self.tmp / "mnt")],
                             capture_output=True, text=True).stdout
        pids = {}
        for line in out.splitlines():
            pid, cmd = line.split(" ", 1)
            for r, m in enumerate(self.mnts):
                if cmd.split()[0].endswith(("reshardfs", "reshardfs-testhooks")) \
                        and f" {m} " in f" {cmd} ":
                    pids[r] = int(pid)
        return pids

    def stats(self, r):
        return json.loads((self.mnts[r] / ".reshardfs" / "stats").read_text())

    def stop(self, timeout=60):
        for m in self.mnts:
            if is_mounted(m):
                subprocess.run(["fusermount3", "-u", str(m)],
                               capture_output=True)
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
                for m in self.mnts:
                    subprocess.run(["fusermount3", "-uz", str(m)],
                                   capture_output=True)
            self.log.close()


@pytest.fixture
def job(tmp_path):
    made = []

    def _job(n, srcs, opts, **kw):
        j = Job(tmp_path, n, srcs, opts, **kw)
        made.append(j)
        return j
    yield _job
    for j in made:
        if not j.log.closed:
            j.stop()


def read_views(job, members, exp, errors=None, midway=None):
    """Every member in `members` reads every view file at once: rank ->
    number of files that differ from exp (or raised, into errors).
    midway: called once, when the first member has read a tenth of its
    files."""
    bad = {}
    once = threading.Lock()

    def one(r):
        n = 0
        for i, (rel, want) in enumerate(exp.items()):
            if midway and i == len(exp) // 10 and once.acquire(False):
                midway()
            try:
                got = (job.mnts[r] / rel).read_bytes()
            except OSError as e:
                if errors is None:
                    raise
                errors.setdefault(r, []).append((rel, e.errno))
                continue
            n += got != want
        bad[r] = n
    ts = [threading.Thread(target=one, args=(r,)) for r in members]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return bad


@pytest.mark.parametrize("n", [4, 8])
def test_each_source_byte_read_once(src, job, n):
    exp = expected_view(src, 2)
    j = job(n, [src] * n, "tp=2,group=mpi")
    j.wait_mounted()
    assert read_views(j, range(n), exp) == {r: 0 for r in range(n)}
    stats = [j.stats(r)["group"] for r in range(n)]
    storage = sum(s["storage_bytes"] for s in stats)
    total = source_bytes(src)
    # The union of what the members needed is the whole source: read
    # once, not n times.
    assert storage <= 1.05 * total, (storage, total)
    for r, s in enumerate(stats):
        assert (s["member"], s["members"]) == (r, n)
        assert s["extents_fetched"] > 0 and s["requests_served"] > 0
        assert s["bypassed"] == {"timeouts": 0, "bad_checksums": 0,
                                 "stale_replies": 0, "peer_down": 0}, s
        # Each owns a stripe of the extents: no member reads them all.
        assert s["storage_bytes"] < 0.6 * total, (r, s["storage_bytes"])
    assert j.stop() == 0, j.text()


def test_independent_mounts_read_n_times(src, mount):
    """The comparison: without a group, each mount reads the whole
    source itself."""
    exp = expected_view(src, 2)
    total = 0
    for i in range(2):
        m = mount(src, ["tp=2"], name=f"solo{i}").mnt
        for rel, want in exp.items():
            assert (m / rel).read_bytes() == want
        total += json.loads((m / ".reshardfs" / "stats").read_text())[
            "source_bytes_read"]
    assert total >= 2 * 0.95 * sum(
        os.path.getsize(os.path.join(d, f))
        for d, _, fs in os.walk(src) for f in fs if f[0].isdigit())


def test_corrupt_replies_are_bypassed(src, job):
    exp = expected_view(src, 2)
    j = job(4, [src] * 4, "tp=2,group=mpi", binary=HOOKS,
            env={"RESHARDFS_TEST_CORRUPT_REPLIES": "3"})
    j.wait_mounted()
    assert read_views(j, range(4), exp) == {r: 0 for r in range(4)}
    bad = sum(j.stats(r)["group"]["bypassed"]["bad_checksums"]
              for r in range(4))
    assert bad > 0
    assert "failed its checksum; reading it from storage" in j.text()
    assert j.stop() == 0, j.text()


def four_members(src, job):
    """A mounted job of 4 that waits 2 s on a peer, and its oracle."""
    j = job(4, [src] * 4, "tp=2,group=mpi,group_timeout=2")
    j.wait_mounted()
    return expected_view(src, 2), j


def test_stopped_member_is_bypassed(src, job):
    exp, j = four_members(src, job)
    victim = j.member_pids()[3]
    os.kill(victim, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        assert read_views(j, range(3), exp) == {0: 0, 1: 0, 2: 0}
        took = time.monotonic() - t0
        down = [j.stats(r)["group"] for r in range(3)]
        # (at least the stopped one: a loaded machine may delay others)
        assert all(s["peers_down"] >= 1 for s in down), down
        assert sum(s["bypassed"]["timeouts"] + s["bypassed"]["peer_down"]
                   for s in down) > 0
        # A read waits on a silent peer one timeout at most, then the
        # member stops asking it.
        assert took < 60, took
    finally:
        os.kill(victim, signal.SIGCONT)
    assert read_views(j, [3], exp) == {3: 0}
    assert j.stop() == 0, j.text()


def test_killed_member_mid_read(src, job):
    exp, j = four_members(src, job)
    victim = j.member_pids()[2]
    assert read_views(j, [0, 1, 3], exp, midway=lambda: os.kill(
        victim, signal.SIGKILL)) == {0: 0, 1: 0, 3: 0}
    # Member 2 is silent: within the timeout (2 s) every member counts it
    # down, and asks it nothing more.
    deadline = time.monotonic() + 15
    while True:
        s = [j.stats(r)["group"] for r in (0, 1, 3)]
        if all(x["peers_down"] >= 1 for x in s) or \
                time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert all(x["peers_down"] >= 1 for x in s), s
    j.stop()


def test_changed_source_gives_eio_on_every_member(tmp_path, job):
    src = tmp_path / "src"
    make_checkpoint(str(src), 1, layers=1, hidden=512, ffn=2048, heads=8,
                    groups=4, vocab=4000, optimizer=False)
    exp = expected_view(src, 2)
    j = job(4, [src] * 4, "tp=2,group=mpi")
    j.wait_mounted()
    # One tensor's chunk file rewritten in place: its bytes and ctime move.
    victim = src / "decoder.layers.mlp.linear_fc1.weight" / "0.0.0"
    data = bytearray(victim.read_bytes())
    data[0] ^= 1
    victim.write_bytes(bytes(data))
    errors = {}
    read_views(j, range(4), exp, errors)
    for r in range(4):
        failed = dict(errors.get(r, []))
        hit = [rel for rel in failed if "linear_fc1.weight" in rel]
        assert hit and all(failed[rel] == errno.EIO for rel in hit), (r, failed)
        # Files built from other sources still read.
        assert not [rel for rel in failed if "linear_fc1" not in rel], failed
    j.stop()


def test_members_that_see_different_sources_refuse(src, tmp_path, job):
    """A copy has another ctime: the members cannot know it holds the
    same bytes, so every member refuses, naming the file and who sees
    what."""
    copy = tmp_path / "copy"
    shutil.copytree(src, copy)
    j = job(4, [src, src, src, copy], "tp=2,group=mpi", recovery=False)
    assert j.proc.wait(120) != 0
    text = j.text()
    lines = [ln for ln in text.splitlines()
             if "is not the same file on every member" in ln]
    assert len(lines) == 4, text
    assert "member(s) 0,1,2 see one, 3 another" in lines[0], lines[0]
    assert not any(is_mounted(m) for m in j.mnts)


FAKE_NCCL = BIN.parent / "libfake_nccl.so"


def lane_job(src, job, opts="tp=2,group=mpi", n=4, **env):
    """n members whose lane is the real NCCL lane code (fs/group_nccl.c)
    on the test build's emulated GPU and stand-in libnccl
    (tests/nccl_emu), which keeps NCCL's stream order: an operation
    issued in a bad order would deadlock here as on GPUs."""
    j = job(n, [src] * n, opts, binary=HOOKS,
            env={"RESHARDFS_TEST_NCCL_LIB": str(FAKE_NCCL), **env})
    j.wait_mounted()
    return expected_view(src, 2), j


@pytest.mark.parametrize("n", [4, 8])
def test_lane_moves_payloads(src, job, n):
    """Offers, accepts and declines (fs/group_lane.h): replies whose
    owner and asker both have a free slot go over the lane, the rest over
    MPI; every byte still matches, the store is still read once, and no
    read waited out a timeout (a deadlock on the lane would)."""
    exp, j = lane_job(src, job, n=n)
    assert read_views(j, range(n), exp) == {r: 0 for r in range(n)}
    stats = [j.stats(r)["group"] for r in range(n)]
    assert sum(s["storage_bytes"] for s in stats) <= 1.05 * source_bytes(src)
    sent = sum(s["lane_sent_bytes"] for s in stats)
    got = sum(s["lane_received_bytes"] for s in stats)
    assert sent == got > 0, stats
    for s in stats:
        assert s["lane"] == "nccl" and not s["lane_ended"], s
        assert s["lane_received_bytes"] <= s["received_bytes"]
        assert s["bypassed"] == {"timeouts": 0, "bad_checksums": 0,
                                 "stale_replies": 0, "peer_down": 0}, s
    assert "extent payloads over nccl" in j.text()
    assert j.stop() == 0, j.text()


def test_stalled_lane_falls_back(src, job):
    """Member 1's NCCL sends never complete: it and the members waiting on
    it give the lane up after the group timeout (aborting their
    communicators) and go on over MPI, or read the extent from storage;
    no read fails or returns other bytes."""
    exp, j = lane_job(src, job, "tp=2,group=mpi,group_timeout=1",
                      FAKE_NCCL_STALL_RANK="1")
    assert read_views(j, range(4), exp) == {r: 0 for r in range(4)}
    stats = [j.stats(r)["group"] for r in range(4)]
    assert stats[1]["lane_ended"] and stats[1]["lane_sent_bytes"] == 0
    assert "did not complete within the group timeout" in j.text()
    assert j.stop() == 0, j.text()


def test_lane_peer_killed_mid_read(src, job):
    """A member killed while the others read: transfers with it fail or
    time out, the others' reads complete with the right bytes."""
    exp, j = lane_job(src, job, "tp=2,group=mpi,group_timeout=2")
    victim = j.member_pids()[3]
    assert read_views(j, range(3), exp, midway=lambda: os.kill(
        victim, signal.SIGKILL)) == {r: 0 for r in range(3)}
    j.stop()


def test_group_nccl_on_without_gpus_refused(src, job):
    """This machine has no GPU: group_nccl=on ends every member with one
    line saying which members cannot, and nothing stays mounted."""
    if gpu_count():
        pytest.skip("a GPU is present")
    j = job(2, [src] * 2, "tp=2,group=mpi,group_nccl=on", recovery=False)
    assert j.proc.wait(120) != 0
    text = j.text()
    lines = [ln for ln in text.splitlines() if "-o group_nccl=on:" in ln]
    assert len(lines) == 2, text
    assert "members 0, 1 have no CUDA device in use" in lines[0], lines[0]
    assert not any(is_mounted(m) for m in j.mnts)


def gpu_count():
    if not shutil.which("nvidia-smi"):
        return 0
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return r.stdout.count("GPU ") if r.returncode == 0 else 0


def nccl_lane_built():
    r = subprocess.run([str(BIN), "--version"], capture_output=True,
                       text=True)
    return "nccl" in r.stdout


@pytest.mark.parametrize("n", [1, 2])
def test_nccl_lane_on_gpus(src, job, n):
    """The NCCL lane itself, on a machine with n GPUs (scripts/gpu_check
    runs this; elsewhere it is skipped).  One member: the lane's setup
    (libnccl loaded, a device buffer, an ncclUniqueId through MPI, a
    non-blocking communicator) and its teardown.  Two members, one GPU
    each: payloads GPU to GPU."""
    if gpu_count() < n or not nccl_lane_built():
        pytest.skip(f"needs {n} GPU(s) and a build with the NCCL lane")
    exp = expected_view(src, 2)
    j = job(n, [src] * n, "tp=2,group=mpi,group_nccl=on,executor=cuda,"
            "gpus=$OMPI_COMM_WORLD_LOCAL_RANK")
    j.wait_mounted()
    assert read_views(j, range(n), exp) == {r: 0 for r in range(n)}
    stats = [j.stats(r)["group"] for r in range(n)]
    for s in stats:
        assert s["lane"] == "nccl" and not s["lane_ended"], s
    if n > 1:
        assert sum(s["lane_received_bytes"] for s in stats) > 0, stats
    assert j.stop() == 0, j.text()


@pytest.mark.parametrize("opts, message", [
    ("group=tcp", "-o group=tcp: must be mpi"),
    ("group=mpi,group_nccl=yes", "-o group_nccl=yes: must be auto, on or off"),
    ("group_nccl=on", "-o group_nccl=on: needs -o group=mpi"),
    ("group_timeout=5", "-o group_timeout=5: needs -o group=mpi"),
    ("group=mpi,group_timeout=0", "must be seconds from 0.01 to 3600"),
])
def test_group_options_refused(src, tmp_path, opts, message):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run([str(BIN), str(src), str(mnt), "-o", opts],
                       capture_output=True, text=True, timeout=30,
                       stdin=subprocess.DEVNULL)
    assert r.returncode != 0 and message in r.stderr, r.stderr
    assert not is_mounted(mnt)
