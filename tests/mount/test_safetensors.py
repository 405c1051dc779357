"""HF safetensors through the mount: safetensors checkpoints as a SOURCE
(single files and sharded ones with model.safetensors.index.json) and as a
VIEW of any source, at tp 1, 2 and 4.

Sources are written by the real writer (``safetensors.numpy.save_file``,
sharded as transformers' save_pretrained lays them out).  The oracle slices
the source arrays itself (HF Llama rules: q/k/v/gate/up split on axis 0,
o/down on axis 1, embed_tokens/lm_head by vocab rows) and the real writer
serialises the expected shards: every view file must be byte-identical to
``safetensors.numpy.save`` of them.  Values are also read back through the
real parser (``safetensors.deserialize`` / ``safe_open``), and, with
``.venv-mcore``, torch's ``safetensors.torch.load_file``.  Hostile files are
each refused with one line naming the file and the problem.
"""

import json
import os
import struct
import subprocess

import ml_dtypes
import numpy as np
import pytest
import safetensors
import zarr
from safetensors import safe_open
from safetensors.numpy import save, save_file

from conftest import bytes_delivered, wait_for
from mcore import needs_mcore, run_py
from oracle import ExpectedView, classify
from test_bad_input import assert_refused, error_lines

DTYPES = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16,
          "I32": np.int32, "I64": np.int64, "F16": np.float16,
          "BF16": ml_dtypes.bfloat16, "F32": np.float32, "F64": np.float64}
COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW = ("o_proj", "down_proj")
VOCAB = ("embed_tokens", "lm_head")
PASSTHROUGH = {"config.json": b'{"architectures": ["LlamaForCausalLM"]}\n',
               "tokenizer.json": b'{"version": "1.0"}\n',
               "generation_config.json": b'{"do_sample": false}\n'}
INDEX = "model.safetensors.index.json"


# ------------------------------------------------------------------ oracle

def llama(dtype, layers=2, vocab=256, hidden=64, kv=32, ffn=128, seed=0):
    """An HF Llama-style state dict (GQA k/v, a q bias as Qwen has) plus
    tensors no rule knows: an int buffer, a bool mask, a 0-d step and an
    empty tensor (replicated in every rank's file)."""
    rng = np.random.default_rng(seed)

    def w(*shape):
        return rng.standard_normal(shape).astype(np.float32).astype(dtype)

    t = {"model.embed_tokens.weight": w(vocab, hidden),
         "model.norm.weight": w(hidden), "lm_head.weight": w(vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t.update({p + "self_attn.q_proj.weight": w(hidden, hidden),
                  p + "self_attn.q_proj.bias": w(hidden),
                  p + "self_attn.k_proj.weight": w(kv, hidden),
                  p + "self_attn.v_proj.weight": w(kv, hidden),
                  p + "self_attn.o_proj.weight": w(hidden, hidden),
                  p + "mlp.gate_proj.weight": w(ffn, hidden),
                  p + "mlp.up_proj.weight": w(ffn, hidden),
                  p + "mlp.down_proj.weight": w(hidden, ffn),
                  p + "input_layernorm.weight": w(hidden),
                  p + "post_attention_layernorm.weight": w(hidden)})
    t["model.rotary_emb.inv_freq"] = np.linspace(0, 1, 8, dtype=np.float32)
    t["model.position_ids"] = np.arange(12, dtype=np.int64).reshape(3, 4)
    t["model.mask"] = rng.integers(0, 2, (3, 5)).astype(np.bool_)
    t["model.step"] = np.array(7, dtype=np.int32)
    t["model.empty"] = np.zeros((0, 4), dtype=np.float32)
    return t


def tp_axis(name):
    """The axis the HF Llama rules split, or None (replicated)."""
    parts = name.split(".")
    if len(parts) < 2:
        return None
    mod, leaf = parts[-2], parts[-1]
    if mod in COLUMN or mod in VOCAB:
        return 0
    if mod in ROW and leaf == "weight":
        return 1
    return None


def shards(tensors, tp, axis_of=tp_axis):
    """What rank r's file must hold: each split tensor's r-th of tp equal
    slices along its axis, every other tensor whole."""
    out = [{} for _ in range(tp)]
    for k, a in tensors.items():
        ax = axis_of(k)
        for r in range(tp):
            part = a if ax is None else np.split(a, tp, axis=ax)[r]
            out[r][k] = part.copy(order="C")  # (ascontiguousarray makes 0-d 1-d)
    return out


def view_files(tp):
    if tp == 1:
        return ["model.safetensors"]
    return [f"model-rank-{r}-part-0.safetensors" for r in range(tp)]


def read_st(path):
    """Every tensor of a file through the real parser (bf16 included)."""
    out = {}
    with open(path, "rb") as f:
        for k, v in safetensors.deserialize(f.read()):
            out[k] = np.frombuffer(bytes(v["data"]), dtype=DTYPES[v["dtype"]]
                                   ).reshape(v["shape"])
    return out


def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def same(got, want, what):
    assert got.dtype == want.dtype and got.shape == want.shape, \
        (what, got.dtype, want.dtype, got.shape, want.shape)
    assert got.tobytes() == want.tobytes(), what


def check_view(mnt, tensors, tp, meta=None, extra_names=(), axis_of=tp_axis):
    """Names, sizes, bytes (against the real writer) and values of every
    view file; passthrough files byte-identical."""
    names = view_files(tp)
    assert sorted(os.listdir(mnt)) == sorted(names + list(extra_names))
    want = shards(tensors, tp, axis_of)
    for r, name in enumerate(names):
        path = mnt / name
        exp = save(want[r], metadata=meta or {"format": "pt"})
        assert os.path.getsize(path) == len(exp), name
        assert path.read_bytes() == exp, name
        got = read_st(path)
        assert sorted(got) == sorted(want[r]), name
        for k in want[r]:
            same(got[k], want[r][k], (name, k))
    return want


# ------------------------------------------------------------------ sources

def write_single(d, tensors, metadata=None, extra=PASSTHROUGH):
    d.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(d / "model.safetensors"),
              metadata={"format": "pt"} if metadata is None else metadata)
    for name, data in extra.items():
        (d / name).write_bytes(data)
    return d


def write_sharded(d, tensors, nfiles=3, sub=""):
    """As transformers' save_pretrained shards: files of consecutive
    tensors named model-0000i-of-0000n.safetensors, each with
    {"format": "pt"}, and the index (indent 2, sorted keys)."""
    d.mkdir(parents=True, exist_ok=True)
    keys = list(tensors)
    parts = np.array_split(np.arange(len(keys)), nfiles)
    weight_map, total = {}, 0
    for i, idx in enumerate(parts):
        name = f"{sub}model-{i + 1:05d}-of-{nfiles:05d}.safetensors"
        part = {keys[j]: tensors[keys[j]] for j in idx}
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        save_file(part, str(d / name), metadata={"format": "pt"})
        for k, a in part.items():
            weight_map[k] = name
            total += a.nbytes
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (d / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    for name, data in PASSTHROUGH.items():
        (d / name).write_bytes(data)
    return d


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    base = tmp_path_factory.mktemp("st")
    f32, bf16 = llama(np.float32), llama(ml_dtypes.bfloat16, seed=1)
    return {"f32": (write_single(base / "f32", f32), f32),
            "bf16": (write_single(base / "bf16", bf16), bf16),
            "sharded": (write_sharded(base / "sharded", bf16), bf16)}


# ------------------------------------------------------------------ views

@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("kind", ["f32", "bf16", "sharded"])
def test_view_of_safetensors(models, mount, kind, tp):
    """Every file of the tp view is what the real writer writes for the
    oracle's shards; the index and source tensor files are gone, the
    other files pass through."""
    src, tensors = models[kind]
    m = mount(src, [f"tp={tp}"])
    check_view(m.mnt, tensors, tp, extra_names=PASSTHROUGH)
    for name, data in PASSTHROUGH.items():
        assert (m.mnt / name).read_bytes() == data
    stats = json.loads((m.mnt / ".reshardfs" / "stats").read_text())
    assert stats["format"] == "safetensors"


def test_safe_open_numpy(models, mount):
    """safe_open(framework="numpy") reads every f32 rank file: sliced
    reads (get_slice) too."""
    src, tensors = models["f32"]
    m = mount(src, ["tp=2"])
    want = shards(tensors, 2)
    for r, name in enumerate(view_files(2)):
        with safe_open(str(m.mnt / name), framework="numpy") as f:
            assert f.metadata() == {"format": "pt"}
            assert sorted(f.keys()) == sorted(want[r])
            for k in f.keys():
                same(f.get_tensor(k), want[r][k], (name, k))
            q = "model.layers.1.self_attn.o_proj.weight"
            assert np.array_equal(f.get_slice(q)[3:9], want[r][q][3:9])


@needs_mcore
def test_torch_loads_bf16_view(models, mount, tmp_path):
    """safetensors.torch.load_file (what vLLM's sharded_state loader calls)
    reads the bf16 rank files; bits equal the oracle's."""
    src, tensors = models["sharded"]
    m = mount(src, ["tp=4"])
    out = tmp_path / "torch.npz"
    run_py("-c", r'''
import sys, numpy as np, torch
from safetensors.torch import load_file
arrays = {}
for r in range(4):
    for k, t in load_file(f"{sys.argv[1]}/model-rank-{r}-part-0.safetensors").items():
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        elif t.dtype == torch.bool:
            t = t.to(torch.uint8)
        arrays[f"{r}/{k}"] = t.numpy()
np.savez(sys.argv[2], **arrays)
''', m.mnt, out)
    got = dict(np.load(out))
    want = shards(tensors, 4)
    assert len(got) == 4 * len(tensors)
    for r in range(4):
        for k, a in want[r].items():
            g = got[f"{r}/{k}"]
            assert g.shape == a.shape and g.tobytes() == a.tobytes(), (r, k)


def test_cp_r(models, mount, tmp_path):
    """cp -r of a tp=2 view gives the same files, byte for byte."""
    src, tensors = models["bf16"]
    m = mount(src, ["tp=2"])
    dst = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(m.mnt), str(dst)], check=True,
                   timeout=120)
    check_view(dst, tensors, 2, extra_names=PASSTHROUGH)


@pytest.mark.parametrize("tp", [1, 2])
def test_dtype_view(models, mount, tp):
    """f32 shown as bf16: float tensors converted as ml_dtypes does (round
    to nearest even), header dtypes BF16, integers and bools untouched."""
    src, tensors = models["f32"]
    m = mount(src, [f"tp={tp}", "dtype=bf16"])
    conv = {k: a.astype(ml_dtypes.bfloat16) if a.dtype == np.float32 else a
            for k, a in tensors.items()}
    check_view(m.mnt, conv, tp, extra_names=PASSTHROUGH)
    h = header(m.mnt / view_files(tp)[0])
    assert h["model.norm.weight"]["dtype"] == "BF16"
    assert h["model.position_ids"]["dtype"] == "I64"
    assert h["model.mask"]["dtype"] == "BOOL"


def test_zarr_view_of_safetensors(models, mount):
    """-o format=zarr: one zarr array per tensor, chunked on the target
    grid, read by zarr-python equal to the source."""
    src, tensors = models["f32"]
    m = mount(src, ["tp=2", "format=zarr"])
    for k, a in tensors.items():
        meta = json.loads((m.mnt / k / ".zarray").read_text())
        chunks = list(a.shape)
        ax = tp_axis(k)
        if ax is not None:
            chunks[ax] //= 2
        assert meta["shape"] == list(a.shape), k
        if a.size:
            assert meta["chunks"] == chunks, k
        got = zarr.open(str(m.mnt / k), mode="r")[...]
        assert got.shape == a.shape and np.array_equal(got, a), k
    for name, data in PASSTHROUGH.items():
        assert (m.mnt / name).read_bytes() == data


@needs_mcore
def test_torch_dist_view_of_safetensors(models, mount, tmp_path):
    """-o format=torch_dist at tp=2: torch's DCP reader loads every tensor
    equal to the source."""
    from test_torch_dist import dcp_oracle
    src, tensors = models["sharded"]
    m = mount(src, ["tp=2", "format=torch_dist"])
    got = dcp_oracle(m.mnt, tmp_path)
    assert set(got) == set(tensors) and "model.empty" in got
    for k, g in got.items():
        a = tensors[k]
        assert g.shape == a.shape and g.tobytes() == a.tobytes(), k


def test_metadata_kept(tmp_path, mount):
    """__metadata__ of the source survives (every key); without one the
    view says {"format": "pt"}, as transformers expects."""
    t = llama(np.float32, layers=1)
    src = write_single(tmp_path / "meta", t,
                       metadata={"format": "pt", "producer": "x\"y\n"})
    m = mount(src, ["tp=2"])
    for name in view_files(2):
        with safe_open(str(m.mnt / name), framework="numpy") as f:
            assert f.metadata() == {"format": "pt", "producer": "x\"y\n"}
    bare = tmp_path / "bare"
    bare.mkdir()
    save_file(t, str(bare / "weights.safetensors"))   # no __metadata__
    m2 = mount(bare, ["tp=1"])
    check_view(m2.mnt, t, 1)


def test_index_in_subdirectory_and_stray_files(tmp_path, mount):
    """An index may name files in a subdirectory; top-level tensor files it
    does not name (a consolidated copy) are not part of the view."""
    t = llama(np.float32, layers=1)
    src = write_sharded(tmp_path / "sub", t, nfiles=2, sub="weights/")
    save_file({"other": np.zeros(3, np.float32)},
              str(src / "consolidated.safetensors"))
    (src / "original").mkdir()
    (src / "original" / "params.json").write_text('{"dim": 64}')
    m = mount(src, ["tp=2"])
    check_view(m.mnt, t, 2, extra_names=list(PASSTHROUGH) + ["original"])
    assert os.listdir(m.mnt / "original") == ["params.json"]
    assert (m.mnt / "original" / "params.json").read_text() == '{"dim": 64}'



def test_names_kept_verbatim(tmp_path, mount, failing_mount):
    """Keys are names, not paths: "a/b" and non-ASCII names survive the
    safetensors view; the zarr view, where they would become paths,
    refuses the one with a slash."""
    t = {"a/b": np.arange(4, dtype=np.float32),
         "é.w\tx": np.ones((2, 2), np.float16)}
    src = tmp_path / "names"
    src.mkdir()
    save_file(t, str(src / "model.safetensors"))
    m = mount(src, ["tp=1"])
    check_view(m.mnt, t, 1)
    rc, err = failing_mount(src, ["format=zarr"])
    assert_refused(rc, err, "a/b", "cannot be a directory name")


def test_vocab_padding(models, mount):
    """-o vocab_size=250 at tp=4 pads embed_tokens and lm_head to
    ceil(250/(128*4))*512 = 512 rows: ranks 2 and 3 hold zeros only."""
    src, tensors = models["bf16"]
    m = mount(src, ["tp=4", "vocab_size=250"])
    padded = dict(tensors)
    for k in ("model.embed_tokens.weight", "lm_head.weight"):
        a = np.zeros((512, tensors[k].shape[1]), tensors[k].dtype)
        a[:256] = tensors[k]
        padded[k] = a
    check_view(m.mnt, padded, 4, extra_names=PASSTHROUGH)


def test_read_amplification(models, mount):
    """Reading every rank file of a tp=4 view reads each source byte
    about once (split rows are gathered, never whole tensors per rank)."""
    src, tensors = models["f32"]
    m = mount(src, ["tp=4"])
    total = sum(os.path.getsize(m.mnt / n) for n in view_files(4))
    for n in view_files(4):
        (m.mnt / n).read_bytes()

    def stats():
        return json.loads((m.mnt / ".reshardfs" / "stats").read_text())
    # The daemon counts a read after replying to it: wait for the last.
    assert wait_for(lambda: bytes_delivered(stats()) >= total)
    st = stats()
    assert st["source_bytes_read"] <= bytes_delivered(st) * 1.01 + 65536


def test_tp1_served_from_source(models, mount):
    """A tp=1 view without a dtype change is the source's bytes under a
    new header: every tensor is read straight from the source file (no
    cache block is built)."""
    src, tensors = models["bf16"]
    m = mount(src, ["tp=1"])
    data = (m.mnt / "model.safetensors").read_bytes()
    assert data == save(tensors, metadata={"format": "pt"})

    def stats():
        return json.loads((m.mnt / ".reshardfs" / "stats").read_text())
    assert wait_for(lambda: bytes_delivered(stats()) >= len(data))
    assert stats()["cache_misses"] == 0
    assert os.getxattr(m.mnt / "model.safetensors",
                       "user.reshardfs.sources").decode().count(
                           "model.safetensors") >= 1


def test_uneven_split_refused(models, failing_mount):
    src, _ = models["f32"]
    rc, err = failing_mount(src, ["tp=3"])
    assert_refused(rc, err, "cannot be split evenly")


# ------------------------------------------- other sources as safetensors

def _zarr_shards(exp, key, tp):
    """Rank shards of one array of a zarr view: its chunks along the TP
    axis whose index is r mod tp, concatenated in order (a gated fc1's
    [W_r; V_r] per layer)."""
    va = exp.view_array(key)
    a = exp.full_array(key)
    dt = va.src.meta["dtype"]
    a = a.view(ml_dtypes.bfloat16 if dt == "bfloat16" else np.dtype(dt))
    _, _, ax = classify(key)
    if ax is None or ax >= a.ndim or not a.shape[ax]:
        return [a] * tp
    pieces = np.split(a, a.shape[ax] // va.chunks[ax], axis=ax)
    return [np.concatenate(pieces[r::tp], axis=ax) for r in range(tp)]


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_safetensors_view_of_zarr(sample, mount, tp):
    """A Megatron zarr sample (bf16 params, fp32 optimizer states,
    layer-stacked gated fc1, padded vocab) as safetensors: names as
    stored, each rank's shard as the oracle cuts it; byte items and
    metadata.json are left out, common.pt passes through."""
    src = sample(2)
    exp = ExpectedView(src, tp)
    m = mount(src, [f"tp={tp}", "format=safetensors"])
    assert sorted(os.listdir(m.mnt)) == sorted(view_files(tp) + ["common.pt"])
    want = [{} for _ in range(tp)]
    for key in exp.array_keys():
        for r, part in enumerate(_zarr_shards(exp, key, tp)):
            want[r][key] = part.copy(order="C")
    for r, name in enumerate(view_files(tp)):
        assert (m.mnt / name).read_bytes() == \
            save(want[r], metadata={"format": "pt"}), name
        got = read_st(m.mnt / name)
        for key in want[r]:
            same(got[key], want[r][key], (name, key))


@needs_mcore
def test_safetensors_view_of_plain_dcp(mount, tmp_path):
    """torch's own DCP writer (transposed and strided storages, 0-d, empty,
    bf16, int64) shown as safetensors: every tensor as torch reads it."""
    from test_torch_dist import PLAIN_DCP, dcp_oracle
    src = tmp_path / "dcp"
    run_py("-c", PLAIN_DCP, src)
    want = dcp_oracle(src, tmp_path / "o")
    m = mount(src, ["format=safetensors"])
    assert os.listdir(m.mnt) == ["model.safetensors"]
    h = header(m.mnt / "model.safetensors")
    got = read_st(m.mnt / "model.safetensors")
    assert sorted(got) == sorted(want)
    for k, a in want.items():
        g = got[k]
        if h[k]["dtype"] == "BF16":
            g = g.view(np.int16)
        assert g.shape == a.shape and g.tobytes() == a.tobytes(), k


# ------------------------------------------------------------------ refusals

def raw_file(path, head, data=b"", n=None):
    """A safetensors file by hand: `head` (a dict, dumped compactly, or raw
    bytes), padded to 8, with header length `n` (default: the true one)."""
    h = head if isinstance(head, bytes) else \
        json.dumps(head, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h) if n is None else n) + h + data)


def T(dtype="F32", shape=(4,), offs=(0, 16)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offs)}


BAD_FILES = {
    # name: (header, data, header length, needles)
    "past_end": ({"a": T()}, bytes(16), 4096,
                 ["header length 4096 runs past the end of the file"]),
    "too_large": ({"a": T()}, bytes(16), 100_000_001,
                  ["header length 100000001 is over the 100000000-byte limit"]),
    "overlap": ({"a": T(offs=(0, 16)), "b": T(offs=(8, 24))}, bytes(24),
                None, ['tensor "b"', "overlaps the tensor before it"]),
    "hole": ({"a": T(offs=(0, 16)), "b": T(offs=(20, 36))}, bytes(36), None,
             ['tensor "b"', "leaving a hole after byte 16"]),
    "out_of_file": ({"a": T()}, bytes(8), None,
                    ["past the end of the file"]),
    "trailing": ({"a": T()}, bytes(20), None,
                 ["4 bytes follow the last tensor's data"]),
    "wrong_bytes": ({"a": T(offs=(0, 12))}, bytes(12), None,
                    ['tensor "a"', "hold 12 bytes", "[4] of F32 needs 16"]),
    "reversed": ({"a": T(offs=(16, 0))}, bytes(16), None,
                 ['tensor "a"', "end before they begin"]),
    "u16": ({"a": T("U16", offs=(0, 8))}, bytes(8), None,
            ['tensor "a"', "dtype U16, which is not supported"]),
    "c64": ({"a": T("C64", offs=(0, 32))}, bytes(32), None,
            ["dtype C64, which is not supported"]),
    "dup_key": (b'{"a":' + json.dumps(T()).encode() + b',"a":' +
                json.dumps(T()).encode() + b'}', bytes(16), None,
                ['duplicate key "a"']),
    "dup_field": (b'{"a":{"dtype":"F32","dtype":"I32","shape":[4],'
                  b'"data_offsets":[0,16]}}', bytes(16), None,
                  ['tensor "a" gives "dtype" twice']),
    "dup_meta": (b'{"__metadata__":{"k":"1","k":"2"},"a":' +
                 json.dumps(T()).encode() + b'}', bytes(16), None,
                 ['"__metadata__" gives "k" twice']),
    "meta_not_str": ({"__metadata__": {"k": 1}, "a": T()}, bytes(16), None,
                     ['"__metadata__" value of "k" is not a string']),
    "non_utf8": (b'{"a\xff":' + json.dumps(T()).encode() + b'}', bytes(16),
                 None, ["header is not valid UTF-8"]),
    "nul_escape": ({"a\0b": T()}, bytes(16), None, ["NUL character"]),
    "raw_nul": (b'{"a\x00b":' + json.dumps(T()).encode() + b'}', bytes(16),
                None, ["NUL character"]),
    "not_object": (b'[1, 2]', b"", None, ["not a JSON object"]),
    "after_json": (b'{} {}', b"", None, ["bytes after the JSON object"]),
    "entry_not_object": ({"a": 5}, b"", None,
                         ['tensor "a" is not an object']),
    "negative_shape": ({"a": T(shape=(-4,))}, bytes(16), None,
                       ['"shape"[0] is not a non-negative integer']),
    "fractional_shape": ({"a": T(shape=(1.5,))}, bytes(16), None,
                         ["(1.5) is not an integer literal"]),
    "nine_axes": ({"a": T(shape=(1,) * 9, offs=(0, 4))}, bytes(4), None,
                  ["has 9 axes; at most 8"]),
    "one_offset": ({"a": {"dtype": "F32", "shape": [4],
                          "data_offsets": [16]}}, bytes(16), None,
                   ['"data_offsets" is not a pair']),
    "overflow": ({"a": T(shape=(2**40, 2**40), offs=(0, 16))}, bytes(16),
                 None, ["overflows 64-bit byte sizes"]),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_file_refused(tmp_path, failing_mount, case):
    head, data, n, needles = BAD_FILES[case]
    src = tmp_path / case
    src.mkdir()
    raw_file(src / "model.safetensors", head, data, n)
    rc, err = failing_mount(src, ["tp=1"])
    assert_refused(rc, err, f"{src}/model.safetensors", *needles)


def test_short_file_refused(tmp_path, failing_mount):
    src = tmp_path / "short"
    src.mkdir()
    (src / "model.safetensors").write_bytes(b"\x08\x00")
    rc, err = failing_mount(src, ["tp=1"])
    assert_refused(rc, err, "model.safetensors",
                   "too short for the 8-byte header length")


def test_hand_written_order_accepted(tmp_path, mount):
    """Ranges in any order in the header (older writers sorted by name),
    a 0-d tensor and an empty one: read by offsets, as the reference
    parser does."""
    src = tmp_path / "order"
    src.mkdir()
    a = np.arange(6, dtype=np.float32)
    b = np.arange(3, dtype=np.int16)
    head = {"z": T("F32", (2, 3), (6, 30)), "y": T("I16", (3,), (0, 6)),
            "e": T("F32", (0, 2), (30, 30)), "s": T("U8", (), (30, 31))}
    raw_file(src / "x.safetensors", head,
             b.tobytes() + a.tobytes() + b"\x09")
    m = mount(src, ["tp=1"])
    check_view(m.mnt, {"z": a.reshape(2, 3), "y": b,
                       "e": np.zeros((0, 2), np.float32),
                       "s": np.array(9, np.uint8)}, 1)


def _index(d, weight_map, extra=None):
    doc = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    text = json.dumps(doc) if extra is None else extra
    (d / INDEX).write_text(text)


def _two_files(d):
    d.mkdir()
    save_file({"a": np.zeros(4, np.float32), "c": np.ones(2, np.float32)},
              str(d / "m1.safetensors"))
    save_file({"b": np.zeros(4, np.float32)}, str(d / "m2.safetensors"))


M1, M2 = "m1.safetensors", "m2.safetensors"
BAD_INDEXES = {
    "missing_file": ({"a": M1, "c": M1, "b": "m3.safetensors"},
                     [INDEX, 'names "m3.safetensors", which is not a file']),
    "not_in_file": ({"a": M1, "c": M1, "b": M2, "d": M2},
                    [INDEX, f'lists tensor "d" in {M2}, which does not '
                     'hold it']),
    "not_listed": ({"a": M1, "b": M2},
                   [M1, f'holds tensor "c", which {INDEX} does not list']),
    "other_file": ({"a": M2, "c": M1, "b": M2},
                   [M1, f'holds tensor "a", which {INDEX} lists in {M2}']),
    "dotdot": ({"a": "../m1.safetensors", "c": M1, "b": M2},
               [INDEX, 'names "../m1.safetensors", not a file name']),
    "absolute": ({"a": "/etc/passwd", "b": M2},
                 [INDEX, 'names "/etc/passwd", not a file name']),
    "empty_part": ({"a": "sub//m1.safetensors", "b": M2},
                   [INDEX, 'names "sub//m1.safetensors", not a file name']),
}


@pytest.mark.parametrize("case", sorted(BAD_INDEXES))
def test_bad_index_refused(tmp_path, failing_mount, case):
    weight_map, needles = BAD_INDEXES[case]
    src = tmp_path / case
    _two_files(src)
    _index(src, weight_map)
    rc, err = failing_mount(src, ["tp=1"])
    assert_refused(rc, err, *needles)


@pytest.mark.parametrize("text,needle", [
    ('{"metadata": {}}', 'no "weight_map" object'),
    ('{"weight_map": {"a": "m1.safetensors", "a": "m1.safetensors"}}',
     'lists tensor "a" twice'),
    ('{"weight_map": {"a": 1}}', 'entry of tensor "a" is not a file name'),
    ('{"weight_map": {}, "weight_map": {}}', 'duplicate key "weight_map"'),
    ('{"weight_map": {"a": "m1.safetensors"}', "not a JSON object"),
])
def test_malformed_index_refused(tmp_path, failing_mount, text, needle):
    src = tmp_path / "idx"
    _two_files(src)
    (src / INDEX).write_text(text)
    rc, err = failing_mount(src, ["tp=1"])
    assert_refused(rc, err, INDEX, needle)


def test_tensor_in_two_files_refused(tmp_path, failing_mount):
    src = tmp_path / "twice"
    src.mkdir()
    save_file({"a": np.zeros(4, np.float32)}, str(src / "m1.safetensors"))
    save_file({"a": np.ones(4, np.float32)}, str(src / "m2.safetensors"))
    rc, err = failing_mount(src, ["tp=1"])
    assert_refused(rc, err, "m2.safetensors", 'tensor "a" is also in',
                   "m1.safetensors")


def test_every_bad_file_reported(tmp_path, failing_mount):
    """Two broken files: both are named, one line each."""
    src = tmp_path / "two_bad"
    src.mkdir()
    raw_file(src / "a.safetensors", {"a": T()}, bytes(8))
    raw_file(src / "b.safetensors", {"b": T("U32")}, bytes(16))
    rc, err = failing_mount(src, ["tp=1"])
    lines = error_lines(err)
    assert any("a.safetensors" in ln and "past the end" in ln
               for ln in lines), err
    assert any("b.safetensors" in ln and "U32" in ln for ln in lines), err
