"""The zarr view, byte for byte, against the numpy oracle and zarr-python."""

import json
import os
import random
import stat
import shutil
import subprocess
import threading

import ml_dtypes  # noqa: F401  (registers "bfloat16" so zarr can read it)
import numpy as np
import pytest
import zarr

from conftest import bytes_delivered
from oracle import ExpectedView, expected_view, read_source_array

SOURCES = [(1, ""), (2, ""), (1, "model.")]
SOURCE_IDS = ["src1", "src2", "src1-model"]
TARGETS = [1, 2, 4, 8]


def walk(root):
    """(set of file relpaths, set of dir relpaths) under root."""
    files, dirs = set(), set()
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for d in dirnames:
            dirs.add(os.path.normpath(os.path.join(rel, d)))
        for f in filenames:
            files.add(os.path.normpath(os.path.join(rel, f)))
    return files, dirs


def read_all(path):
    with open(path, "rb") as f:
        return f.read()


def assert_tree_equals_oracle(root, exp):
    """Listing equality, st_size before any read, then every byte."""
    files, dirs = walk(root)
    assert dirs == set(exp.dirs), \
        f"dirs: extra {sorted(dirs - set(exp.dirs))[:5]} " \
        f"missing {sorted(set(exp.dirs) - dirs)[:5]}"
    assert files == set(exp.files), \
        f"files: extra {sorted(files - set(exp.files))[:5]} " \
        f"missing {sorted(set(exp.files) - files)[:5]}"
    for rel in exp.files:
        st = os.stat(os.path.join(root, rel))
        assert stat.S_ISREG(st.st_mode), rel
        assert st.st_size == exp.size(rel), \
            f"{rel}: st_size {st.st_size} != {exp.size(rel)}"
    for rel in exp.dirs:
        assert stat.S_ISDIR(os.stat(os.path.join(root, rel)).st_mode), rel
    for rel in exp.files:
        got = read_all(os.path.join(root, rel))
        want = exp.read(rel)
        if got != want:
            first = next((i for i, (a, b) in enumerate(zip(got, want))
                          if a != b), min(len(got), len(want)))
            pytest.fail(f"{rel}: {len(got)} bytes vs {len(want)} expected, "
                        f"first difference at byte {first}")


def zarr_raw(path):
    """Read a zarr array with zarr-python; return it as raw unsigned ints."""
    a = zarr.open(str(path), mode="r")
    data = a[...]
    return data.view(np.dtype(f"<u{data.dtype.itemsize}"))


def expected_semantic(src, key, shape):
    """The source array read by zarr-python, padded with zero rows or
    truncated to ``shape`` (vocab semantics)."""
    a = zarr_raw(os.path.join(src, key))
    if list(a.shape) == list(shape):
        return a
    out = np.zeros(shape, dtype=a.dtype)
    rows = min(shape[0], a.shape[0])
    out[:rows] = a[:rows]
    return out


@pytest.fixture(params=list(zip(SOURCES, SOURCE_IDS)), ids=SOURCE_IDS)
def src(request, sample):
    (tp, prefix), _ = request.param
    return sample(tp, prefix=prefix)


# ------------------------------------------------------ oracle self-checks
# These need no daemon: they check the oracle against zarr-python and the
# identity view.

def test_oracle_source_reads_match_zarr(src):
    exp = ExpectedView(src, 1)
    for key in exp.array_keys():
        got = read_source_array(str(src), key)
        want = zarr_raw(src / key)
        assert got.dtype.itemsize == want.dtype.itemsize, key
        assert np.array_equal(got, want), key


@pytest.mark.parametrize("tp", TARGETS)
def test_oracle_view_readable_by_zarr(src, tp, tmp_path):
    """Materialise the oracle's view on disk; zarr-python must read every
    array as the source array (with vocab semantics), and at the source's
    own TP the view must equal the source byte for byte."""
    exp = ExpectedView(src, tp)
    out = tmp_path / "view"
    for rel, data in exp.items():
        p = out / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    for key in exp.array_keys():
        va = exp.view_array(key)
        meta = json.loads((out / key / ".zarray").read_bytes())
        assert meta["shape"] == va.shape and meta["chunks"] == va.chunks
        assert np.array_equal(zarr_raw(out / key),
                              expected_semantic(src, key, va.shape)), key
    if exp.src_tp == tp:
        files, _ = walk(src)
        assert files == set(exp.files)
        for rel in exp.files:
            assert (out / rel).read_bytes() == (src / rel).read_bytes(), rel


def test_oracle_vocab_padding(sample, tmp_path):
    src = sample(1, vocab=1100)       # padded to 1152 at tp 1
    exp = ExpectedView(src, 8, vocab_size=1100)
    va = exp.view_array("embedding.word_embeddings.weight")
    assert va.shape[0] == 2048 and va.chunks[0] == 256
    full = exp.full_array("embedding.word_embeddings.weight")
    stored = read_source_array(str(src), "embedding.word_embeddings.weight")
    assert np.array_equal(full[:1152], stored)
    assert not full[1152:].any() and not full[1100:1152].any()


# ------------------------------------------------------------ live mounts

@pytest.mark.parametrize("tp", TARGETS)
def test_every_file(src, tp, mount):
    exp = ExpectedView(src, tp)
    m = mount(src, [f"tp={tp}"])
    assert_tree_equals_oracle(m.mnt, exp)


@pytest.mark.parametrize("tp", TARGETS)
def test_zarr_reads_view(src, tp, mount):
    exp = ExpectedView(src, tp)
    m = mount(src, [f"tp={tp}"])
    for key in exp.array_keys():
        va = exp.view_array(key)
        z = zarr.open(str(m.mnt / key), mode="r")
        assert list(z.shape) == va.shape and list(z.chunks) == va.chunks, key
        assert np.array_equal(zarr_raw(m.mnt / key),
                              expected_semantic(src, key, va.shape)), key


@pytest.mark.parametrize("tp", [1, 8])
def test_cp_r(src, tp, mount, tmp_path):
    exp = ExpectedView(src, tp)
    m = mount(src, [f"tp={tp}"])
    dst = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(m.mnt), str(dst)], check=True,
                   timeout=120)
    assert_tree_equals_oracle(dst, exp)


def test_copies_that_keep_xattrs(src, mount, tmp_path):
    """cp -a and shutil.copytree copy every listed xattr; the (large)
    sources xattr must not be listed, or they fail with ENOSPC."""
    exp = ExpectedView(src, 8)
    m = mount(src, ["tp=8"])
    shutil.copytree(m.mnt, tmp_path / "py")
    assert_tree_equals_oracle(tmp_path / "py", exp)
    subprocess.run(["cp", "-a", str(m.mnt), str(tmp_path / "cpa")],
                   check=True, timeout=120)
    assert_tree_equals_oracle(tmp_path / "cpa", exp)


@pytest.mark.parametrize("tp", [2, 8])
def test_parallel_random_pread(src, tp, mount):
    expected = expected_view(src, tp)
    names = sorted(expected)
    m = mount(src, [f"tp={tp}"])
    errors = []

    def worker(seed):
        rng = random.Random(seed)
        fds = {}
        try:
            for _ in range(150):
                rel = rng.choice(names)
                want = expected[rel]
                size = len(want)
                off = rng.randrange(0, size + 2)
                length = rng.choice([1, 7, 4096, 65536, 1 << 20,
                                     rng.randrange(1, size + 2)])
                if rel not in fds:
                    fds[rel] = os.open(os.path.join(m.mnt, rel), os.O_RDONLY)
                got = os.pread(fds[rel], length, off)
                if got != want[off:off + length]:
                    errors.append(f"{rel} off={off} len={length}: got "
                                  f"{len(got)} bytes, differ")
                    return
        except Exception as e:  # report in the main thread
            errors.append(f"{type(e).__name__}: {e}")
        finally:
            for fd in fds.values():
                os.close(fd)

    threads = [threading.Thread(target=worker, args=(1000 + i,))
               for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]


# ------------------------------------------------------------------ vocab

@pytest.mark.parametrize("vocab,divisor", [(1000, 8), (1100, 128)],
                         ids=["V1000-div8", "V1100-div128"])
@pytest.mark.parametrize("src_tp,tp", [(1, 8), (8, 1)],
                         ids=["grow-1to8", "shrink-8to1"])
def test_vocab_repad(sample, mount, vocab, divisor, src_tp, tp):
    src = sample(src_tp, vocab=vocab, divisor=divisor)
    exp = ExpectedView(src, tp, vocab_size=vocab, vocab_divisor=divisor)
    m = mount(src, [f"tp={tp}", f"vocab_size={vocab}",
                    f"vocab_divisor={divisor}"])
    assert_tree_equals_oracle(m.mnt, exp)
    key = "embedding.word_embeddings.weight"
    ps = exp.arrays[key].src.shape[0]
    pv = exp.arrays[key].shape[0]
    assert (pv > ps) if src_tp < tp else (pv < ps), (ps, pv)
    for k in (key, "output_layer.weight",
              "optimizer.state.exp_avg." + key):
        view = zarr_raw(m.mnt / k)
        stored = zarr_raw(src / k)
        assert view.shape[0] == pv
        # every real row survives, padding is zero
        assert np.array_equal(view[:vocab], stored[:vocab]), k
        assert not view[vocab:].any(), k


def test_vocab_default_divisor(sample, mount):
    """-o vocab_size=1000 with the default divisor 128: 1024 rows at both
    tp 1 and tp 8, but re-chunked."""
    src = sample(1)
    exp = ExpectedView(src, 8, vocab_size=1000)
    m = mount(src, ["tp=8", "vocab_size=1000"])
    assert_tree_equals_oracle(m.mnt, exp)


# ------------------------------------------------------- stats and xattrs

STATS_KEYS = {"bytes_served", "source_bytes_read", "cache_hits",
              "cache_misses", "cache_bytes", "executor"}


def read_stats(mnt):
    with open(os.path.join(mnt, ".reshardfs", "stats"), "rb") as f:
        return json.loads(f.read())


def test_stats(sample, mount):
    src = sample(2)
    exp = ExpectedView(src, 8)
    m = mount(src, ["tp=8"])
    assert ".reshardfs" not in os.listdir(m.mnt)
    assert stat.S_ISDIR(os.stat(m.mnt / ".reshardfs").st_mode)
    meta_bytes = sum(exp.size(r) for r in exp.files
                     if not exp._kinds[r][0] == "chunk")
    before = read_stats(m.mnt)
    assert STATS_KEYS <= set(before), sorted(before)
    # mounting reads metadata only
    assert before["source_bytes_read"] <= meta_bytes, before
    total = 0
    for rel in exp.files:
        total += len(read_all(m.mnt / rel))
    after = read_stats(m.mnt)
    assert bytes_delivered(after) > 0
    assert bytes_delivered(after) >= total, (after, total)
    small = meta_bytes + 65536
    assert after["source_bytes_read"] <= 1.01 * bytes_delivered(after) + \
        small, after


def _xattr_paths(value):
    """Source paths named by the xattr: a JSON list of paths, or one line per
    source run whose first field is the path (further fields, such as byte
    offsets and lengths, are the daemon's business)."""
    text = value.decode()
    try:
        v = json.loads(text)
        if isinstance(v, list):
            return set(v)
    except ValueError:
        pass
    return {ln.split()[0] for ln in text.replace("\0", "\n").splitlines()
            if ln.strip()}


@pytest.mark.parametrize("src_tp,tp,rel", [
    (1, 2, "decoder.layers.self_attention.linear_qkv.weight/2.1.0"),
    (2, 1, "decoder.layers.mlp.linear_fc2.weight/3.0.0"),
    (2, 8, "decoder.layers.mlp.linear_fc1.weight/1.9.0"),
    (1, 4, "embedding.word_embeddings.weight/3.0"),
])
def test_xattr_sources(sample, mount, src_tp, tp, rel):
    src = sample(src_tp)
    exp = ExpectedView(src, tp)
    want = set(exp.source_chunks(rel))
    assert want
    m = mount(src, [f"tp={tp}"])
    got = _xattr_paths(os.getxattr(m.mnt / rel, "user.reshardfs.sources"))
    assert got == want, (got, want)


@pytest.mark.parametrize("opts", [["cache_size=1M"],
                                  ["cache_size=1M", "cache_compress=lz4"]],
                         ids=["small-cache", "small-cache-lz4"])
def test_small_cache(sample, mount, opts):
    """A cache far smaller than the data still serves every byte right."""
    src = sample(1)
    exp = ExpectedView(src, 8)
    m = mount(src, ["tp=8"] + opts)
    assert_tree_equals_oracle(m.mnt, exp)
