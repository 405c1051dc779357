"""What a new user meets first: --dry-run, refusals that lead with a
summary, hints for options given the way other tools take them, unknown
options named with the one meant, a second mount on a mount point, a
non-empty mount point, the query-group warning, and the stats file's word
on CUDA on a machine without a GPU.

The dry run is checked against the real mount of the same SOURCE and
options (the oracle: the files and bytes the mounted tree holds), and
against the catalog the sample writer made.
"""

import json
import os
import re
import subprocess

import pytest

from conftest import is_mounted
from oracle import ExpectedView


def dry_run(binary, *args):
    r = subprocess.run([binary, "--dry-run", *map(str, args)],
                       stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, timeout=120)
    return r.returncode, r.stdout, r.stderr


def tree_totals(mnt):
    files = dirs = size = 0
    for root, ds, fs in os.walk(mnt):
        dirs += len(ds)
        for f in fs:
            files += 1
            size += os.path.getsize(os.path.join(root, f))
    return files, dirs, size


@pytest.mark.parametrize("opts", [["tp=8"], ["tp=4", "format=torch_dist"],
                                  ["tp=1", "format=safetensors",
                                   "dtype=f32"]])
def test_dry_run_matches_mount(reshardfs_bin, sample, mount, opts):
    src = sample(2)
    rc, out, err = dry_run(reshardfs_bin, src, "-o", ",".join(opts))
    assert rc == 0, err
    m = mount(src, opts)
    files, dirs, size = tree_totals(m.mnt)
    assert f"view files: {files} in {dirs} directories, {size} bytes" in out
    view = next(o.split("=")[1] for o in opts if o.startswith("format=")) \
        if any(o.startswith("format=") for o in opts) else "zarr"
    tp = opts[0].split("=")[1]
    assert re.search(rf"^view: {view}, tp={tp} \(stored at tp=2\)", out, re.M)
    assert out.startswith(f"source: {src} (zarr)")


def test_dry_run_verbose_lists_every_tensor(reshardfs_bin, sample):
    src = sample(2)
    rc, out, _ = dry_run(reshardfs_bin, "-v", src, "-o", "tp=4")
    assert rc == 0
    exp = ExpectedView(src, 4)
    names = sorted(exp.arrays)
    lines = [ln.strip() for ln in out.splitlines() if ln.startswith("  ")]
    assert sorted(ln.split()[0] for ln in lines) == names
    fc1 = next(ln for ln in lines
               if ln.startswith("decoder.layers.mlp.linear_fc1.weight "))
    assert "split along axis 1 (gated" in fc1
    for ln in lines:
        m = re.match(r"(\S+)  (\S+) (\[.*?\])  chunks (\[.*?\])  ", ln)
        assert m, ln
        a = exp.arrays[m.group(1)]
        assert (m.group(3), m.group(4)) == (str(a.shape), str(a.chunks)), ln


def test_dry_run_refusal_summary_names_working_tp(reshardfs_bin, sample):
    rc, out, err = dry_run(reshardfs_bin, sample(2), "-o", "tp=3")
    assert rc == 1 and out == ""
    lines = [ln for ln in err.splitlines() if ln.startswith("reshardfs:")]
    assert lines[0].startswith(f"reshardfs: {sample(2)}: refused: ")
    assert "at tp=3; tp values that work: 1, 2, 4, 8, 16, 32, 64" in lines[0]
    m = re.search(r"\((\d+) problems below\)", lines[0])
    assert m and int(m.group(1)) == len(lines) - 1 > 1


def test_mount_refusal_has_the_same_summary(sample, failing_mount):
    rc, err = failing_mount(sample(2), ["tp=3"])
    assert rc != 0
    first = next(ln for ln in err.splitlines() if ln.startswith("reshardfs:"))
    assert "refused: the layout does not fit" in first
    assert "tp values that work: 1, 2, 4, 8" in first


def test_dry_run_of_a_non_checkpoint(reshardfs_bin, tmp_path):
    rc, out, err = dry_run(reshardfs_bin, tmp_path)
    assert rc == 1 and out == ""
    assert err.splitlines()[0].startswith(
        f"reshardfs: {tmp_path}: refused: not a checkpoint")


@pytest.mark.parametrize("argv", [["SRC", "MNT", "tp=8"],
                                  ["SRC", "MNT", "--tp", "8"],
                                  ["--tp=8", "SRC", "MNT"],
                                  ["SRC", "MNT", "-tp=8"],
                                  ["SRC", "MNT", "--dtype", "bf16"]])
def test_hints_say_what_to_type(reshardfs_bin, sample, tmp_path, argv):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    args = [str(sample(2)) if a == "SRC" else str(mnt) if a == "MNT" else a
            for a in argv]
    r = subprocess.run([reshardfs_bin, *args], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2
    want = "-o dtype=bf16" if "--dtype" in argv else "-o tp=8"
    given = next(a for a in argv if a not in ("SRC", "MNT", "8", "bf16"))
    assert r.stderr.splitlines() == [
        f"reshardfs: {given}: did you mean {want}?"]
    assert not is_mounted(mnt)


def test_bare_argument_that_is_a_path_is_no_hint(reshardfs_bin, sample,
                                                 tmp_path):
    """A directory really named tp=8 is a path, not a forgotten -o."""
    mnt = tmp_path / "tp=8"
    mnt.mkdir()
    rc, out, _ = dry_run(reshardfs_bin, sample(2), "-o", "tp=2")
    assert rc == 0
    r = subprocess.run([reshardfs_bin, "--dry-run", str(sample(2)), str(mnt)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "did you mean" not in r.stderr


def test_second_mount_on_a_mount_point_refused(reshardfs_bin, sample, mount,
                                              tmp_path):
    m = mount(sample(2), ["tp=2"])
    r = subprocess.run([reshardfs_bin, "-f", str(sample(2)), str(m.mnt),
                        "-o", "tp=4"], stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=60)
    rc, err = r.returncode, r.stderr
    assert rc != 0
    assert f"reshardfs: {m.mnt}: already a mount point (fuse.reshardfs)" in err
    assert "fusermount3 -u" in err
    # the first mount still serves
    assert os.listdir(m.mnt)


# (-o options, the one line that refuses them)
UNKNOWN = [
    (["foo=bar"], "-o foo=bar: unknown option; reshardfs --help lists "
                  "the options"),
    # context parallelism is no option, and tp or pp is not what was meant
    (["cp=4"], "-o cp=4: unknown option; reshardfs --help lists the "
               "options"),
    (["tpp=2"], "-o tpp=2: unknown option; did you mean -o tp=2?"),
    (["tp=2", "TP=2"], "-o TP=2: unknown option; did you mean -o tp=2?"),
    (["tp=2", "dtyp=bf16"], "-o dtyp=bf16: unknown option; did you mean "
                            "-o dtype=bf16?"),
    (["vpp"], "-o vpp: unknown option; did you mean -o vpp=N?"),
    # libfuse's own options are among those meant
    (["tp=2", "alow_other"], "-o alow_other: unknown option; did you mean "
                             "-o allow_other?"),
    # libfuse 2's nonempty is gone in libfuse 3 (the mount goes ahead with
    # a warning instead)
    (["tp=2", "nonempty"], "-o nonempty: unknown option; reshardfs --help "
                           "lists the options"),
]


@pytest.mark.parametrize("opts,line", UNKNOWN)
def test_unknown_option_refused_naming_the_one_meant(reshardfs_bin, sample,
                                                     failing_mount, opts,
                                                     line):
    """A dry run and a mount refuse an option neither reshardfs nor
    libfuse takes with the same single line, libfuse's bare "fuse: unknown
    option(s)" never shown."""
    rc, out, err = dry_run(reshardfs_bin, sample(2), "-o", ",".join(opts))
    assert (rc, out, err.splitlines()) == (1, "", [f"reshardfs: {line}"])
    rc, err = failing_mount(sample(2), opts)
    assert rc == 1 and err.splitlines() == [f"reshardfs: {line}"]


@pytest.mark.parametrize("arg,line", [
    ("--dryrun", "--dryrun: unknown option; did you mean --dry-run?"),
    ("--cache-size=4G", "--cache-size=4G: unknown option; did you mean "
                        "-o cache_size=4G?"),
    ("--allow-other", "--allow-other: unknown option; did you mean "
                      "-o allow_other?"),
    ("-x", "-x: unknown option; reshardfs --help lists the options")])
def test_unknown_flag_refused(reshardfs_bin, sample, tmp_path, arg, line):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run([reshardfs_bin, "-f", str(sample(2)), str(mnt), arg],
                       stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and r.stderr.splitlines() == [
        f"reshardfs: {line}"]
    assert not is_mounted(mnt)


# Every option libfuse takes from reshardfs that works without SELinux
# (context= and its kin need it), as mount(8), fstab and mount.fuse3 pass
# them, and an empty one ("-o tp=2,").  fusermount3, which auto_unmount
# mounts through, refuses -n and user=: they go in a mount of their own.
FUSE_OPTS = ["ro", "rw", "dev", "nodev", "suid", "nosuid", "exec", "noexec",
             "async", "sync", "dirsync", "atime", "noatime", "allow_other",
             "auto_unmount", "default_permissions", "fsname=ckpt",
             "subtype=x", "clone_fd", "max_threads=4", "max_idle_threads=2",
             "debug", ""]
MTAB_OPTS, MTAB_FLAGS = ["user=root"], ("-n", "-r")


def test_fuse_and_mount_options_still_accepted(reshardfs_bin, sample,
                                               mount):
    flags = ("-s", "-d")
    rc, _, err = dry_run(reshardfs_bin, sample(2), "-o",
                         ",".join(["tp=2"] + FUSE_OPTS + MTAB_OPTS),
                         *flags, *MTAB_FLAGS)
    assert rc == 0 and "unknown" not in err
    for opts, args in [(FUSE_OPTS, flags), (MTAB_OPTS, MTAB_FLAGS)]:
        m = mount(sample(2), ["tp=2"] + opts, extra_args=args)
        assert (m.mnt / "metadata.json").read_bytes() == \
            (sample(2) / "metadata.json").read_bytes()
        assert "unknown" not in m.log()


def test_non_empty_mount_point_warns(sample, mount, tmp_path):
    """libfuse 3 mounts over a directory with entries: the view hides them
    until the unmount, which one warning line says; they come back."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    (mnt / "notes.txt").write_text("mine")
    (mnt / "sub").mkdir()
    m = mount(sample(2), ["tp=2"], name="full")
    assert "notes.txt" not in os.listdir(m.mnt)
    assert "metadata.json" in os.listdir(m.mnt)
    warnings = [ln for ln in m.log().splitlines() if "warning" in ln]
    assert warnings == [f"reshardfs: warning: {mnt} is not empty: its 2 "
                        "entries are hidden under the view until it is "
                        "unmounted"]
    m.unmount()
    assert sorted(os.listdir(mnt)) == ["notes.txt", "sub"]
    assert (mnt / "notes.txt").read_text() == "mine"
    # an empty mount point: no warning
    m = mount(sample(2), ["tp=2"], name="empty")
    assert "warning" not in m.log()


def _has_nvidia():
    return any(os.path.exists(p) for p in ("/dev/nvidia0", "/dev/nvidiactl",
                                           "/proc/driver/nvidia/version"))


@pytest.mark.skipif(_has_nvidia(), reason="an NVIDIA driver or GPU is here")
def test_stats_say_no_gpu(sample, mount, failing_mount):
    """Without a driver the CUDA runtime says its driver is "insufficient";
    the stats file (and executor=cuda's refusal) say what is missing."""
    m = mount(sample(2), ["tp=2"])
    es = json.loads((m.mnt / ".reshardfs" / "stats").read_text())[
        "executor_stats"]
    if not es["cuda_built"]:
        pytest.skip("this reshardfs was built without CUDA")
    assert es["cuda_status"].startswith(
        "cuda: no usable device: no NVIDIA driver or GPU found")
    rc, err = failing_mount(sample(2), ["executor=cuda"])
    assert rc == 1 and err.splitlines()[0].startswith(
        "reshardfs: executor=cuda: cuda: no usable device: no NVIDIA "
        "driver or GPU found")


def test_query_group_warning(sample, mount, reshardfs_bin):
    """The sample's args say 4 heads in 2 query groups: tp=4 and 8 cut
    them (mounted, with a warning naming the tp values that keep them),
    tp=2 does not."""
    rc, _, err = dry_run(reshardfs_bin, sample(2), "-o", "tp=8")
    assert rc == 0
    assert ("warning: tp=8 cuts the model's 2 query groups (4 attention "
            "heads, from common.pt args)") in err
    assert "tp values that keep them whole: 1, 2" in err
    rc, _, err = dry_run(reshardfs_bin, sample(2), "-o", "tp=2")
    assert rc == 0 and "warning" not in err
