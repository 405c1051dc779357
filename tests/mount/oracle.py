"""Independent numpy model of what a reshardfs zarr view must contain.

This file is the executable spec the C daemon is tested against.  It shares
no code with the daemon, and it reads the source with nothing but ``json``
and ``np.fromfile`` (one call per stored chunk).

Semantics (docs/ARCHITECTURE.md, "Layout semantics"):

* Rules match the key after stripping an optional ``optimizer.state.<word>.``
  prefix and then an optional ``model.`` prefix.
* Layer-stacked: the stripped key starts with ``decoder.layers.`` followed by
  a non-digit; axis 0 is then the layer axis and TP axes count after it.
* column (TP axis 0): ``self_attention.linear_qkv.{weight,bias}``,
  ``mlp.linear_fc1.{weight,bias}``; row (TP axis 1):
  ``self_attention.linear_proj.weight``, ``mlp.linear_fc2.weight``; vocab
  (TP axis 0, re-padded): ``embedding.word_embeddings.weight``,
  ``output_layer.weight``; anything else keeps its stored grid.
* ``src_tp`` (unless given) is the smallest fragmentation on the TP axis over
  all split tensors.  A tensor's multiplier is ``m = frag / src_tp`` (2 for
  gated fc1) and its view fragmentation ``m * tp``.
* Vocab tensors: stored rows ``Ps = shape[0]``; view rows ``P' = Ps`` when no
  vocab size is given, else ``ceil(V / (div*tp)) * div*tp``.  Rows below
  ``min(Ps, P')`` are served as stored, rows at or past ``Ps`` are zeros.
* A changed array's ``.zarray`` is the stored dict with ``chunks`` (and
  ``shape`` for vocab) replaced, dumped with ``indent=4, sort_keys=True``.
  An array whose shape and chunks are unchanged is served byte-identical.
* Chunk ``i.j.k`` of the view grid is the raw C-order bytes of that box at
  full chunk size, edge chunks zero-padded.
* Every other file is served byte-identical; directories mirror the source.
"""

import itertools
import json
import os
import re

import numpy as np

__all__ = [
    "OracleError", "SourceArray", "ExpectedView", "expected_view",
    "classify", "strip_key", "read_source_array", "padded_vocab",
]

CHUNK_NAME = re.compile(r"^[0-9]+(\.[0-9]+)*$")

COLUMN = ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias",
          "mlp.linear_fc1.weight", "mlp.linear_fc1.bias")
ROW = ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight")
VOCAB = ("embedding.word_embeddings.weight", "output_layer.weight")


class OracleError(ValueError):
    """The source cannot be viewed at the requested layout; the daemon must
    refuse to mount it."""


def padded_vocab(vocab, divisor, tp):
    m = divisor * tp
    return -(-vocab // m) * m


def strip_key(key):
    m = re.match(r"optimizer\.state\.[^.]+\.", key)
    if m:
        key = key[m.end():]
    if key.startswith("model."):
        key = key[len("model."):]
    return key


def _ends(s, names):
    return any(s == n or s.endswith("." + n) for n in names)


def classify(key):
    """Return (kind, stacked, tp_axis) where kind is 'column', 'row',
    'vocab' or None, and tp_axis the absolute axis TP splits (or None)."""
    s = strip_key(key)
    stacked = re.match(r"decoder\.layers\.[^0-9]", s) is not None
    base = 1 if stacked else 0
    if _ends(s, COLUMN):
        return "column", stacked, base
    if _ends(s, ROW):
        return "row", stacked, base + 1
    if _ends(s, VOCAB):
        return "vocab", stacked, base
    return None, stacked, None


def _itemsize(dtype):
    if dtype == "bfloat16":
        return 2
    if isinstance(dtype, list):  # structured dtypes: not in mcore output
        return np.dtype([tuple(f) for f in dtype]).itemsize
    return np.dtype(dtype).itemsize


def _raw_dtype(itemsize):
    return {1: np.uint8, 2: np.dtype("<u2"), 4: np.dtype("<u4"),
            8: np.dtype("<u8")}.get(itemsize, np.dtype(f"V{itemsize}"))


def _chunk_name(idx):
    return ".".join(str(i) for i in idx) if idx else "0"


def _grid(shape, chunks):
    return [-(-s // c) if s else 0 for s, c in zip(shape, chunks)]


class SourceArray:
    """One stored zarr array, metadata only until ``read()``."""

    def __init__(self, root, key):
        self.root = root
        self.key = key
        self.dir = os.path.join(root, key)
        path = os.path.join(self.dir, ".zarray")
        with open(path, "rb") as f:
            self.zarray_bytes = f.read()
        try:
            self.meta = json.loads(self.zarray_bytes)
        except ValueError as e:
            raise OracleError(f"{key}/.zarray: bad JSON: {e}")
        for field in ("shape", "chunks", "dtype"):
            if field not in self.meta:
                raise OracleError(f"{key}/.zarray: missing {field!r}")
        self.shape = [int(s) for s in self.meta["shape"]]
        self.chunks = [int(c) for c in self.meta["chunks"]]
        if (len(self.shape) != len(self.chunks) or
                any(s < 0 for s in self.shape) or
                any(c <= 0 for c in self.chunks)):
            raise OracleError(f"{key}/.zarray: bad shape/chunks")
        if self.meta.get("compressor") is not None or self.meta.get("filters"):
            raise OracleError(f"{key}/.zarray: compressed arrays unsupported")
        if self.meta.get("order", "C") != "C":
            raise OracleError(f"{key}/.zarray: order must be C")
        try:
            self.itemsize = _itemsize(self.meta["dtype"])
        except (TypeError, ValueError) as e:
            raise OracleError(f"{key}/.zarray: bad dtype: {e}")
        self.raw = _raw_dtype(self.itemsize)
        self.grid = _grid(self.shape, self.chunks)
        self.chunk_bytes = int(np.prod(self.chunks)) * self.itemsize

    def chunk_names(self):
        return [_chunk_name(idx) for idx in
                itertools.product(*[range(g) for g in self.grid])]

    def read(self):
        """Assemble the full array (storage dtype as raw unsigned ints of the
        same width) from its chunk files."""
        padded = [g * c for g, c in zip(self.grid, self.chunks)]
        full = np.zeros(padded, dtype=self.raw)
        n = int(np.prod(self.chunks))
        for idx in itertools.product(*[range(g) for g in self.grid]):
            path = os.path.join(self.dir, _chunk_name(idx))
            if not os.path.exists(path):
                raise OracleError(f"{self.key}/{_chunk_name(idx)}: missing")
            data = np.fromfile(path, dtype=self.raw)
            if data.size != n or os.path.getsize(path) != self.chunk_bytes:
                raise OracleError(f"{self.key}/{_chunk_name(idx)}: size "
                                  f"{os.path.getsize(path)}, expected "
                                  f"{self.chunk_bytes}")
            box = tuple(slice(i * c, (i + 1) * c)
                        for i, c in zip(idx, self.chunks))
            full[box] = data.reshape(self.chunks)
        return full[tuple(slice(0, s) for s in self.shape)]


def read_source_array(root, key):
    """Convenience: the stored array ``key`` as raw unsigned ints."""
    return SourceArray(root, key).read()


class _ViewArray:
    def __init__(self, src, shape, chunks):
        self.src = src
        self.shape = list(shape)
        self.chunks = list(chunks)
        self.changed = (self.shape != src.shape or self.chunks != src.chunks)
        if self.changed:
            meta = dict(src.meta)
            meta["shape"] = self.shape
            meta["chunks"] = self.chunks
            self.zarray_bytes = json.dumps(meta, indent=4,
                                           sort_keys=True).encode()
        else:
            self.zarray_bytes = src.zarray_bytes
        self.grid = _grid(self.shape, self.chunks)
        self.chunk_bytes = int(np.prod(self.chunks)) * src.itemsize

    def chunk_names(self):
        return [_chunk_name(idx) for idx in
                itertools.product(*[range(g) for g in self.grid])]

    def full(self):
        """The view's logical array (raw ints) with vocab semantics."""
        a = self.src.read()
        if self.shape == self.src.shape:
            return a
        out = np.zeros(self.shape, dtype=a.dtype)
        rows = min(self.shape[0], self.src.shape[0])
        out[:rows] = a[:rows]
        return out

    def source_chunks(self, name):
        """Relative paths of the stored chunk files that the view chunk
        ``name`` reads (rows past the stored array read none)."""
        idx = [int(x) for x in name.split(".")]
        lo = [i * c for i, c in zip(idx, self.chunks)]
        hi = [min((i + 1) * c, s) for i, c, s in
              zip(idx, self.chunks, self.shape)]
        hi = [min(h, s) for h, s in zip(hi, self.src.shape)]
        if any(h <= l for l, h in zip(lo, hi)):
            return []
        ranges = [range(l // c, -(-h // c)) for l, h, c in
                  zip(lo, hi, self.src.chunks)]
        return [f"{self.src.key}/{_chunk_name(i)}"
                for i in itertools.product(*ranges)]


class ExpectedView:
    """Lazy model of the view: ``files`` (sorted relpaths), ``dirs``,
    ``size(rel)`` without reading tensor data, ``read(rel)`` -> bytes.
    The most recently assembled array is kept, so reading the files of one
    array in a row assembles it once."""

    def __init__(self, src_dir, tp, vocab_size=None, vocab_divisor=128,
                 src_tp=None):
        self.root = os.path.abspath(src_dir)
        self.tp = int(tp)
        if self.tp < 1:
            raise OracleError(f"tp={tp}: must be >= 1")
        if not os.path.isfile(os.path.join(self.root, "metadata.json")):
            raise OracleError(f"{src_dir}: not a dist checkpoint "
                              "(no metadata.json)")
        self.arrays = {}      # key -> _ViewArray
        self.passthrough = []  # relpaths served byte-identical
        self.dirs = []
        src_arrays = {}
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames.sort()
            rel = os.path.relpath(dirpath, self.root)
            if rel != ".":
                self.dirs.append(rel)
            if ".zarray" in filenames and rel != ".":
                src_arrays[rel] = SourceArray(self.root, rel)
                for f in filenames:
                    if f != ".zarray" and not CHUNK_NAME.match(f):
                        self.passthrough.append(os.path.join(rel, f))
                continue
            for f in filenames:
                self.passthrough.append(
                    f if rel == "." else os.path.join(rel, f))

        # TP axis fragmentation of every split tensor
        frags = {}
        for key, a in src_arrays.items():
            kind, _, axis = classify(key)
            if kind is None or axis >= len(a.shape) or a.shape[axis] == 0:
                continue   # an empty axis splits into anything: kept
            s, c = a.shape[axis], a.chunks[axis]
            if s % c:
                raise OracleError(f"{key}: axis {axis}: size {s} is not a "
                                  f"multiple of chunk {c}")
            frags[key] = (kind, axis, s // c)
        if src_tp is None:
            if not frags:
                raise OracleError("no tensor-parallel tensors found")
            src_tp = min(f for _, _, f in frags.values())
        self.src_tp = int(src_tp)

        for key, a in src_arrays.items():
            if key not in frags:
                self.arrays[key] = _ViewArray(a, a.shape, a.chunks)
                continue
            kind, axis, frag = frags[key]
            if frag % self.src_tp:
                raise OracleError(f"{key}: axis {axis}: fragmentation {frag} "
                                  f"not a multiple of src_tp {self.src_tp}")
            m = frag // self.src_tp
            shape = list(a.shape)
            if kind == "vocab" and vocab_size is not None:
                shape[axis] = padded_vocab(int(vocab_size),
                                           int(vocab_divisor), self.tp)
                if shape[axis] < int(vocab_size):
                    raise OracleError("padding below vocab size")
            n = m * self.tp
            if shape[axis] % n:
                raise OracleError(f"{key}: axis {axis}: size {shape[axis]} "
                                  f"not divisible into {n} parts")
            chunks = list(a.chunks)
            chunks[axis] = shape[axis] // n
            self.arrays[key] = _ViewArray(a, shape, chunks)

        self._sizes = {}
        self._kinds = {}  # rel -> ("pass",) | ("zarray", key) | ("chunk", key, name)
        for rel in self.passthrough:
            self._kinds[rel] = ("pass",)
            self._sizes[rel] = os.path.getsize(os.path.join(self.root, rel))
        for key, va in self.arrays.items():
            rel = f"{key}/.zarray"
            self._kinds[rel] = ("zarray", key)
            self._sizes[rel] = len(va.zarray_bytes)
            for name in va.chunk_names():
                rel = f"{key}/{name}"
                self._kinds[rel] = ("chunk", key, name)
                self._sizes[rel] = va.chunk_bytes
        self.files = sorted(self._kinds)
        self.dirs.sort()
        self._cache_key = None
        self._cache = None

    # -- queries -------------------------------------------------------
    def size(self, rel):
        return self._sizes[rel]

    def total_bytes(self):
        return sum(self._sizes.values())

    def array_keys(self):
        return sorted(self.arrays)

    def view_array(self, key):
        return self.arrays[key]

    def full_array(self, key):
        """The view's logical array ``key`` (raw unsigned ints)."""
        if self._cache_key != key:
            self._cache = None
            self._cache = self.arrays[key].full()
            self._cache_key = key
        return self._cache

    def source_chunks(self, rel):
        """Relative source chunk paths a view chunk file is built from."""
        kind = self._kinds[rel]
        if kind[0] != "chunk":
            raise KeyError(f"{rel} is not a chunk file")
        return self.arrays[kind[1]].source_chunks(kind[2])

    def read(self, rel):
        kind = self._kinds[rel]
        if kind[0] == "pass":
            with open(os.path.join(self.root, rel), "rb") as f:
                return f.read()
        va = self.arrays[kind[1]]
        if kind[0] == "zarray":
            return va.zarray_bytes
        if not va.changed:
            with open(os.path.join(self.root, rel), "rb") as f:
                return f.read()
        a = self.full_array(kind[1])
        idx = [int(x) for x in kind[2].split(".")]
        box = tuple(slice(i * c, (i + 1) * c) for i, c in zip(idx, va.chunks))
        piece = a[box]
        if list(piece.shape) != va.chunks:
            full = np.zeros(va.chunks, dtype=a.dtype)
            full[tuple(slice(0, n) for n in piece.shape)] = piece
            piece = full
        return np.ascontiguousarray(piece).tobytes()

    def items(self):
        for rel in self.files:
            yield rel, self.read(rel)


def expected_view(src_dir, tp, vocab_size=None, vocab_divisor=128,
                  src_tp=None):
    """relpath -> bytes of every file the view must contain."""
    v = ExpectedView(src_dir, tp, vocab_size=vocab_size,
                     vocab_divisor=vocab_divisor, src_tp=src_tp)
    return dict(v.items())
