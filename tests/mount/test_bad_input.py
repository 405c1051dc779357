"""Refusing bad sources and options; faults and writes through a live mount."""

import errno
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import (MOUNT_TIMEOUT, fusermount, is_mounted, make_checkpoint,
                      wait_for)
from oracle import ExpectedView, classify

QKV = "decoder.layers.self_attention.linear_qkv.weight"
FC1 = "decoder.layers.mlp.linear_fc1.weight"
FC2 = "decoder.layers.mlp.linear_fc2.weight"
EMB = "embedding.word_embeddings.weight"


@pytest.fixture
def ckpt(tmp_path):
    """A private tp=1 sample the test may damage."""
    d = tmp_path / "ckpt"
    make_checkpoint(str(d), 1, optimizer=False)
    return d


def error_lines(stderr):
    return [ln for ln in stderr.splitlines() if ln.startswith("reshardfs:")]


def assert_erofs(ops):
    """Every write-like operation in ops (name: a callable; an fd it
    returns is closed) fails with EROFS."""
    wrong = {}
    for name, op in ops.items():
        try:
            r = op()
            if isinstance(r, int):
                os.close(r)
            wrong[name] = "succeeded"
        except OSError as e:
            if e.errno != errno.EROFS:
                wrong[name] = errno.errorcode.get(e.errno, e.errno)
    assert not wrong, f"expected EROFS: {wrong}"


def assert_refused(rc, stderr, *needles):
    """Non-zero exit and one ``reshardfs: ...`` line holding every needle."""
    assert rc != 0, f"mount exited 0; stderr:\n{stderr}"
    lines = error_lines(stderr)
    assert any(all(n in ln for n in needles) for ln in lines), \
        f"no 'reshardfs:' line names {needles}; stderr:\n{stderr}"


# ------------------------------------------------------------ bad sources

def test_empty_dir(tmp_path, failing_mount):
    src = tmp_path / "empty"
    src.mkdir()
    rc, err = failing_mount(src, ["tp=8"])
    assert rc != 0, err
    assert any(str(src) in ln or "metadata.json" in ln
               for ln in error_lines(err)), err


def test_regular_file(tmp_path, failing_mount):
    src = tmp_path / "file.bin"
    src.write_bytes(b"not a checkpoint\n")
    rc, err = failing_mount(src, ["tp=8"])
    assert rc != 0, err
    assert any(str(src) in ln for ln in error_lines(err)), err


def test_missing_source(tmp_path, failing_mount):
    src = tmp_path / "nonexistent"
    rc, err = failing_mount(src, ["tp=8"])
    assert rc != 0, err
    assert any(str(src) in ln for ln in error_lines(err)), err


def _edit_zarray(path, how):
    meta = json.loads(path.read_text())
    if how == "bad_json":
        path.write_text('{"chunks": [1, 128, 64], "shape": ')
        return
    if how == "not_an_object":
        path.write_text("[1, 2, 3]")
        return
    if how == "missing_chunks":
        del meta["chunks"]
    elif how == "negative_shape":
        meta["shape"][1] = -128
    elif how == "chunks_not_dividing":
        meta["chunks"][1] = 48          # 128 rows in chunks of 48
    elif how == "zero_chunk":
        meta["chunks"][2] = 0
    elif how == "rank_mismatch":
        meta["chunks"] = meta["chunks"][:2]
    elif how == "unknown_dtype":
        meta["dtype"] = "<x9"
    path.write_text(json.dumps(meta, indent=4, sort_keys=True))


@pytest.mark.parametrize("how", [
    "bad_json", "not_an_object", "missing_chunks", "negative_shape",
    "chunks_not_dividing", "zero_chunk", "rank_mismatch", "unknown_dtype"])
def test_malformed_zarray(ckpt, failing_mount, how):
    _edit_zarray(ckpt / QKV / ".zarray", how)
    rc, err = failing_mount(ckpt, ["tp=2"])
    if how == "chunks_not_dividing":
        # Valid zarr (edge chunks), but the stored chunk files no longer
        # match it: the refusal names those files.
        assert_refused(rc, err, f"{QKV}/0.0.0", "expected")
    else:
        assert_refused(rc, err, f"{QKV}/.zarray")


def test_tp_axis_not_tiled(ckpt, failing_mount):
    """A TP-split axis whose stored chunks do not tile it (a valid zarr
    edge chunk) cannot be resharded: the line names the .zarray."""
    qkv = ckpt / QKV
    meta = json.loads((qkv / ".zarray").read_text())
    rows = meta["shape"][1]
    meta["chunks"][1] = rows // 2 + 8           # two chunks, the last partial
    (qkv / ".zarray").write_text(json.dumps(meta, indent=4, sort_keys=True))
    item = 2 if meta["dtype"] == "bfloat16" else 4
    size = meta["chunks"][1] * meta["chunks"][2] * item
    for f in list(qkv.iterdir()):
        if f.name != ".zarray":
            f.unlink()
    for layer in range(meta["shape"][0]):
        for c in range(2):
            (qkv / f"{layer}.{c}.0").write_bytes(b"\0" * size)
    rc, err = failing_mount(ckpt, ["tp=2"])
    assert_refused(rc, err, f"{QKV}/.zarray", "axis 1", str(rows))


def test_missing_chunk(ckpt, failing_mount):
    os.unlink(ckpt / FC2 / "2.0.0")
    rc, err = failing_mount(ckpt, ["tp=2"])
    assert_refused(rc, err, f"{FC2}/2.0.0")


@pytest.mark.parametrize("delta", [-1, +1])
def test_chunk_wrong_size(ckpt, failing_mount, delta):
    p = ckpt / EMB / "0.0"
    data = p.read_bytes()
    p.write_bytes(data[:-1] if delta < 0 else data + b"\0")
    rc, err = failing_mount(ckpt, ["tp=2"])
    assert_refused(rc, err, f"{EMB}/0.0")


def test_uneven_split(ckpt, failing_mount):
    """tp=3: nothing in the sample splits into 3.  The line must name a
    tensor that really fails, the axis and the sizes."""
    exp = ExpectedView(ckpt, 1)
    failing = {}
    for key in exp.array_keys():
        kind, _, axis = classify(key)
        if kind is None:
            continue
        a = exp.view_array(key)
        m = (a.shape[axis] // a.chunks[axis]) // exp.src_tp
        if a.shape[axis] % (m * 3):
            failing[key] = a.shape[axis]
    assert failing
    rc, err = failing_mount(ckpt, ["tp=3"])
    assert rc != 0, err
    ok = False
    for ln in error_lines(err):
        for key, size in failing.items():
            if key in ln and re.search(rf"\b{size}\b", ln) and \
                    re.search(r"axis|dim", ln, re.I):
                ok = True
    assert ok, f"no line names a failing tensor {sorted(failing)}, its axis " \
               f"and sizes; stderr:\n{err}"


@pytest.mark.parametrize("opt,needle", [
    ("bogus=1", "bogus"),
    ("tp=0", "tp"),
    ("tp=abc", "tp"),
    ("tp=-2", "tp"),
    ("cache_size=12Q", "cache_size"),
    ("vocab_size=abc", "vocab_size"),
    ("format=hdf5", "format"),
])
def test_bad_option(sample, failing_mount, opt, needle):
    src = sample(1)
    opts = [opt] if opt.startswith("tp=") else ["tp=2", opt]
    rc, err = failing_mount(src, opts)
    assert rc != 0, err
    assert needle in err, f"stderr does not name {needle!r}:\n{err}"


# ------------------------------------------------- faults on a live mount

def _read(path):
    with open(path, "rb") as f:
        return f.read()


def assert_eio(path):
    with pytest.raises(OSError) as ei:
        data = _read(path)
        pytest.fail(f"{path}: read {len(data)} bytes "
                    f"({'all zero' if not any(data) else 'data'}), "
                    "expected EIO")
    assert ei.value.errno == errno.EIO, ei.value


def test_writes_are_erofs(sample, mount):
    src = sample(1)
    m = mount(src, ["tp=2"])
    mnt = m.mnt
    f = mnt / QKV / "0.0.0"
    d = mnt / QKV
    before = _read(f)
    ops = {
        "open O_WRONLY": lambda: os.open(f, os.O_WRONLY),
        "open O_RDWR": lambda: os.open(f, os.O_RDWR),
        "open O_CREAT": lambda: os.open(mnt / "new", os.O_WRONLY | os.O_CREAT,
                                        0o644),
        "open O_TRUNC": lambda: os.open(f, os.O_WRONLY | os.O_TRUNC),
        "mkdir": lambda: os.mkdir(mnt / "newdir"),
        "unlink": lambda: os.unlink(f),
        "rmdir": lambda: os.rmdir(d),
        "rename": lambda: os.rename(f, d / "9.9.9"),
        "chmod": lambda: os.chmod(f, 0o600),
        "chown": lambda: os.chown(f, 1, 1),
        "truncate": lambda: os.truncate(f, 0),
        "symlink": lambda: os.symlink("x", mnt / "link"),
        "link": lambda: os.link(f, mnt / "hard"),
        "setxattr": lambda: os.setxattr(f, "user.test", b"1"),
        "removexattr": lambda: os.removexattr(f, "user.reshardfs.sources"),
        "utime": lambda: os.utime(f, (1, 1)),
        "mknod": lambda: os.mknod(mnt / "fifo", 0o600 | 0o010000),
    }
    assert_erofs(ops)
    assert _read(f) == before
    assert sorted(os.listdir(mnt)) == sorted(os.listdir(src))


@pytest.fixture
def live(ckpt, mount):
    """tp=1 source mounted at tp=2, with the expected bytes of the files the
    fault tests read computed before anything is damaged."""
    exp = ExpectedView(ckpt, 2)
    want = {rel: exp.read(rel) for rel in exp.files
            if rel.split("/")[0] in (QKV, FC1, FC2)}
    m = mount(ckpt, ["tp=2"])
    # stat before any read: sizes are known without data
    for rel in want:
        assert os.stat(m.mnt / rel).st_size == len(want[rel])
    return ckpt, m.mnt, want


def _unaffected_ok(mnt, want, rels):
    for rel in rels:
        assert _read(mnt / rel) == want[rel], rel


def test_truncated_source_gives_eio(live):
    src, mnt, want = live
    p = src / QKV / "0.0.0"
    os.truncate(p, os.path.getsize(p) // 2)
    assert_eio(mnt / QKV / "0.1.0")   # bytes past the new end of the source
    assert_eio(mnt / QKV / "0.0.0")   # the source changed size: still EIO
    _unaffected_ok(mnt, want, [f"{QKV}/1.0.0", f"{QKV}/1.1.0",
                               f"{FC2}/0.0.1"])


def test_mtime_change_gives_eio(live):
    src, mnt, want = live
    p = src / FC2 / "1.0.0"
    st = os.stat(p)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert_eio(mnt / FC2 / "1.0.1")
    _unaffected_ok(mnt, want, [f"{FC2}/0.0.0", f"{FC2}/2.0.1"])


def test_replaced_source_gives_eio(live, tmp_path):
    src, mnt, want = live
    p = src / FC1 / "2.0.0"
    tmp = tmp_path / "replacement"
    shutil.copy2(p, tmp)
    assert tmp.read_bytes() == p.read_bytes()
    os.rename(tmp, p)   # same bytes, same mtime, new inode
    assert_eio(mnt / FC1 / "2.0.0")
    _unaffected_ok(mnt, want, [f"{FC1}/1.0.0", f"{FC1}/3.3.0"])


# ------------------------------------------------------- mount -t helper

def _daemon_pids(mnt):
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(mnt).encode() in cmd and any(
                os.path.basename(c) == b"reshardfs" for c in cmd):
            pids.append(int(d))
    return pids


# mount(8) resets PATH to this before it runs /sbin/mount.fuse3 (util-linux
# sanitize_env), so `mount -t fuse.reshardfs` finds the daemon only when it is
# installed on this path.
SECURE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TEMP_INSTALL = "/usr/local/sbin/reshardfs"
# The options of an fstab line: reshardfs's and generic mount options, some
# of which mount.fuse3 drops (_netdev, nofail) and some it adds (dev, suid).
HELPER_OPTS = "ro,tp=8,noatime,nodev,nosuid,_netdev,nofail"


def _mount_command(form, binary, src, mnt):
    """(argv, env) of one way to mount through the mount.fuse3 helper; all
    of them run the daemon without -f, so it daemonizes."""
    env = dict(os.environ)
    bindir = os.path.dirname(os.path.abspath(binary))
    if form == "mount -t fuse.reshardfs":
        installed = shutil.which("reshardfs", path=SECURE_PATH)
        if installed is None and os.geteuid() == 0:
            # Install it the way `cmake --install` would, for this test.
            os.symlink(os.path.abspath(binary), TEMP_INSTALL)
            installed = TEMP_INSTALL
        if installed is None or not os.path.samefile(installed, binary):
            pytest.skip("mount(8) resets PATH to " + SECURE_PATH +
                        "; `mount -t fuse.reshardfs` needs reshardfs "
                        "installed there (the other forms cover the helper)")
        return ["mount", "-t", "fuse.reshardfs", str(src), str(mnt),
                "-o", HELPER_OPTS], env
    if form == "mount.fuse3 -t reshardfs":
        helper = shutil.which("mount.fuse3") or "/sbin/mount.fuse3"
        env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
        return [helper, str(src), str(mnt), "-t", "reshardfs",
                "-o", HELPER_OPTS], env
    # old style: the program named in the source, absolute
    return ["mount", "-t", "fuse", f"{os.path.abspath(binary)}#{src}",
            str(mnt), "-o", HELPER_OPTS], env


@pytest.mark.parametrize("form", ["mount -t fuse.reshardfs",
                                  "mount.fuse3 -t reshardfs",
                                  "mount -t fuse BIN#SRC"])
def test_mount_helper(sample, reshardfs_bin, tmp_path, form):
    if shutil.which("mount.fuse3") is None and \
            not os.path.exists("/sbin/mount.fuse3"):
        pytest.skip("mount.fuse3 helper not installed")
    src = sample(2)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    exp = ExpectedView(src, 8)
    argv, env = _mount_command(form, reshardfs_bin, src, mnt)
    r = subprocess.run(argv, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True,
                       timeout=MOUNT_TIMEOUT * 3)
    pids = []
    try:
        assert r.returncode == 0, f"{argv}: {r.stderr}"
        assert wait_for(lambda: is_mounted(mnt)), "mount did not appear"
        pids = _daemon_pids(mnt)
        for rel in ["metadata.json", f"{QKV}/.zarray", f"{QKV}/3.7.0",
                    f"{FC1}/0.15.0", f"{FC2}/2.0.5", f"{EMB}/7.0",
                    "rng_state/shard_0.1_1.2.pt"]:
            assert _read(mnt / rel) == exp.read(rel), rel
    finally:
        if os.path.islink(TEMP_INSTALL) and \
                os.readlink(TEMP_INSTALL) == os.path.abspath(reshardfs_bin):
            os.unlink(TEMP_INSTALL)
        if is_mounted(mnt):
            u = fusermount(mnt)
            gone = wait_for(lambda: not is_mounted(mnt))
            if not gone:
                fusermount(mnt, lazy=True)
            assert u.returncode == 0, u.stderr
            assert gone, "mount did not vanish after fusermount3 -u"
    # the daemonized process must go away on its own after the unmount
    def alive():
        return [p for p in pids if _proc_state(p) not in ("Z", "gone")]
    if not wait_for(lambda: not alive()):
        left = alive()
        for p in left:          # our own daemon: do not leak it
            os.kill(p, signal.SIGKILL)
        pytest.fail(f"daemon {left} still running after the unmount")


def _proc_state(pid):
    try:
        for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
            if ln.startswith("State:"):
                return ln.split()[1]
    except OSError:
        return "gone"
    return "?"
