"""The malformed-checkpoint corpus: every case, what is wrong with it, and
exactly what reshardfs must do with it.

Each case starts from a copy of one of two valid checkpoints that
make_corpus.py writes first:

* ``zarr``: a tp=2 zarr sample (scripts/make_sample_checkpoint.py, 2 layers,
  no optimizer states);
* ``td``: the same checkpoint shown as torch_dist at tp=2 by reshardfs
  itself (``-o format=torch_dist,tp=2``) and copied out.  Mounted again at
  tp=2 it reproduces itself byte for byte, which is what the "mounts" cases
  of it are checked against.

and breaks one thing.  Outcomes:

* ``Refused(lines)``: the daemon exits 1 without mounting, within the
  timeout, and stderr holds exactly ``len(lines)`` lines, each
  ``reshardfs: ...``; line i holds every substring of ``lines[i]``.
* ``Mounts(eio, source, extra, same_as)``: the mount comes up; each file in
  ``eio`` gives EIO on read; every other file reads exactly its expected
  bytes, and the view holds exactly the expected files.  Expected: for a
  zarr case, the numpy oracle (tests/mount/oracle.py) of the case's own
  source, plus ``extra`` files served as the source's bytes; for a td case
  viewed as torch_dist, the td base, except ``source`` files, which are the
  case's own (``.metadata``: the same objects); for a td case viewed as
  zarr, the zarr base, with ``same_as`` files equal to another base file.
  Every malformed input is caught at mount time, so no case here expects
  EIO: the read path's EIO is for sources that change after the mount
  (tests/mount/test_bad_input.py and the fault tests).

A case's ``build(d, ctx)`` edits the copy in ``d``; ``ctx.outside`` is a
directory next to the cases (never inside any SOURCE) holding symlink
targets, ``ctx.zarr`` and ``ctx.td`` are the pristine bases.
"""

import os
import struct
from dataclasses import dataclass, field

import edit

QKV = "decoder.layers.self_attention.linear_qkv.weight"
FC1 = "decoder.layers.mlp.linear_fc1.weight"
FC2 = "decoder.layers.mlp.linear_fc2.weight"
EMB = "embedding.word_embeddings.weight"
NORM = "decoder.final_layernorm.weight"       # shape [64], one chunk "0"
LNORM = "decoder.layers.mlp.linear_fc1.layer_norm_weight"   # [2, 64]
EXTRA = "decoder.layers.mlp.linear_fc2._extra_state"
BLOB = EXTRA + "/shard_0_2"


@dataclass
class Refused:
    lines: list


@dataclass
class Mounts:
    eio: tuple = ()           # files whose reads must give EIO
    source: tuple = ()        # td: files that are the case's own (not base)
    extra: tuple = ()         # zarr: files the oracle does not know, served
                              # as the source's bytes
    same_as: dict = field(default_factory=dict)  # rel -> base rel it equals


@dataclass
class Case:
    name: str
    base: str                 # "zarr" | "td"
    what: str
    build: object
    expect: object
    opts: tuple = ()

    def options(self):
        if self.opts:
            return list(self.opts)
        return ["tp=1"] if self.base == "zarr" else ["tp=2"]


CASES = []


def case(name, base, what, expect, opts=()):
    def deco(fn):
        CASES.append(Case(name, base, what, fn, expect, tuple(opts)))
        return fn
    return deco


def one(*needles):
    return Refused([list(needles)])


# ================================================================ zarr

# ---- chunk files

@case("zarr_chunk_truncated", "zarr",
      "a chunk file one byte short", one(f"{FC2}/0.0.0",
                                         "has 8191 bytes, expected 8192"))
def _(d, ctx):
    p = d / FC2 / "0.0.0"
    os.truncate(p, p.stat().st_size - 1)


@case("zarr_chunk_oversized", "zarr",
      "a chunk file 4 KiB too long", one(f"{FC2}/1.0.1",
                                         "has 12288 bytes, expected 8192"))
def _(d, ctx):
    with open(d / FC2 / "1.0.1", "ab") as f:
        f.write(b"\xff" * 4096)


@case("zarr_chunk_empty", "zarr",
      "a chunk file of 0 bytes", one(f"{EMB}/1.0", "has 0 bytes"))
def _(d, ctx):
    os.truncate(d / EMB / "1.0", 0)


@case("zarr_chunk_missing", "zarr",
      "a chunk file missing", one(f"{QKV}/1.1.0", "missing chunk file"))
def _(d, ctx):
    os.unlink(d / QKV / "1.1.0")


@case("zarr_chunk_out_of_grid", "zarr",
      "an extra chunk file past the grid", one(f"{FC2}/2.0.0",
                                               "outside the array's grid"))
def _(d, ctx):
    (d / FC2 / "2.0.0").write_bytes(b"\0" * 8192)


@case("zarr_chunk_is_directory", "zarr",
      "a chunk file that is a directory",
      one(f"{FC2}/0.0.1", "not a regular file"))
def _(d, ctx):
    os.unlink(d / FC2 / "0.0.1")
    (d / FC2 / "0.0.1").mkdir()


@case("zarr_chunk_is_fifo", "zarr",
      "a chunk file that is a FIFO (must never be opened: it would block)",
      one(f"{FC2}/0.0.1", "not a regular file"))
def _(d, ctx):
    os.unlink(d / FC2 / "0.0.1")
    os.mkfifo(d / FC2 / "0.0.1")


@case("zarr_chunk_name_noncanonical", "zarr",
      "a file named like a chunk with a leading zero (00.0.0): not a "
      "chunk, passed through as an extra file",
      Mounts(extra=(f"{FC2}/00.0.0",)))
def _(d, ctx):
    (d / FC2 / "00.0.0").write_bytes(b"not a chunk")


# ---- .zarray text

@case("zarr_zarray_truncated", "zarr",
      ".zarray cut in half", one(f"{QKV}/.zarray", "not a JSON object"))
def _(d, ctx):
    p = d / QKV / ".zarray"
    p.write_bytes(p.read_bytes()[:len(p.read_bytes()) // 2])


@case("zarr_zarray_empty", "zarr",
      ".zarray of 0 bytes", one(f"{FC1}/.zarray", "not a JSON object"))
def _(d, ctx):
    (d / FC1 / ".zarray").write_bytes(b"")


@case("zarr_zarray_huge", "zarr",
      ".zarray of 2 MiB (valid JSON padded with spaces)",
      one(f"{NORM}/.zarray", "at most 1048576 bytes"))
def _(d, ctx):
    p = d / NORM / ".zarray"
    p.write_bytes(p.read_bytes() + b" " * (2 << 20))


@case("zarr_zarray_trailing_garbage", "zarr",
      ".zarray with bytes after the JSON object (json.loads refuses it)",
      one(f"{NORM}/.zarray", "bytes after the JSON object"))
def _(d, ctx):
    p = d / NORM / ".zarray"
    p.write_bytes(p.read_bytes() + b'{"shape": [1]}')


@case("zarr_zarray_nul", "zarr",
      '.zarray with a raw NUL in the dtype string ("bfloat16<NUL>x": a C '
      'string would read "bfloat16")', one(f"{NORM}/.zarray", "NUL"))
def _(d, ctx):
    p = d / NORM / ".zarray"
    p.write_bytes(p.read_bytes().replace(b'"bfloat16"', b'"bfloat16\0x"'))


@case("zarr_zarray_escaped_nul", "zarr",
      '.zarray with dtype "bfloat16\\u0000x" (JSON-escaped NUL: cJSON '
      'would decode it to "bfloat16")', one(f"{NORM}/.zarray", "NUL"))
def _(d, ctx):
    p = d / NORM / ".zarray"
    p.write_bytes(p.read_bytes().replace(b'"bfloat16"',
                                         b'"bfloat16\\u0000x"'))


@case("zarr_zarray_deep_nesting", "zarr",
      ".zarray with 100k nested lists in an extra key",
      one(f"{NORM}/.zarray", "not a JSON object"))
def _(d, ctx):
    p = d / NORM / ".zarray"
    text = p.read_text().rstrip()
    assert text.endswith("}")
    p.write_text(text[:-1] + ', "x": ' + "[" * 100000 + "]" * 100000 + "}")


@case("zarr_zarray_duplicate_chunks", "zarr",
      '.zarray with "chunks" twice (cJSON would take the first, Python the '
      'last: two readers, two grids)',
      one(f"{QKV}/.zarray", 'duplicate key "chunks"'))
def _(d, ctx):
    p = d / QKV / ".zarray"
    p.write_text(p.read_text().replace(
        "{", '{\n    "chunks": [1, 32, 64],', 1))


@case("zarr_zarray_duplicate_dtype", "zarr",
      '.zarray with "dtype" twice ("<f2", then the stored "bfloat16")',
      one(f"{NORM}/.zarray", 'duplicate key "dtype"'))
def _(d, ctx):
    p = d / NORM / ".zarray"
    p.write_text(p.read_text().replace("{", '{\n    "dtype": "<f2",', 1))


@case("zarr_zarray_duplicate_shape", "zarr",
      '.zarray with "shape" twice, the second one doubled',
      one(f"{EMB}/.zarray", 'duplicate key "shape"'))
def _(d, ctx):
    p = d / EMB / ".zarray"
    text = p.read_text().rstrip()
    p.write_text(text[:-1] + ', "shape": [2048, 64]}')


@case("zarr_zarray_not_object", "zarr",
      ".zarray is a JSON list", one(f"{QKV}/.zarray", "not a JSON object"))
def _(d, ctx):
    (d / QKV / ".zarray").write_text("[1, 2, 3]")


@case("zarr_format_3", "zarr",
      '"zarr_format": 3', one(f"{QKV}/.zarray", '"zarr_format" must be 2'))
def _(d, ctx):
    _edit(d / QKV, lambda m: m.update(zarr_format=3))


@case("zarr_compressor", "zarr",
      "a blosc compressor", one(f"{FC2}/.zarray", "compressor blosc"))
def _(d, ctx):
    _edit(d / FC2, lambda m: m.update(compressor={"id": "blosc",
                                                  "cname": "lz4"}))


@case("zarr_order_f", "zarr",
      'Fortran order', one(f"{FC2}/.zarray", '"order" must be "C"'))
def _(d, ctx):
    _edit(d / FC2, lambda m: m.update(order="F"))


@case("zarr_separator_slash", "zarr",
      '"dimension_separator": "/"',
      one(f"{FC2}/.zarray", "dimension_separator"))
def _(d, ctx):
    _edit(d / FC2, lambda m: m.update(dimension_separator="/"))


@case("zarr_filters", "zarr",
      "a delta filter", one(f"{FC2}/.zarray", '"filters"'))
def _(d, ctx):
    _edit(d / FC2, lambda m: m.update(filters=[{"id": "delta",
                                                "dtype": "<f4"}]))


# ---- dtypes

@case("zarr_dtype_unknown", "zarr",
      'dtype "<x9"', one(f"{QKV}/.zarray", 'unsupported "dtype" <x9'))
def _(d, ctx):
    _edit(d / QKV, lambda m: m.update(dtype="<x9"))


@case("zarr_dtype_big_endian", "zarr",
      'dtype ">f4" (big-endian)', one(f"{NORM}/.zarray",
                                      'unsupported "dtype" >f4'))
def _(d, ctx):
    _edit(d / NORM, lambda m: m.update(dtype=">f4"))


@case("zarr_dtype_void", "zarr",
      'dtype "<V2" (numpy\'s raw bf16; mcore rewrites it to "bfloat16")',
      one(f"{NORM}/.zarray", 'unsupported "dtype" <V2'))
def _(d, ctx):
    _edit(d / NORM, lambda m: m.update(dtype="<V2"))


@case("zarr_dtype_not_string", "zarr",
      "dtype 4 (a number)", one(f"{NORM}/.zarray",
                                'unsupported "dtype" (not a string)'))
def _(d, ctx):
    _edit(d / NORM, lambda m: m.update(dtype=4))


@case("zarr_dtype_itemsize_mismatch", "zarr",
      'dtype "<f4" on bf16 chunk files (half the bytes the dtype needs)',
      one(f"{NORM}/0", "has 128 bytes, expected 256"))
def _(d, ctx):
    _edit(d / NORM, lambda m: m.update(dtype="<f4"))


# ---- shapes and chunk grids

@case("zarr_shape_bytes_overflow", "zarr",
      "shape [2^32, 2^31] of <f4: 2^63 elements fit in uint64, their "
      "bytes do not", one(f"{LNORM}/.zarray", "overflows"))
def _(d, ctx):
    _edit(d / LNORM, lambda m: m.update(shape=[2**32, 2**31],
                                        chunks=[1, 64], dtype="<f4"))


@case("zarr_shape_elements_overflow", "zarr",
      "shape [2^32, 2^32]: the element count itself overflows uint64",
      one(f"{LNORM}/.zarray", "overflows"))
def _(d, ctx):
    _edit(d / LNORM, lambda m: m.update(shape=[2**32, 2**32]))


@case("zarr_shape_negative", "zarr",
      "shape [2, -128, 64]", one(f"{QKV}/.zarray", '"shape"[1]',
                                 "not a non-negative integer"))
def _(d, ctx):
    _edit(d / QKV, lambda m: m["shape"].__setitem__(1, -128))


@case("zarr_shape_float", "zarr",
      "shape [64.5]", one(f"{NORM}/.zarray", '"shape"[0]',
                          "not a non-negative integer"))
def _(d, ctx):
    _edit(d / NORM, lambda m: m.update(shape=[64.5]))


@case("zarr_shape_1e300", "zarr",
      "shape [1e300] (not an exact integer)",
      one(f"{NORM}/.zarray", '"shape"[0]'))
def _(d, ctx):
    p = d / NORM / ".zarray"
    p.write_text(p.read_text().replace('"shape": [\n        64\n    ]',
                                       '"shape": [1e300]'))


@case("zarr_shape_huge_grid", "zarr",
      "shape [2^53] in chunks of 64: 2^47 chunks",
      one(f"{NORM}/.zarray", "too many chunks"))
def _(d, ctx):
    _edit(d / NORM, lambda m: m.update(shape=[2**53]))


@case("zarr_shape_huge_chunk", "zarr",
      "shape and chunks [2^40]: one 2 TiB chunk (never allocated), whose "
      "file has 128 bytes", one(f"{NORM}/0",
                                "has 128 bytes, expected 2199023255552"))
def _(d, ctx):
    _edit(d / NORM, lambda m: m.update(shape=[2**40], chunks=[2**40]))


@case("zarr_too_many_axes", "zarr",
      "40 axes", one(f"{NORM}/.zarray", "40 axes"))
def _(d, ctx):
    _edit(d / NORM, lambda m: m.update(shape=[1] * 40, chunks=[1] * 40))


@case("zarr_rank_mismatch", "zarr",
      "chunks with fewer axes than shape",
      one(f"{QKV}/.zarray", '"shape" has 3 axes but "chunks" has 2'))
def _(d, ctx):
    _edit(d / QKV, lambda m: m.update(chunks=m["chunks"][:2]))


@case("zarr_chunks_zero", "zarr",
      "a chunk extent of 0", one(f"{QKV}/.zarray", '"chunks"[2] is 0'))
def _(d, ctx):
    _edit(d / QKV, lambda m: m["chunks"].__setitem__(2, 0))


@case("zarr_shape_zero_with_chunks", "zarr",
      "shape [0] while chunk file 0 is still there",
      one(f"{NORM}/0", "outside the array's grid"))
def _(d, ctx):
    _edit(d / NORM, lambda m: m.update(shape=[0]))


@case("zarr_shape_zero_empty", "zarr",
      "shape [0] and no chunk files: a valid empty array, passed through",
      Mounts())
def _(d, ctx):
    _edit(d / NORM, lambda m: m.update(shape=[0]))
    os.unlink(d / NORM / "0")


@case("zarr_tp_axis_zero", "zarr",
      "a TP-split tensor with 0 rows on its TP axis (and so no chunk "
      "files): empty, it splits into any tp; passed through", Mounts())
def _(d, ctx):
    _edit(d / QKV, lambda m: m["shape"].__setitem__(1, 0))
    for f in (d / QKV).iterdir():
        if f.name != ".zarray":
            f.unlink()


@case("zarr_grid_not_tiling_tp_axis", "zarr",
      "QKV rows 128 in chunks of 48 (a valid zarr edge chunk, files of the "
      "right size): a TP axis that is not a whole number of chunks",
      one(f"{QKV}/.zarray", "axis 1", "size 128",
          "not a whole number of chunks of 48"))
def _(d, ctx):
    _regrid(d / QKV, [1, 48, 64])


@case("zarr_grid_not_tiling_replicated", "zarr",
      "a layer norm [2, 64] in chunks of [1, 48] (edge chunk zero padded): "
      "valid zarr, not TP-split, passed through", Mounts())
def _(d, ctx):
    _regrid(d / LNORM, [1, 48])


@case("zarr_chunk_larger_than_shape", "zarr",
      "the final norm [64] in one chunk of 128 (padded): valid zarr, "
      "passed through", Mounts())
def _(d, ctx):
    _regrid(d / NORM, [128])


@case("zarr_chunk_larger_than_shape_tp_axis", "zarr",
      "FC2's TP axis (128 columns) in one chunk of 256",
      one(f"{FC2}/.zarray", "axis 2", "size 128",
          "not a whole number of chunks of 256"))
def _(d, ctx):
    _regrid(d / FC2, [1, 64, 256])


# ---- metadata.json, common.pt, ShardedObjects

@case("zarr_metadata_json_truncated", "zarr",
      "metadata.json cut in half",
      one("metadata.json", "not a JSON object"))
def _(d, ctx):
    p = d / "metadata.json"
    p.write_bytes(p.read_bytes()[:20])


@case("zarr_metadata_json_duplicate_backend", "zarr",
      'metadata.json with "sharded_backend" twice (torch_dist, then zarr)',
      one("metadata.json", 'duplicate key "sharded_backend"'))
def _(d, ctx):
    p = d / "metadata.json"
    p.write_text(p.read_text().replace(
        "{", '{"sharded_backend": "torch_dist", ', 1))


@case("zarr_common_pt_truncated", "zarr",
      "common.pt cut in half: passed through as stored (reshardfs never "
      "interprets it)", Mounts())
def _(d, ctx):
    p = d / "common.pt"
    p.write_bytes(p.read_bytes()[:len(p.read_bytes()) // 2])


@case("zarr_shard_pt_truncated_as_td", "zarr",
      "a ShardedObject .pt cut in half, viewed as torch_dist (which must "
      "re-wrap it)", one(f"{EXTRA}/shard_0_2", "ShardedObject"),
      opts=("tp=2", "format=torch_dist"))
def _(d, ctx):
    p = d / EXTRA / "shard_0_2.pt"
    p.write_bytes(p.read_bytes()[:len(p.read_bytes()) // 2])


@case("zarr_stray_metadata_as_td", "zarr",
      "a junk .metadata file in a zarr source, viewed as torch_dist (whose "
      ".metadata the view writes)",
      one(".metadata", "writes a file of this name itself"),
      opts=("tp=2", "format=torch_dist"))
def _(d, ctx):
    (d / ".metadata").write_bytes(b"junk")


@case("zarr_stray_distcp_dir_as_td", "zarr",
      "a directory __1_0.distcp in a zarr source, viewed as torch_dist",
      one("__1_0.distcp", "writes a file of this name itself"),
      opts=("tp=2", "format=torch_dist"))
def _(d, ctx):
    (d / "__1_0.distcp").mkdir()
    (d / "__1_0.distcp" / "f").write_bytes(b"x")


# ---- names and symlinks

@case("zarr_name_255_bytes", "zarr",
      "an extra array whose directory name is 255 bytes (the most a name "
      "may have): served", Mounts())
def _(d, ctx):
    os.rename(d / NORM, d / ("n" * 255))


@case("zarr_name_control_chars", "zarr",
      "an array directory named with a newline and a fake "
      "'reshardfs:' line, holding a broken .zarray: one line, escaped",
      one("bad\\x0areshardfs: fake", ".zarray", "not a JSON object"))
def _(d, ctx):
    bad = d / "bad\nreshardfs: fake"
    bad.mkdir()
    (bad / ".zarray").write_text("{")


@case("zarr_reserved_name", "zarr",
      "a top-level .reshardfs directory",
      one(".reshardfs", "reserved"))
def _(d, ctx):
    (d / ".reshardfs").mkdir()


@case("zarr_deep_directories", "zarr",
      "directories nested 20 deep", one("directories nested deeper than"))
def _(d, ctx):
    p = d
    for i in range(20):
        p = p / f"d{i}"
    p.mkdir(parents=True)
    (p / "f").write_bytes(b"x")


@case("zarr_chunk_symlink_etc_passwd", "zarr",
      "a chunk file that is a symlink to /etc/passwd",
      one(f"{FC2}/0.0.0", "leads outside SOURCE"))
def _(d, ctx):
    _symlink(d / FC2 / "0.0.0", "/etc/passwd")


@case("zarr_chunk_symlink_dotdot", "zarr",
      "a chunk file that is a symlink to ../../outside/<a chunk of the "
      "right size>", one(f"{FC2}/0.0.0", "leads outside SOURCE"))
def _(d, ctx):
    _symlink(d / FC2 / "0.0.0",
             os.path.relpath(ctx.outside / "chunk_8192", d / FC2))


@case("zarr_array_dir_symlink_outside", "zarr",
      "an array directory that is a symlink to a copy outside SOURCE",
      one(FC2, "leads outside SOURCE"))
def _(d, ctx):
    _symlink(d / FC2, os.path.relpath(ctx.outside / "fc2_array", d))


@case("zarr_array_dir_symlink_inside", "zarr",
      "an array directory that is a symlink to another array inside SOURCE",
      one(FC2, "symbolic links to directories are not supported"))
def _(d, ctx):
    import shutil
    shutil.copytree(d / FC2, d / "fc2_copy")
    _symlink(d / FC2, "fc2_copy")


@case("zarr_zarray_symlink_outside", "zarr",
      "a .zarray that is a symlink to a copy outside SOURCE",
      one(f"{FC2}/.zarray", "leads outside SOURCE"))
def _(d, ctx):
    _symlink(d / FC2 / ".zarray",
             os.path.relpath(ctx.outside / "fc2_array" / ".zarray", d / FC2))


@case("zarr_metadata_json_symlink_outside", "zarr",
      "metadata.json a symlink to a valid copy outside SOURCE",
      one("metadata.json", "leads outside SOURCE"))
def _(d, ctx):
    _symlink(d / "metadata.json",
             os.path.relpath(ctx.outside / "metadata.json", d))


@case("zarr_metadata_json_symlink_inside", "zarr",
      "metadata.json a symlink to a copy inside SOURCE: followed, served as "
      "the bytes it points to", Mounts())
def _(d, ctx):
    (d / "meta").mkdir()
    os.rename(d / "metadata.json", d / "meta" / "metadata.json")
    _symlink(d / "metadata.json", "meta/metadata.json")


@case("zarr_metadata_json_symlink_etc_passwd", "zarr",
      "metadata.json a symlink to /etc/passwd",
      one("metadata.json", "leads outside SOURCE"))
def _(d, ctx):
    _symlink(d / "metadata.json", "/etc/passwd")


@case("zarr_symlink_loop", "zarr",
      "a chunk file that is a symlink to itself",
      one(f"{FC2}/0.0.0", "symbolic link", "cannot be followed"))
def _(d, ctx):
    _symlink(d / FC2 / "0.0.0", "0.0.0")


@case("zarr_symlink_to_fifo_inside", "zarr",
      "a chunk file that is a symlink to a FIFO inside SOURCE",
      Refused([[f"{FC2}/0.0.0", "not a regular file"],
               ["fifo", "not a regular file"]]))
def _(d, ctx):
    os.mkfifo(d / "fifo")
    _symlink(d / FC2 / "0.0.0", "../fifo")


@case("zarr_chunk_symlink_inside", "zarr",
      "a chunk file that is a symlink to a same-sized chunk inside SOURCE: "
      "served as the bytes it points to", Mounts())
def _(d, ctx):
    _symlink(d / FC2 / "0.0.0", "0.0.1")


# ================================================================ td

def _md_edit(fn):
    def build(d, ctx):
        md = edit.read_metadata(d)
        fn(md, d, ctx)
        edit.write_metadata(d, md)
    return build


def td_case(name, what, expect, opts=()):
    def deco(fn):
        CASES.append(Case(name, "td", what, _md_edit(fn), expect,
                          tuple(opts)))
        return fn
    return deco


def td_raw(name, what, expect, opts=()):
    return case(name, "td", what, expect, opts)


# ---- whole files

@td_raw("td_metadata_truncated", ".metadata cut in half",
        one(".metadata", "truncated"))
def _(d, ctx):
    p = d / ".metadata"
    p.write_bytes(p.read_bytes()[:len(p.read_bytes()) // 2])


@td_raw("td_metadata_empty", ".metadata of 0 bytes", one(".metadata"))
def _(d, ctx):
    (d / ".metadata").write_bytes(b"")


@td_raw("td_metadata_not_metadata", ".metadata is a pickled int",
        one(".metadata", "not a DCP Metadata object"))
def _(d, ctx):
    (d / ".metadata").write_bytes(edit.dumps(3))


@td_raw("td_distcp_truncated", "__1_0.distcp cut in half",
        one("__1_0.distcp", "past the end of the file"))
def _(d, ctx):
    p = d / "__1_0.distcp"
    p.write_bytes(p.read_bytes()[:len(p.read_bytes()) // 2])


@td_raw("td_distcp_empty", "__0_0.distcp of 0 bytes",
        one("__0_0.distcp", "past the end of the file"))
def _(d, ctx):
    os.truncate(d / "__0_0.distcp", 0)


@td_raw("td_distcp_oversized", "1 MiB of junk after the last item of "
        "__0_0.distcp: no item reaches it", Mounts())
def _(d, ctx):
    with open(d / "__0_0.distcp", "ab") as f:
        f.write(b"\xa5" * (1 << 20))


@td_raw("td_common_pt_truncated", "common.pt cut in half: passed through",
        Mounts(source=("common.pt",)))
def _(d, ctx):
    p = d / "common.pt"
    p.write_bytes(p.read_bytes()[:len(p.read_bytes()) // 2])


@td_raw("td_metadata_symlink_outside", ".metadata a symlink to a valid "
        "copy outside SOURCE", one(".metadata", "leads outside SOURCE"))
def _(d, ctx):
    _symlink(d / ".metadata", os.path.relpath(ctx.outside / "td_metadata", d))


@td_raw("td_distcp_symlink_etc_passwd", "__1_0.distcp a symlink to "
        "/etc/passwd", one("__1_0.distcp", "leads outside SOURCE"))
def _(d, ctx):
    _symlink(d / "__1_0.distcp", "/etc/passwd")


@td_raw("td_distcp_symlink_dotdot", "__0_0.distcp a symlink to an "
        "identical copy outside SOURCE",
        one("__0_0.distcp", "leads outside SOURCE"))
def _(d, ctx):
    _symlink(d / "__0_0.distcp",
             os.path.relpath(ctx.outside / "td_distcp0", d))


@td_raw("td_metadata_json_symlink", "metadata.json a symlink to ../outside",
        one("metadata.json", "leads outside SOURCE"))
def _(d, ctx):
    _symlink(d / "metadata.json",
             os.path.relpath(ctx.outside / "td_metadata.json", d))


# ---- storage_data

@td_case("td_relpath_dotdot", 'a relative_path of "../__0_0.distcp"',
         one(".metadata", '"../__0_0.distcp"', "not a plain file name"))
def _(md, d, ctx):
    _relpath(md, "../__0_0.distcp")


@td_case("td_relpath_absolute", 'a relative_path of "/etc/passwd"',
         one(".metadata", '"/etc/passwd"', "not a plain file name"))
def _(md, d, ctx):
    _relpath(md, "/etc/passwd")


@td_case("td_relpath_subdir", 'a relative_path of "sub/__0_0.distcp"',
         one(".metadata", "sub/__0_0.distcp", "not a plain file name"))
def _(md, d, ctx):
    _relpath(md, "sub/__0_0.distcp")


@td_case("td_relpath_nul", 'a relative_path of "__0_0.distcp\\0/../x": a C '
         "string would stop at the NUL and read __0_0.distcp",
         one(".metadata", "__0_0.distcp\\x00", "not a plain file name"))
def _(md, d, ctx):
    _relpath(md, "__0_0.distcp\0/../x")


@td_case("td_relpath_300_bytes", "a relative_path of 300 bytes",
         one(".metadata", "not a plain file name"))
def _(md, d, ctx):
    _relpath(md, "a" * 300)


@td_case("td_relpath_missing_file", 'a relative_path naming a file that '
         'is not there', one("__7_0.distcp", "missing"))
def _(md, d, ctx):
    _relpath(md, "__7_0.distcp")


@td_case("td_item_offset_past_end", "an item at offset 10^9",
         one("__0_0.distcp", "past the end of the file"))
def _(md, d, ctx):
    _first_info(md).offset = 10**9


@td_case("td_item_length_past_end", "an item 1 MiB longer than its file",
         one("__0_0.distcp", "past the end of the file"))
def _(md, d, ctx):
    _first_info(md).length += 1 << 20


@td_case("td_item_offset_huge", "offset and length both 2^63-1 (the "
         "most a pickled int64 holds; their sum just below 2^64)",
         one("__0_0.distcp", "past the end of the file"))
def _(md, d, ctx):
    info = _first_info(md)
    info.offset = 2**63 - 1
    info.length = 2**63 - 1


@td_case("td_item_offset_negative", "an item at offset -1",
         one(".metadata", "storage_data entry", "malformed"))
def _(md, d, ctx):
    _first_info(md).offset = -1


@td_case("td_item_offset_bigint", "an item offset of 2^70 (LONG1)",
         one(".metadata", "storage_data entry", "malformed"))
def _(md, d, ctx):
    _first_info(md).offset = 2**70


@td_case("td_storage_entry_missing", "a chunk with no storage_data entry",
         one(".metadata", NORM, "no storage_data entry"))
def _(md, d, ctx):
    for k in list(md.storage_data):
        if k.fqn == NORM:
            del md.storage_data[k]


@td_case("td_storage_entry_duplicate", "two storage_data entries for one "
         "chunk, pointing at different items (Python keeps the last)",
         one(".metadata", NORM, "twice"))
def _(md, d, ctx):
    pairs = list(md.storage_data.items())
    k, v = next((k, v) for k, v in pairs if k.fqn == NORM)
    other = next(v2 for k2, v2 in pairs if k2.fqn == LNORM)
    k2 = edit.stub_class(type(k)._rs_module, type(k)._rs_name).__new__(
        type(k))
    k2.state = dict(k.state)
    md.storage_data = edit.DupDict(pairs + [(k2, other)])


@td_case("td_items_share_bytes", "FC2's chunk (1, 0, 0) stored at the "
         "same item as chunk (0, 0, 0) (same shape): served as stored, both "
         "read those bytes",
         Mounts(same_as={f"{FC2}/1.0.0": f"{FC2}/0.0.0"}),
         opts=("tp=2", "format=zarr"))
def _(md, d, ctx):
    at = {edit.size_of(k.offset): v for k, v in edit.tensor_items(md, FC2)}
    at[(1, 0, 0)].state = dict(at[(0, 0, 0)].state)


# ---- state_dict_metadata

@td_case("td_fqn_nul", 'a tensor named "<norm>\\0evil" (a C string would '
         "drop the tail)", one(".metadata", "\\x00evil"))
def _(md, d, ctx):
    edit.rename_fqn(md, NORM, NORM + "\0evil")


@td_case("td_fqn_nul_sdm_only", 'state_dict_metadata names '
         '"<norm>\\0evil" while storage_data still says "<norm>"',
         one(".metadata", "state_dict_metadata", NORM + "\\x00evil"))
def _(md, d, ctx):
    md.state_dict_metadata = {(k + "\0evil" if k == NORM else k): v
                              for k, v in md.state_dict_metadata.items()}


@td_case("td_fqn_duplicate", "one tensor name twice in "
         "state_dict_metadata (Python keeps the last)",
         one(".metadata", NORM, "twice"))
def _(md, d, ctx):
    pairs = list(md.state_dict_metadata.items())
    md.state_dict_metadata = edit.DupDict(
        pairs + [(NORM, md.state_dict_metadata[NORM])])


@td_case("td_fqn_slash_as_zarr", 'a tensor named "a/b", viewed as zarr',
         one('"a/b"', "cannot be a directory name"),
         opts=("tp=2", "format=zarr"))
def _(md, d, ctx):
    edit.rename_fqn(md, NORM, "a/b")


@td_case("td_fqn_slash_as_td", 'a tensor named "a/b", viewed as '
         "torch_dist: a DCP key may hold '/', it never becomes a path",
         Mounts(source=(".metadata",)))
def _(md, d, ctx):
    edit.rename_fqn(md, NORM, "a/b")


@td_case("td_fqn_dotdot_as_zarr", 'a tensor named "..", viewed as zarr',
         one('".."', "cannot be a directory name"),
         opts=("tp=2", "format=zarr"))
def _(md, d, ctx):
    edit.rename_fqn(md, NORM, "..")


@td_case("td_fqn_300_as_zarr", "a tensor name of 300 bytes, viewed as zarr",
         one("cannot be a directory name"), opts=("tp=2", "format=zarr"))
def _(md, d, ctx):
    edit.rename_fqn(md, NORM, "n" * 300)


@td_case("td_fqn_empty_as_zarr", 'a tensor named "", viewed as zarr',
         one('""', "cannot be a directory name"),
         opts=("tp=2", "format=zarr"))
def _(md, d, ctx):
    edit.rename_fqn(md, NORM, "")


@td_raw("td_file_named_like_tensor_as_zarr", "a file at the top named "
        "like a tensor, viewed as zarr (where the tensor is a directory)",
        one("the zarr view would write two things at "
            "decoder.final_layernorm.weight", "tensor "
            "decoder.final_layernorm.weight"),
        opts=("tp=2", "format=zarr"))
def _(d, ctx):
    (d / NORM).write_bytes(b"x")


@td_case("td_blob_fqn_dotdot_as_zarr", 'a byte item named '
         '"../../etc/shard_0", viewed as zarr',
         one("../../etc/shard_0", "cannot be a file path"),
         opts=("tp=2", "format=zarr"))
def _(md, d, ctx):
    edit.rename_fqn(md, BLOB, "../../etc/shard_0")


@td_case("td_dtype_unknown", "a tensor of dtype torch.complex64",
         one(".metadata", NORM, "unsupported dtype torch.complex64"))
def _(md, d, ctx):
    _set_dtype(md, NORM, edit.G("torch", "complex64"))


@td_case("td_dtype_mismatch", ".metadata says float32 where the item "
         "holds a BFloat16Storage",
         one("__0_0.distcp", NORM, "BFloat16Storage", "float32"))
def _(md, d, ctx):
    _set_dtype(md, NORM, edit.G("torch", "float32"))


@td_case("td_size_negative", "a tensor of size (-1,)",
         one(".metadata", NORM, "size is not a torch.Size"))
def _(md, d, ctx):
    edit.set_size(md.state_dict_metadata[NORM].size, (-1,))


@td_case("td_size_overflow", "a tensor of size (2^62, 2^62)",
         one(".metadata", LNORM, "too large"))
def _(md, d, ctx):
    edit.set_size(md.state_dict_metadata[LNORM].size, (2**62, 2**62))


@td_case("td_size_huge", "a tensor of size (2^40,) whose one chunk says "
         "(2^40,) too: its item holds 64 elements",
         one("__0_0.distcp", NORM, "shape differs"))
def _(md, d, ctx):
    meta = md.state_dict_metadata[NORM]
    edit.set_size(meta.size, (2**40,))
    edit.set_size(meta.chunks[0].sizes, (2**40,))


@td_case("td_chunk_outside_tensor", "a chunk at offset 64 of a 64-element "
         "tensor", one(".metadata", NORM, "outside the tensor"))
def _(md, d, ctx):
    edit.set_size(md.state_dict_metadata[NORM].chunks[0].offsets, (64,))


@td_case("td_chunk_rank_mismatch", "a chunk of rank 2 in a 1-d tensor",
         one(".metadata", NORM, "another rank"))
def _(md, d, ctx):
    c = md.state_dict_metadata[NORM].chunks[0]
    edit.set_size(c.offsets, (0, 0))
    edit.set_size(c.sizes, (64, 1))


@td_case("td_chunks_leave_gap", "FC2's chunk list without one chunk (its "
         "storage still there): a quarter of the tensor has no bytes",
         one(".metadata", FC2, "cover"))
def _(md, d, ctx):
    md.state_dict_metadata[FC2].chunks.pop(1)


@td_case("td_chunks_overlap", "FC2's chunk list with one chunk twice: "
         "chunk count right for the grid, one cell held twice, another none",
         one(".metadata", FC2, "overlap"))
def _(md, d, ctx):
    ch = md.state_dict_metadata[FC2].chunks
    ch[1] = ch[0]


@td_case("td_chunks_leave_gap_replicated", "a layer norm [2, 64] stored "
         "as two chunks, one dropped from its chunk list: row 1 has no bytes "
         "(it must not read as zeros)",
         one(".metadata", LNORM, "cover"))
def _(md, d, ctx):
    md.state_dict_metadata[LNORM].chunks.pop(1)


@td_case("td_chunks_overlap_replicated", "a layer norm [2, 64] whose two "
         "chunks both say row 0: row 0 held twice, row 1 not at all",
         one(".metadata", LNORM, "overlap"))
def _(md, d, ctx):
    ch = md.state_dict_metadata[LNORM].chunks
    ch[1] = ch[0]


@td_case("td_flattened_range", "mcore_data gives a tensor a "
         "flattened_range shape (2, 3) its stored shape is no reformulation of",
         one(".metadata", FC1, "flattened_range", "is not cut into"))
def _(md, d, ctx):
    md.state["mcore_data"] = {FC1: {"nd_reformulated_orig_global_shape":
                                    (2, 3)}}


# ---- pickles

@td_case("td_pickle_os_system", ".metadata names os.system (as "
         "posix.system) in planner_data",
         one(".metadata", "posix.system", "not allowed"))
def _(md, d, ctx):
    md.planner_data = edit.G("posix", "system")


@td_raw("td_pickle_deep_lists", ".metadata: 100k lists nested in each "
        "other (no MARK), then STOP",
        one(".metadata", "not a DCP Metadata object"))
def _(d, ctx):
    n = 100000
    (d / ".metadata").write_bytes(b"\x80\x04" + b"]" * n + b"a" * (n - 1) +
                                  b".")


@td_raw("td_pickle_deep_marks", ".metadata: 100k nested MARKs",
        one(".metadata", "nesting over"))
def _(d, ctx):
    (d / ".metadata").write_bytes(b"\x80\x04" + b"(" * 100000 + b".")


@td_raw("td_pickle_long4_huge", ".metadata: a LONG4 of 2^31-1 bytes with "
        "none following", one(".metadata", "LONG4"))
def _(d, ctx):
    (d / ".metadata").write_bytes(b"\x80\x04\x8b" +
                                  struct.pack("<i", 2**31 - 1) + b".")


@td_raw("td_pickle_binunicode_huge", ".metadata: a BINUNICODE of 2^32-1 "
        "bytes with 5 following", one(".metadata", "BINUNICODE"))
def _(d, ctx):
    (d / ".metadata").write_bytes(b"\x80\x04X" + struct.pack("<I", 2**32 - 1)
                                  + b"abcd.")


@td_raw("td_pickle_binunicode8_huge", ".metadata: a BINUNICODE8 of 2^63 "
        "bytes", one(".metadata", "BINUNICODE8"))
def _(d, ctx):
    (d / ".metadata").write_bytes(b"\x80\x04\x8d" + struct.pack("<Q", 2**63)
                                  + b"abcd.")


@td_raw("td_pickle_memo_missing", ".metadata: BINGET of a memo entry never "
        "put", one(".metadata", "memo"))
def _(d, ctx):
    (d / ".metadata").write_bytes(b"\x80\x04h\x07.")


GETATTR = ("builtins", "getattr")


@td_case("td_pickle_getattr_dunder", ".metadata: getattr(torch.Size, "
         "'__class__') in planner_data (Python 3.11.0-3.11.4 pickle Enum "
         "members as getattr; only public names are read)",
         one(".metadata", "offset ", "getattr(torch.Size, '__class__') is "
             "not read: the name must be an identifier not starting with '_'"))
def _(md, d, ctx):
    md.planner_data = edit.call(*GETATTR, edit.G("torch", "Size"), "__class__")


@td_case("td_pickle_getattr_value", ".metadata: builtins.getattr itself "
         "as planner_data", one(".metadata", "builtins.getattr used as a "
                                "value: it is only read as getattr(class, 'name')"))
def _(md, d, ctx):
    md.planner_data = edit.G(*GETATTR)


@td_case("td_pickle_getattr_default", ".metadata: getattr with a default",
         one(".metadata", "builtins.getattr with a default (3 arguments) "
             "is not read"))
def _(md, d, ctx):
    md.planner_data = edit.call(*GETATTR, edit.G("torch", "Size"), "x", None)


@td_case("td_pickle_getattr_nested", ".metadata: getattr of a getattr "
         "result", one(".metadata", "getattr on a getattr result "
                       "(torch.Size.mro) is not read"))
def _(md, d, ctx):
    md.planner_data = edit.call(*GETATTR, edit.call(
        *GETATTR, edit.G("torch", "Size"), "mro"), "__globals__")


@td_case("td_pickle_getattr_off_list", ".metadata: getattr on a class "
         "off the allowlist", one(".metadata", "GLOBAL posix.system is not "
                                  "allowed"))
def _(md, d, ctx):
    md.planner_data = edit.call(*GETATTR, edit.G("posix", "system"), "x")


@td_raw("td_pickle_next_buffer", ".metadata: protocol 5's NEXT_BUFFER "
        "(an out-of-band buffer)",
        one(".metadata", "offset 2: NEXT_BUFFER: out-of-band buffers "
            "(pickle protocol 5) cannot be read from a file"))
def _(d, ctx):
    (d / ".metadata").write_bytes(b"\x80\x05\x97.")


@td_raw("td_datapkl_qtensor", "a chunk's data.pkl rebuilds a quantized "
        "tensor", one("__0_0.distcp", NORM, "data.pkl is a tensor rebuilt "
                      "by torch._utils._rebuild_qtensor, which reshardfs "
                      "does not read"))
def _(d, ctx):
    _edit_datapkl(d, NORM, lambda p: edit.call(
        "torch._utils", "_rebuild_qtensor", *p.args))


@td_raw("td_datapkl_os_system", "a chunk's data.pkl calls os.system "
        "instead of _rebuild_tensor_v2",
        one("__0_0.distcp", NORM, "data.pkl", "os.system", "not allowed"))
def _(d, ctx):
    def change(p):
        p.args = (p.args[0],)
        return edit.call("os", "system", "echo pwned")
    _edit_datapkl(d, NORM, change)


@td_raw("td_datapkl_binunicode_huge", "a chunk's data.pkl: a BINUNICODE "
        "of 2^32-1 bytes", one("__0_0.distcp", NORM, "data.pkl",
                               "BINUNICODE"))
def _(d, ctx):
    _edit_datapkl(d, NORM, None,
                  raw=b"\x80\x02X" + struct.pack("<I", 2**32 - 1) + b".")


@td_raw("td_datapkl_storage_dtype", "a bf16 chunk whose data.pkl says "
        "HalfStorage", one("__0_0.distcp", NORM, "HalfStorage", "bfloat16"))
def _(d, ctx):
    def change(p):
        pid = p.args[0].pid
        p.args[0].pid = (pid[0], edit.G("torch", "HalfStorage")) + pid[2:]
        return p
    _edit_datapkl(d, NORM, change)


@td_raw("td_datapkl_shape", "a chunk's data.pkl of shape (32,) where "
        ".metadata says (64,)", one("__0_0.distcp", NORM, "shape differs"))
def _(d, ctx):
    def change(p):
        a = list(p.args)
        a[2] = (32,)
        p.args = a
        return p
    _edit_datapkl(d, NORM, change)


@td_raw("td_datapkl_stride_outside", "a chunk's data.pkl with stride 2: "
        "its last element lies past its 64-element storage",
        one("__0_0.distcp", NORM, "outside their storage"))
def _(d, ctx):
    def change(p):
        a = list(p.args)
        a[3] = (2,)
        p.args = a
        return p
    _edit_datapkl(d, NORM, change)


@td_raw("td_datapkl_numel_huge", "a chunk's storage numel 2^31-1 (its "
        "data entry holds 128 bytes)",
        one("__0_0.distcp", NORM, "outside their storage"))
def _(d, ctx):
    def change(p):
        pid = p.args[0].pid
        # location "" keeps the pickle within its entry's size
        p.args[0].pid = pid[:3] + ("", 2**31 - 1)
        return p
    _edit_datapkl(d, NORM, change)


# ---- zips

@td_raw("td_zip_entries_overlap", "an item whose data.pkl entry, by the "
        "central directory, runs into the next entry's header",
        one("__0_0.distcp", NORM, "overlapping entries"))
def _(d, ctx):
    _edit_zip_entry(d, NORM, "data.pkl", size_delta=+100)


@td_raw("td_zip_entry_outside", "an item whose data/0 entry is 1 MiB "
        "long by the central directory: past the central directory and "
        "the item", one("__0_0.distcp", NORM, "past the central directory"))
def _(d, ctx):
    _edit_zip_entry(d, NORM, "data/0", size_delta=1 << 20)


@td_raw("td_zip_header_offset_past_eof", "an entry whose local header "
        "offset is 2^31, past the end of the file",
        one("__0_0.distcp", NORM, "zip"))
def _(d, ctx):
    _edit_zip_entry(d, NORM, "data/0", header_offset=2**31)


@td_raw("td_zip_cd_past_eof", "an item whose zip64 end record puts the "
        "central directory past the end of the file",
        one("__0_0.distcp", NORM, "zip64 end record"))
def _(d, ctx):
    rel, off, ln = _span(d, NORM)
    blob = (d / rel).read_bytes()[off:off + ln]
    rec, loc, eocd = edit.end_records(blob)
    edit.patch(d / rel, off + rec + 48, struct.pack("<Q", 1 << 40))


@td_raw("td_zip64_locator_past_eof", "an item whose zip64 locator points "
        "past the end of the file",
        one("__0_0.distcp", NORM, "zip64 end record offset"))
def _(d, ctx):
    rel, off, ln = _span(d, NORM)
    blob = (d / rel).read_bytes()[off:off + ln]
    rec, loc, eocd = edit.end_records(blob)
    edit.patch(d / rel, off + loc + 8, struct.pack("<Q", 1 << 40))


@td_raw("td_zip_compressed", "an item whose data/0 entry is deflated "
        "(method 8)", one("__0_0.distcp", NORM, "compressed entry"))
def _(d, ctx):
    rel, off, ln = _span(d, NORM)
    blob = (d / rel).read_bytes()[off:off + ln]
    ho, do, size, cd = edit.zip_entries(blob)["data/0"]
    edit.patch(d / rel, off + cd + 10, struct.pack("<H", 8))
    edit.patch(d / rel, off + ho + 8, struct.pack("<H", 8))


# ================================================================ helpers

def _edit(arr_dir, fn):
    p = arr_dir / ".zarray"
    m = edit.zarray(p)
    fn(m)
    edit.write_zarray(p, m)


def _regrid(arr_dir, chunks):
    """New chunks for an array, with chunk files of the new grid holding
    the same values (edge chunks zero padded), from the stored ones."""
    import numpy as np
    p = arr_dir / ".zarray"
    m = edit.zarray(p)
    shape, old = m["shape"], m["chunks"]
    item = 2 if m["dtype"] == "bfloat16" else int(m["dtype"][2:])
    raw = np.dtype(f"<u{item}")
    full = np.zeros(shape, raw)
    import itertools
    grid = [range(-(-s // c)) for s, c in zip(shape, old)]
    for idx in itertools.product(*grid):
        name = ".".join(map(str, idx)) or "0"
        a = np.fromfile(arr_dir / name, raw).reshape(old)
        box = tuple(slice(i * c, min((i + 1) * c, s))
                    for i, c, s in zip(idx, old, shape))
        full[box] = a[tuple(slice(0, b.stop - b.start) for b in box)]
        os.unlink(arr_dir / name)
    grid = [range(-(-s // c)) for s, c in zip(shape, chunks)]
    for idx in itertools.product(*grid):
        box = tuple(slice(i * c, min((i + 1) * c, s))
                    for i, c, s in zip(idx, chunks, shape))
        piece = full[box]
        out = np.zeros(chunks, raw)
        out[tuple(slice(0, n) for n in piece.shape)] = piece
        out.tofile(arr_dir / (".".join(map(str, idx)) or "0"))
    m["chunks"] = list(chunks)
    edit.write_zarray(p, m)


def _symlink(path, target):
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        import shutil
        shutil.rmtree(path)
    os.symlink(target, path)


def _first_info(md):
    """The _StorageInfo of the first chunk of NORM (in __0_0.distcp)."""
    return next(v for k, v in md.storage_data.items() if k.fqn == NORM)


def _relpath(md, path):
    _first_info(md).relative_path = path


def _set_dtype(md, fqn, dtype):
    """TensorProperties state is a tuple, (dtype, layout, ...)."""
    p = md.state_dict_metadata[fqn].properties
    p.state = (dtype,) + tuple(p.state[1:])


def _span(d, fqn):
    md = edit.read_metadata(d)
    return edit.item_span(md, fqn)


def _edit_datapkl(d, fqn, change, raw=None):
    rel, off, ln = _span(d, fqn)
    blob = (d / rel).read_bytes()[off:off + ln]
    ho, do, size, cd = edit.zip_entries(blob)["data.pkl"]
    if raw is None:
        raw = edit.dumps(change(edit.loads(blob[do:do + size])), 2, fast=True)
    edit.replace_pickle_in_place(d / rel, off + do, size, raw)


def _edit_zip_entry(d, fqn, record, size_delta=0, header_offset=None):
    """Edits an entry's central directory record (sizes or offset)."""
    rel, off, ln = _span(d, fqn)
    blob = (d / rel).read_bytes()[off:off + ln]
    ho, do, size, cd = edit.zip_entries(blob)[record]
    at = off + cd
    if size_delta:
        edit.patch(d / rel, at + 20, struct.pack("<II", size + size_delta,
                                                 size + size_delta))
    if header_offset is not None:
        edit.patch(d / rel, at + 42, struct.pack("<I", header_offset))


def by_name():
    return {c.name: c for c in CASES}


assert len(by_name()) == len(CASES), "duplicate case names"
