#!/usr/bin/env python3
"""Measurement library of the benchmark suite (scripts/bench).

Plain functions, nothing runs at import (heavy modules - zarr, the oracle -
are imported on first use).  Works under .venv-mcore (numpy 1.26, zarr 2.18,
torch) and under .venv (numpy 2, zarr 2, ml_dtypes).

* run_pool(readers, tasks, fn)      time fn over tasks in forked worker
                                    processes: wall, bytes, rchar, CPU, RSS
* read_file(path)                   task: read a file whole (os.readv, 1 MiB)
* zarr_slice((dir, box, itemsize))  task: zarr-python arr[box], as
                                    Megatron-core's zarr loader does
* rank_boxes(src, tp)               each target rank's boxes of every array
* rank_tasks(root, src, tp, r)      zarr_slice tasks of rank r under root
* rank_files(dir, tp, r)            the view files rank r reads
* numpy_convert(src, tp, out)       offline numpy converter (load all, then
                                    write rank by rank), byte-identical to
                                    the view
* Mount(bin, src, mnt, opts)        mount a view, strict unmount, stats
* selftest(bin_path)                everything above against the daemon
                                    and the numpy oracle

    .venv-mcore/bin/python scripts/bench_lib.py --selftest [--bin B] [--dir D]
"""

import contextlib
import itertools
import json
import multiprocessing as mp
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
BUF_SIZE = 1 << 20

__all__ = [
    "BenchError", "TaskError", "run_pool", "task_size", "read_file",
    "zarr_slice", "zarr_read", "zarr_open", "bf16_mode", "clear_zarr_cache",
    "rank_boxes", "rank_tasks", "rank_files", "numpy_convert", "Mount",
    "is_mounted", "list_files", "drop_caches", "proc_io", "proc_status",
    "expected_view", "selftest",
]


class BenchError(RuntimeError):
    """A measurement could not be made (a worker failed or died, a mount
    failed, a result is inconsistent).  Never swallow it into a number."""


class TaskError(BenchError):
    """fn(task) raised in a worker; the message holds the task, the error
    and the worker's traceback."""


# ---------------------------------------------------------------------------
# /proc helpers

def _read_proc(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 65536)
    finally:
        os.close(fd)


def proc_io(pid="self"):
    """/proc/PID/io as a dict of ints (rchar, wchar, syscr, syscw,
    read_bytes, write_bytes, cancelled_write_bytes)."""
    out = {}
    for line in _read_proc(f"/proc/{pid}/io").split(b"\n"):
        if b":" in line:
            k, v = line.split(b":", 1)
            out[k.decode()] = int(v)
    return out


def _rchar_snap():
    """(rchar, bytes this read of /proc/self/io returned).  The kernel adds
    a read's bytes to rchar after the read, so the next snapshot includes
    this one's own bytes: callers subtract them."""
    data = _read_proc("/proc/self/io")
    for line in data.split(b"\n"):
        if line.startswith(b"rchar:"):
            return int(line.split()[1]), len(data)
    raise BenchError("/proc/self/io has no rchar line")


def proc_status(field, pid="self"):
    """A kB field of /proc/PID/status (VmRSS, VmHWM, ...) in bytes, or
    None."""
    try:
        data = _read_proc(f"/proc/{pid}/status")
    except OSError:
        return None
    key = field.encode() + b":"
    for line in data.split(b"\n"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    return None


def _reset_hwm():
    """Reset this process's VmHWM to its current RSS (Linux >= 4.0).
    Returns False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _cpu_s(ru):
    return ru.ru_utime + ru.ru_stime


# ---------------------------------------------------------------------------
# worker pool

_POOL_FN = None      # the fn of the pool being built; inherited by fork
_WORKER = {}         # per-worker state (set by _init_worker)


def _init_worker():
    _WORKER.clear()
    _WORKER["pid"] = os.getpid()
    _WORKER["base_rss"] = proc_status("VmRSS") or 0
    _ARRAYS.clear()


def _warm(_):
    time.sleep(0.02)  # long enough that every worker takes one
    return os.getpid(), _WORKER.get("base_rss", 0)


def _measured(task):
    fn = _POOL_FN
    r0, n0 = _rchar_snap()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    try:
        got = fn(task)
    except BaseException as e:  # noqa: BLE001 - re-raised with context
        raise TaskError(
            f"{getattr(fn, '__name__', fn)}({task!r}) failed in worker "
            f"{os.getpid()}: {type(e).__name__}: {e}\n"
            f"{traceback.format_exc()}") from None
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    r1, _ = _rchar_snap()
    if isinstance(got, bool) or not isinstance(got, (int, np.integer)):
        raise TaskError(f"{getattr(fn, '__name__', fn)}({task!r}) returned "
                        f"{got!r}, not a byte count")
    return (os.getpid(), int(got), r1 - r0 - n0, _cpu_s(ru1) - _cpu_s(ru0),
            ru1.ru_maxrss * 1024)


def task_size(task):
    """Size of a task for largest-first dispatch, or None when unknown:
    (path, size) pairs give size; zarr_slice tasks (dir, box, itemsize)
    give the box's bytes; anything else None (plain paths are not
    stat'ed)."""
    if isinstance(task, (tuple, list)):
        if (len(task) == 2 and isinstance(task[0], (str, os.PathLike))
                and isinstance(task[1], (int, np.integer))):
            return int(task[1])
        if len(task) == 3 and isinstance(task[1], (tuple, list)):
            n = int(task[2])
            for lo, hi in task[1]:
                n *= int(hi) - int(lo)
            return n
    size = getattr(task, "size", None)
    return int(size) if isinstance(size, (int, np.integer)) else None


def run_pool(readers, tasks, fn, sizes=None, timeout=None):
    """Run ``fn(task)`` for every task on ``readers`` forked worker
    processes and measure it.

    ``fn`` returns the number of useful bytes it produced.  It may be any
    callable (it reaches the workers by fork, not by pickling); tasks must
    pickle.  If ``fn`` has a ``prepare`` attribute it is called here first
    (e.g. zarr_slice imports zarr), so no worker pays imports on the clock.

    The pool is created and warmed with a no-op per worker before the clock
    starts; tasks are dispatched largest first when every task has a size
    (``sizes``: a list or a function task -> size; default task_size), else
    in the given order; imap_unordered, chunksize 1.

    Each task is measured in its worker: bytes = fn's return value, rchar =
    the /proc/self/io rchar delta (bytes returned by read syscalls of that
    process: page-cache hits count, mmap reads do not), cpu = user+sys
    getrusage delta (all threads of the worker), max_rss = the worker's
    ru_maxrss.  Pipe traffic of the pool itself is outside these windows.

    Returns {"wall_s", "bytes", "rchar", "cpu_s", "max_rss", "base_rss",
    "tasks", "workers"}: sums of bytes/rchar/cpu over tasks, max_rss the
    largest worker peak RSS in bytes (it includes what the worker inherited
    from this process, base_rss being the largest worker RSS right after
    start).  A task that raises (TaskError, with the task and the worker's
    traceback) or a worker that dies (BenchError) aborts the run: no
    numbers are returned for a failed run.  ``timeout`` (s) bounds the
    whole run.
    """
    global _POOL_FN
    readers = int(readers)
    if readers < 1:
        raise ValueError("readers must be >= 1")
    tasks = list(tasks)
    if sizes is None:
        sizes = task_size
    if callable(sizes):
        sz = [sizes(t) for t in tasks]
    else:
        sz = list(sizes)
        if len(sz) != len(tasks):
            raise ValueError("sizes and tasks differ in length")
    if tasks and all(s is not None for s in sz):
        order = sorted(range(len(tasks)), key=lambda i: -sz[i])
        tasks = [tasks[i] for i in order]
    prep = getattr(fn, "prepare", None)
    if prep is not None:
        prep()
    res = {"wall_s": 0.0, "bytes": 0, "rchar": 0, "cpu_s": 0.0,
           "max_rss": 0, "base_rss": 0, "tasks": len(tasks), "workers": 0}
    _POOL_FN = fn
    pool = None
    try:
        pool = mp.get_context("fork").Pool(readers, initializer=_init_worker)
        seen = {}
        for _ in range(5):
            for pid, base in pool.map(_warm, range(readers), chunksize=1):
                seen[pid] = base
            if len(seen) >= readers:
                break
        procs = list(pool._pool)  # noqa: SLF001 - to notice dead workers
        res["base_rss"] = max(seen.values(), default=0)
        out = []
        t0 = time.monotonic()
        it = pool.imap_unordered(_measured, tasks, chunksize=1)
        while len(out) < len(tasks):
            try:
                out.append(it.next(timeout=0.5))
            except mp.TimeoutError:
                dead = [p for p in procs if p.exitcode is not None]
                if dead:
                    raise BenchError(
                        f"worker {dead[0].pid} died (exit code "
                        f"{dead[0].exitcode}) while running "
                        f"{getattr(fn, '__name__', fn)}") from None
                if timeout is not None and time.monotonic() - t0 > timeout:
                    raise BenchError(f"run_pool: timed out after "
                                     f"{timeout} s") from None
        res["wall_s"] = time.monotonic() - t0
    finally:
        _POOL_FN = None
        if pool is not None:
            pool.terminate()
            pool.join()
    pids = set()
    for pid, nbytes, rchar, cpu, rss in out:
        pids.add(pid)
        res["bytes"] += nbytes
        res["rchar"] += rchar
        res["cpu_s"] += cpu
        res["max_rss"] = max(res["max_rss"], rss)
    res["workers"] = len(pids)
    return res


# ---------------------------------------------------------------------------
# tasks

_BUF = None


def read_file(path):
    """Task: read a file whole with os.readv into a reused 1 MiB buffer
    (one per process).  ``path`` may also be a (path, size) pair.
    Returns the bytes read."""
    global _BUF
    if isinstance(path, (tuple, list)):
        path = path[0]
    if _BUF is None:
        _BUF = memoryview(bytearray(BUF_SIZE))
    n = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        while True:
            k = os.readv(fd, [_BUF])
            if k == 0:
                return n
            n += k
    finally:
        os.close(fd)


_ZARR = None     # (zarr module, bf16 mode, store class or None)
_ARRAYS = {}     # array dir -> opened zarr.Array (per process)


def _zarr():
    """Import zarr once and make bfloat16 arrays readable.

    zarr 2.18 resolves a .zarray "dtype" with np.dtype(), and numpy knows
    "bfloat16" only once something registers it: Megatron-core does
    ``import tensorstore`` (its zarr strategy), the tests import ml_dtypes.
    .venv-mcore has neither, so there even Megatron's own zarr loader fails
    on bf16 arrays ("MetadataError: error decoding metadata").  We try
    ml_dtypes, then tensorstore; failing both, the array is opened through
    a DirectoryStore that shows "bfloat16" as "<u2" (the same bytes, the
    same chunk reads and copies; elements come back as uint16 bit
    patterns)."""
    global _ZARR
    if _ZARR is not None:
        return _ZARR
    mode = "native"
    try:
        np.dtype("bfloat16")
    except TypeError:
        mode = "u2"
        for mod in ("ml_dtypes", "tensorstore"):
            try:
                __import__(mod)
                np.dtype("bfloat16")
                mode = mod
                break
            except Exception:  # noqa: BLE001 - optional modules
                continue
    import zarr
    store_cls = None
    if mode == "u2":
        class Bf16AsU2Store(zarr.storage.DirectoryStore):
            """DirectoryStore whose .zarray shows dtype bfloat16 as <u2."""

            def __getitem__(self, key):
                v = super().__getitem__(key)
                if key == ".zarray" or key.endswith("/.zarray"):
                    meta = json.loads(v)
                    if meta.get("dtype") == "bfloat16":
                        meta["dtype"] = "<u2"
                        v = json.dumps(meta).encode()
                return v
        store_cls = Bf16AsU2Store
    _ZARR = (zarr, mode, store_cls)
    return _ZARR


def bf16_mode():
    """How bfloat16 zarr arrays are read here: "native" (numpy already knew
    it), "ml_dtypes" or "tensorstore" (imported to register it), or "u2"
    (read as uint16 bit patterns through a store shim)."""
    return _zarr()[1]


def zarr_open(array_dir):
    """zarr.open_array(array_dir, mode="r"), cached per process."""
    arr = _ARRAYS.get(array_dir)
    if arr is None:
        zarr, mode, store_cls = _zarr()
        if store_cls is None:
            arr = zarr.open_array(str(array_dir), mode="r")
        else:
            arr = zarr.open_array(store=store_cls(str(array_dir)), mode="r")
        _ARRAYS[array_dir] = arr
    return arr


def clear_zarr_cache():
    """Forget the arrays zarr_open has opened in this process."""
    _ARRAYS.clear()


def zarr_read(array_dir, box):
    """arr[box] with zarr-python; box = ((start, stop), ...) per dim."""
    arr = zarr_open(array_dir)
    return arr[tuple(slice(int(lo), int(hi)) for lo, hi in box)]


def zarr_slice(task):
    """Task: task = (array_dir, box, itemsize).  Opens the array with
    zarr-python (cached per worker) and reads ``arr[box]``, as
    Megatron-core's zarr strategy does for each sharded tensor of a rank.
    Returns the bytes of the result (checked against the box)."""
    array_dir, box, itemsize = task
    x = zarr_read(array_dir, box)
    want = int(itemsize)
    for lo, hi in box:
        want *= int(hi) - int(lo)
    if x.nbytes != want:
        raise BenchError(f"{array_dir}{list(box)}: zarr returned "
                         f"{x.nbytes} bytes, the box holds {want}")
    return int(x.nbytes)


zarr_slice.prepare = _zarr


# ---------------------------------------------------------------------------
# what each rank needs

def _oracle():
    p = str(REPO / "tests" / "mount")
    if p not in sys.path:
        sys.path.insert(0, p)
    import oracle
    return oracle


def expected_view(src_dir, view_tp, vocab_size=None, vocab_divisor=128,
                  src_tp=None):
    """The oracle's ExpectedView of ``src_dir`` at tp=view_tp."""
    return _oracle().ExpectedView(src_dir, view_tp, vocab_size=vocab_size,
                                  vocab_divisor=vocab_divisor, src_tp=src_tp)


def _split(ev, key):
    """(tp axis, number of view chunks along it) of a TP-split view array,
    or None for arrays that keep their stored grid."""
    kind, _, axis = _oracle().classify(key)
    va = ev.view_array(key)
    if kind is None or axis >= len(va.shape):
        return None
    return axis, va.grid[axis]


def _boxes(ev, view_tp, r, clip=True, per_layer=False):
    out = []
    for key in ev.array_keys():
        va = ev.view_array(key)
        sp = _split(ev, key)
        full = [(0, s) for s in va.shape]
        if sp is None:
            boxes = [full]
        else:
            axis, n = sp
            c = va.chunks[axis]
            boxes = []
            for j in range(r, n, view_tp):
                b = list(full)
                b[axis] = (j * c, min((j + 1) * c, va.shape[axis]))
                boxes.append(b)
        if clip:
            boxes = [[(lo, min(hi, s)) for (lo, hi), s in
                      zip(b, va.src.shape)] for b in boxes]
            boxes = [b for b in boxes if all(hi > lo for lo, hi in b)]
        if per_layer and _oracle().classify(key)[1] and va.shape:
            boxes = [[(l, l + 1)] + b[1:] for b in boxes
                     for l in range(b[0][0], b[0][1])]
        out += [(key, tuple(b)) for b in boxes]
    return out


def rank_boxes(src_dir, view_tp, clip=True, per_layer=False,
               vocab_size=None, vocab_divisor=128, src_tp=None, ranks=None):
    """What each rank of the tp=view_tp layout loads: a list over ranks r
    of [(array key, box)], box = ((start, stop), ...) per dim.

    From the oracle's ExpectedView: a TP-split array (column, row, vocab)
    gives rank r the view chunks with index j along its TP axis where
    j % view_tp == r - one box for most tensors, two for gated fc1
    (multiplier 2: chunks r and r+tp of the 2*tp grid); every other array
    (norms, replicated or unknown) is given whole to every rank.
    ``clip`` clips boxes to the stored shape (re-padded vocab rows past the
    source do not exist there; boxes left empty are dropped); clip=False
    gives the boxes in the view's shape.  ``per_layer`` splits boxes of
    layer-stacked arrays into one box per layer, which is how Megatron-core
    loads them (one ShardedTensor per layer).  ``ranks`` limits the ranks
    computed (the list is still indexed by rank; others are None)."""
    ev = expected_view(src_dir, view_tp, vocab_size, vocab_divisor, src_tp)
    want = range(view_tp) if ranks is None else set(ranks)
    return [_boxes(ev, view_tp, r, clip, per_layer) if r in want else None
            for r in range(view_tp)]


def rank_tasks(root, src_dir, view_tp, r, clip=True, per_layer=False,
               vocab_size=None, vocab_divisor=128, src_tp=None):
    """zarr_slice tasks (root/key, box, itemsize) of rank r: root is the
    source, a mounted view or a converted checkpoint."""
    ev = expected_view(src_dir, view_tp, vocab_size, vocab_divisor, src_tp)
    return [(os.path.join(str(root), key), box,
             ev.view_array(key).src.itemsize)
            for key, box in _boxes(ev, view_tp, r, clip, per_layer)]


def rank_files(view_dir_or_src, view_tp, r, vocab_size=None,
               vocab_divisor=128, src_tp=None):
    """Relative paths of the view files rank r of a tp=view_tp job reads:
    the chunk files inside its boxes (view grid, padding rows included) and
    every file that is not a chunk (metadata.json, common.pt, each
    .zarray/.zattrs, the ShardedObject files - all of them, rng_state of
    every stored rank included).  Works from the source (the names are
    those of the view) or from a mounted view or converted checkpoint at
    tp=view_tp (its own grid)."""
    ev = expected_view(view_dir_or_src, view_tp, vocab_size, vocab_divisor,
                       src_tp)
    files = set(ev.passthrough)
    files.update(f"{k}/.zarray" for k in ev.array_keys())
    for key, box in _boxes(ev, view_tp, r, clip=False):
        va = ev.view_array(key)
        ranges = [range(lo // c, -(-hi // c))
                  for (lo, hi), c in zip(box, va.chunks)]
        for idx in itertools.product(*ranges):
            files.add(f"{key}/" + (".".join(map(str, idx)) if idx else "0"))
    return sorted(files)


# ---------------------------------------------------------------------------
# offline converter

def _write_file(path, data, fsync):
    mv = memoryview(data).cast("B")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        while mv:
            mv = mv[os.write(fd, mv):]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return len(memoryview(data).cast("B"))


def _load_array(sa):
    """The stored array of SourceArray ``sa``: np.fromfile per chunk file
    into one buffer of the padded grid (storage dtype as raw ints)."""
    padded = [g * c for g, c in zip(sa.grid, sa.chunks)]
    full = np.empty(padded, dtype=sa.raw)
    n = int(np.prod(sa.chunks))
    for idx in itertools.product(*[range(g) for g in sa.grid]):
        name = ".".join(map(str, idx)) if idx else "0"
        data = np.fromfile(os.path.join(sa.dir, name), dtype=sa.raw)
        if data.size != n:
            raise BenchError(f"{sa.key}/{name}: {data.nbytes} bytes, "
                             f"expected {sa.chunk_bytes}")
        full[tuple(slice(i * c, (i + 1) * c)
                   for i, c in zip(idx, sa.chunks))] = data.reshape(
                       sa.chunks)
    return full[tuple(slice(0, s) for s in sa.shape)]


def _view_chunk(full, va, idx):
    """Bytes of view chunk idx: the box of the view array, rows past the
    stored array zero, edge chunks zero-padded (as the view serves it)."""
    lo = [i * c for i, c in zip(idx, va.chunks)]
    hi = [min((i + 1) * c, s, t) for i, c, s, t in
          zip(idx, va.chunks, va.shape, full.shape)]
    box = tuple(slice(a, max(a, b)) for a, b in zip(lo, hi))
    piece = full[box]
    if list(piece.shape) != va.chunks:
        out = np.zeros(va.chunks, dtype=full.dtype)
        out[tuple(slice(0, n) for n in piece.shape)] = piece
        return out
    return np.ascontiguousarray(piece)


def numpy_convert(src_dir, view_tp, out_dir, on_rank_done=None, fsync=True,
                  vocab_size=None, vocab_divisor=128, src_tp=None,
                  reset_hwm=True):
    """Offline conversion with numpy, as Megatron's tools/checkpoint/convert
    does it: load everything, then write the new layout rank by rank.

    Phase 1 (load_s): scans the source's metadata (.zarray files), loads
    every array whole into memory (np.fromfile per stored chunk, assembled
    into one array) and every non-array file.  Phase 2: writes the
    tp=view_tp zarr checkpoint into ``out_dir`` (created; must not hold
    files) rank by rank, rank 0 first.  Rank r writes the chunk files of
    every TP-split array whose index along the TP axis is r mod view_tp
    (gated fc1: r and r+tp); rank 0 also writes the directories,
    metadata.json, common.pt, the ShardedObject files, every .zarray (the
    bytes the view shows: the oracle's rewritten .zarray) and the chunks of
    arrays that keep their grid.  The result is byte-identical to the
    reshardfs view (same file list, same bytes; selftest checks it).

    ``fsync`` (default True): every file is os.fsync'ed before it is
    closed, so rank r's files are durable when on_rank_done(r, t) is
    called, as a real converter's output must be (directories are not
    fsync'ed; on ext4/xfs a file's fsync commits its creation too).  With
    fsync=False the times are those of writes into the page cache.

    on_rank_done(r, t) is called after rank r's files are written, t =
    seconds since the start of the call.  Returns {"load_s", "rank_done_s"
    (list, same t), "total_s", "peak_rss" (VmHWM of this process during
    the call; it is reset at the start when reset_hwm and the kernel
    allows it, else it is the process's lifetime peak), "base_rss" (RSS at
    the start), "rchar", "cpu_s", "bytes_written", "files_written",
    "fsync"}."""
    t0 = time.monotonic()
    io0, n0 = _rchar_snap()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    hwm_ok = _reset_hwm() if reset_hwm else False
    base_rss = proc_status("VmRSS") or 0
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if any(out_dir.iterdir()):
        raise BenchError(f"numpy_convert: {out_dir} is not empty")

    # phase 1: everything into memory
    ev = expected_view(src_dir, view_tp, vocab_size, vocab_divisor, src_tp)
    keys = ev.array_keys()
    full = {k: _load_array(ev.view_array(k).src) for k in keys}
    other = {}
    for rel in ev.passthrough:
        with open(os.path.join(ev.root, rel), "rb") as f:
            other[rel] = f.read()
    load_s = time.monotonic() - t0

    # phase 2: rank by rank
    split = {k: _split(ev, k) for k in keys}
    done, nbytes, nfiles = [], 0, 0
    for r in range(view_tp):
        if r == 0:
            for d in ev.dirs:
                (out_dir / d).mkdir(parents=True, exist_ok=True)
            for rel, data in other.items():
                nbytes += _write_file(out_dir / rel, data, fsync)
                nfiles += 1
        for key in keys:
            va = ev.view_array(key)
            sp = split[key]
            if r == 0:
                nbytes += _write_file(out_dir / key / ".zarray",
                                      va.zarray_bytes, fsync)
                nfiles += 1
            if sp is None:
                if r != 0:
                    continue
                ranges = [range(g) for g in va.grid]
            else:
                axis, n = sp
                ranges = [range(g) for g in va.grid]
                ranges[axis] = range(r, n, view_tp)
            for idx in itertools.product(*ranges):
                name = ".".join(map(str, idx)) if idx else "0"
                nbytes += _write_file(out_dir / key / name,
                                      _view_chunk(full[key], va, idx), fsync)
                nfiles += 1
        t = time.monotonic() - t0
        done.append(t)
        if on_rank_done is not None:
            on_rank_done(r, t)
    total_s = time.monotonic() - t0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    io1, _ = _rchar_snap()
    peak = proc_status("VmHWM") if hwm_ok else ru1.ru_maxrss * 1024
    del full, other
    return {"load_s": load_s, "rank_done_s": done, "total_s": total_s,
            "peak_rss": peak, "base_rss": base_rss,
            "rchar": io1 - io0 - n0, "cpu_s": _cpu_s(ru1) - _cpu_s(ru0),
            "bytes_written": nbytes, "files_written": nfiles,
            "fsync": bool(fsync)}


# ---------------------------------------------------------------------------
# mounts and files

def is_mounted(mnt):
    """True when a filesystem is mounted exactly at ``mnt``."""
    mnt = os.path.realpath(mnt)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == mnt for line in f)


# The suite's sample model (scripts/bench, scripts/bench_first_byte).
SUITE_MODEL = dict(layers=4, hidden=1024, ffn=4096, heads=16, groups=4,
                   vocab=32000, divisor=128, seed=1)


def made_once(d, want, make):
    """Directory d, made by make(d) unless the marker file d.json next to
    it says it already holds `want` (a JSON-able description); kept for
    the next run."""
    d = Path(d)
    marker = d.with_name(d.name + ".json")
    if d.exists() and marker.exists() and \
            json.loads(marker.read_text()) == want:
        return d
    subprocess.run(["rm", "-rf", str(d)], check=True)
    make(d)
    marker.write_text(json.dumps(want))
    return d


def ensure_checkpoint(base, tp, model=SUITE_MODEL, log=print):
    """The sample checkpoint (scripts/make_sample_checkpoint.py) of
    `model` at `tp`, base/ckpt_tp<tp>, made once (made_once)."""
    sys.path.insert(0, str(REPO / "scripts"))
    import make_sample_checkpoint as msc

    def make(d):
        log(f"writing the tp={tp} checkpoint")
        msc.make_checkpoint(str(d), tp, fast=True, **model)
    return made_once(Path(base) / f"ckpt_tp{tp}", dict(model, tp=tp), make)


class Mount:
    """A reshardfs view mounted for the duration of a ``with`` block:

        with Mount(bin, src, mnt, "tp=8,cache_size=256M") as m:
            ... m.stats(), m.pid, m.status("VmHWM"), m.io() ...

    Runs ``bin -f SRC MNT -o OPTS``, waits for the mount (BenchError with
    the daemon's log if it fails or exits), and on exit unmounts with
    fusermount3 -u and waits for the daemon.  A failed unmount or a
    non-zero daemon exit raises BenchError (unless the block is already
    raising).  m.rc holds the daemon's exit code afterwards."""

    def __init__(self, binary, src, mnt, opts="", log=None, timeout=30):
        self.binary, self.src, self.mnt = str(binary), str(src), Path(mnt)
        self.opts, self.timeout = opts, timeout
        self.log = log
        self.proc = None
        self.rc = None

    def _log_text(self):
        try:
            return Path(self._logpath).read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def __enter__(self):
        self.mnt.mkdir(parents=True, exist_ok=True)
        if is_mounted(self.mnt):
            raise BenchError(f"{self.mnt} is already mounted")
        if self.log is None:
            fd, self._logpath = tempfile.mkstemp(prefix="reshardfs-",
                                                 suffix=".log")
            os.close(fd)
            self._tmplog = True
        else:
            self._logpath, self._tmplog = str(self.log), False
        cmd = [self.binary, "-f", self.src, str(self.mnt)]
        if self.opts:
            cmd += ["-o", self.opts]
        with open(self._logpath, "wb") as log:
            self.t_start = time.monotonic()
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log)
        deadline = time.monotonic() + self.timeout
        while not is_mounted(self.mnt):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                if self.proc.poll() is None:
                    self.proc.kill()
                self.proc.wait()
                log = self._log_text()
                if self._tmplog:
                    with contextlib.suppress(OSError):
                        os.unlink(self._logpath)
                raise BenchError(f"mount failed: {' '.join(cmd)}\n{log}")
            time.sleep(0.01)
        self.mount_s = time.monotonic() - self.t_start
        return self

    @property
    def pid(self):
        return self.proc.pid

    def stats(self):
        """The daemon's MNT/.reshardfs/stats counters."""
        with open(self.mnt / ".reshardfs" / "stats") as f:
            return json.load(f)

    def status(self, field):
        """A /proc/<daemon>/status kB field in bytes (VmRSS, VmHWM)."""
        return proc_status(field, self.proc.pid)

    def io(self):
        """/proc/<daemon>/io.  Note: spliced source reads may not show in
        rchar; prefer stats()["source_bytes_read"]."""
        return proc_io(self.proc.pid)

    def __exit__(self, exc_type, exc, tb):
        r = subprocess.run(["fusermount3", "-u", str(self.mnt)],
                           stderr=subprocess.PIPE, text=True)
        try:
            self.rc = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.rc = self.proc.wait()
        bad = r.returncode != 0 or self.rc != 0
        msg = (f"unmount of {self.mnt}: fusermount3 rc={r.returncode} "
               f"{r.stderr.strip()} daemon rc={self.rc}\n{self._log_text()}")
        if self._tmplog:
            with contextlib.suppress(OSError):
                os.unlink(self._logpath)
        if bad and exc_type is None:
            raise BenchError(msg)
        return False


def list_files(root):
    """[(path, size)] of every file under root (the view's hidden
    .reshardfs directory skipped), sorted by path."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != ".reshardfs")
        for f in filenames:
            p = os.path.join(dirpath, f)
            out.append((p, os.stat(p).st_size))
    return sorted(out)


def drop_caches():
    """sync, then drop the page cache (root only)."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


# ---------------------------------------------------------------------------
# self-test

TINY = dict(layers=2, hidden=256, ffn=512, heads=4, groups=2, vocab=1000)


class _Check:
    def __init__(self):
        self.n = 0

    def __call__(self, cond, what):
        if not cond:
            raise BenchError(f"selftest FAILED: {what}")
        self.n += 1


def _raw_bytes(x):
    return np.ascontiguousarray(x).tobytes()


def _die(_task):
    os._exit(3)


def selftest(bin_path=None, workdir=None, keep=False):
    """Make tiny checkpoints, mount views with the daemon, and check this
    module against the numpy oracle: numpy_convert byte for byte against
    the mounted view (every file), zarr_slice of every rank's boxes on the
    source, the view and the converted checkpoint against the oracle,
    rank_files against the view, run_pool's accounting and its error
    handling.  Prints one line per step and the converter's timings with
    and without fsync; raises BenchError on the first mismatch."""
    sys.path.insert(0, str(REPO / "scripts"))
    import make_sample_checkpoint as msc
    bin_path = str(bin_path or REPO / "build" / "reshardfs")
    if not os.access(bin_path, os.X_OK):
        raise BenchError(f"no daemon at {bin_path}")
    base = Path(workdir or tempfile.mkdtemp(prefix="bench_lib_"))
    base.mkdir(parents=True, exist_ok=True)
    ck = _Check()
    print(f"bench_lib selftest in {base}; bf16 via {bf16_mode()}",
          flush=True)
    try:
        src = base / "ck_tp2"
        msc.make_checkpoint(str(src), 2, **TINY)
        # run_pool on raw source reads
        files = list_files(src)
        total = sum(s for _, s in files)
        res = run_pool(2, files, read_file)
        ck(res["bytes"] == total, f"read_file bytes {res['bytes']} != {total}")
        ck(total <= res["rchar"] <= total + 4096 * len(files),
           f"rchar {res['rchar']} vs {total}")
        ck(res["workers"] == 2 and res["tasks"] == len(files), "workers")
        ck(res["max_rss"] > 0 and res["cpu_s"] >= 0, "rss/cpu")
        print(f"  run_pool read_file: {len(files)} files, {res['bytes']} B, "
              f"rchar {res['rchar']}, cpu {res['cpu_s']:.3f} s, "
              f"rss {res['max_rss'] >> 20} MiB (base "
              f"{res['base_rss'] >> 20}), {res['wall_s'] * 1e3:.1f} ms",
              flush=True)
        # errors propagate, dead workers are noticed
        for fn, task, what in ((read_file, str(src / "nope"), "nope"),
                               (_die, 1, "died")):
            try:
                run_pool(2, [task, str(files[0][0])], fn, timeout=60)
            except BenchError as e:
                ck(what in str(e), f"error message lacks {what!r}: {e}")
            else:
                ck(False, f"run_pool did not raise for {what}")
        print("  run_pool errors: a failing task and a dying worker raise",
              flush=True)

        scenarios = [(8, {}), (1, {}),
                     (4, {"vocab_size": 1000, "vocab_divisor": 300})]
        timings = []
        for tp, vk in scenarios:
            opts = f"tp={tp}" + "".join(f",{k}={v}" for k, v in vk.items())
            ev = expected_view(src, tp, **vk)
            mnt = base / f"mnt{tp}"
            conv = {}
            for fs in (True, False):
                out = base / f"conv{tp}_{'fsync' if fs else 'nofsync'}"
                seen = []
                conv[fs] = numpy_convert(
                    src, tp, out, fsync=fs,
                    on_rank_done=lambda r, t: seen.append((r, t)), **vk)
                ck([r for r, _ in seen] == list(range(tp)),
                   f"on_rank_done order {seen}")
                ck(conv[fs]["rank_done_s"] == [t for _, t in seen],
                   "rank_done_s")
                timings.append((tp, fs, conv[fs]))
            out = base / f"conv{tp}_fsync"
            other = base / f"conv{tp}_nofsync"
            with Mount(bin_path, src, mnt, opts) as m:
                vf = [os.path.relpath(p, mnt) for p, _ in list_files(mnt)]
                cf = [os.path.relpath(p, out) for p, _ in list_files(out)]
                ck(vf == cf == ev.files,
                   f"tp={tp}: file lists differ: view {len(vf)}, "
                   f"converted {len(cf)}, oracle {len(ev.files)}")
                for rel in vf:
                    vb = (mnt / rel).read_bytes()
                    ck(vb == (out / rel).read_bytes() ==
                       (other / rel).read_bytes(),
                       f"tp={tp}: {rel}: converted differs from the view")
                    ck(vb == ev.read(rel), f"tp={tp}: {rel}: view != oracle")
                # zarr_slice: every rank's boxes on view, source, converted
                nslices = 0
                for r in range(tp):
                    for key, box in _boxes(ev, tp, r, clip=True):
                        want = ev.full_array(key)[
                            tuple(slice(lo, hi) for lo, hi in box)]
                        item = ev.view_array(key).src.itemsize
                        for root in (mnt, src, out):
                            got = zarr_read(str(root / key), box)
                            ck(_raw_bytes(got) == _raw_bytes(want),
                               f"tp={tp} rank {r}: zarr {root}/{key}{box}")
                            ck(zarr_slice((str(root / key), box, item))
                               == want.nbytes, "zarr_slice bytes")
                            nslices += 1
                    clear_zarr_cache()
                # per-layer boxes cover the same bytes
                pl = rank_boxes(src, tp, per_layer=True, ranks=[0], **vk)[0]
                whole = rank_boxes(src, tp, ranks=[0], **vk)[0]
                vol = lambda bs: sum(int(np.prod([hi - lo for lo, hi in b]))
                                     for _, b in bs)  # noqa: E731
                ck(vol(pl) == vol(whole) and len(pl) > len(whole),
                   "per_layer boxes")
                # run_pool with zarr_slice over rank 0 through the view
                t0 = rank_tasks(mnt, src, tp, 0, **vk)
                res = run_pool(2, t0, zarr_slice)
                ck(res["bytes"] == sum(task_size(t) for t in t0),
                   "zarr_slice pool bytes")
                ck(res["rchar"] >= res["bytes"],
                   f"zarr rchar {res['rchar']} < {res['bytes']}")
                # rank_files: from the source and from the view agree,
                # and every rank-0 box lies in rank 0's files
                rf = rank_files(src, tp, 0, **vk)
                ck(rf == rank_files(mnt, tp, 0), f"tp={tp}: rank_files "
                   "from source and from view differ")
                ck(set(rf) <= set(vf), "rank_files not in the view")
                union = set()
                for r in range(tp):
                    union |= set(rank_files(src, tp, r, **vk))
                ck(union == set(vf), f"tp={tp}: ranks' files do not "
                   "cover the view")
                res_f = run_pool(2, [str(mnt / f) for f in rf], read_file)
                want_b = sum(ev.size(f) for f in rf)
                ck(res_f["bytes"] == want_b, "rank 0 file bytes")
                st = m.stats()
            print(f"  tp 2->{tp} {opts}: {len(vf)} files = view = oracle "
                  f"(fsync and not); {nslices} zarr slices match; rank 0 "
                  f"reads {len(rf)} files / {want_b} B of "
                  f"{ev.total_bytes()} B; rank 0 zarr_slice via view: "
                  f"{res['bytes']} B, rchar {res['rchar']}; daemon "
                  f"served {st.get('bytes_served')} B", flush=True)
        print("  converter (tiny checkpoint, 2 cores shared):", flush=True)
        for tp, fs, c in timings:
            print(f"    tp 2->{tp:<2} fsync={'yes' if fs else 'no ':<3} "
                  f"load {c['load_s'] * 1e3:6.1f} ms, rank 0 done "
                  f"{c['rank_done_s'][0] * 1e3:6.1f} ms, total "
                  f"{c['total_s'] * 1e3:6.1f} ms, {c['files_written']} "
                  f"files, {c['bytes_written']} B, peak rss "
                  f"{c['peak_rss'] >> 20} MiB", flush=True)
        print(f"selftest: {ck.n} checks passed", flush=True)
        return ck.n
    finally:
        if not keep and workdir is None:
            shutil.rmtree(base, ignore_errors=True)


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--selftest", action="store_true",
                    help="check the library against the daemon and oracle")
    ap.add_argument("--bin", default=os.environ.get(
        "RESHARDFS_BIN", str(REPO / "build" / "reshardfs")))
    ap.add_argument("--dir", default=None,
                    help="work dir (kept); default a temporary one")
    a = ap.parse_args(argv)
    if not a.selftest:
        ap.print_help()
        return 2
    selftest(a.bin, a.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
