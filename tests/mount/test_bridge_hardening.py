"""Hostile records the bridges and the facts readers meet (issue 25), each
through a real mount: stacks of tensors whose dtypes differ, numbers out
of range in config.json, hf_config and Megatron's args, a rules pattern
that would backtrack forever, rows that would make one target twice or
clash with a file of the view, args strings too long for a fixed buffer,
non-finite floats, and rank files that disagree.

Writers: transformers' save_pretrained (scripts/make_hf_llama.py), then
safetensors and json to change one record; Megatron-LM's legacy per-rank
form (scripts/make_legacy_checkpoint.py), then torch.save of the args
changed.  Oracles: numpy for the bytes of what mounts; the refusals must
be one line naming the record, the field and the value (or both rows,
both tensors).
"""
import json
import shutil

import numpy as np
import pytest
import zarr
from safetensors.numpy import load_file, save_file

from mcore import REPO, needs_mcore, run_py
from test_bad_input import assert_refused

pytestmark = needs_mcore

HF_WRITER = REPO / "scripts" / "make_hf_llama.py"
LEGACY_WRITER = REPO / "scripts" / "make_legacy_checkpoint.py"
ST = "model.safetensors"


def written_once(name, writer, *args):
    """Fixtures `name`_base, the checkpoint `writer` writes once for the
    module, and `name`, a copy of it each test may change."""
    @pytest.fixture(scope="module", name=f"{name}_base")
    def base(tmp_path_factory):
        d = tmp_path_factory.mktemp(name) / name
        run_py(writer, d, *args)
        return d

    @pytest.fixture(name=name)
    def copy(request, tmp_path):
        d = tmp_path / name
        shutil.copytree(request.getfixturevalue(f"{name}_base"), d)
        return d
    return base, copy


# a float32 HF Llama of 2 layers, saved by transformers
hf_base, hf = written_once("hf", HF_WRITER, "--layers", "2")


def restore(d, change):
    """Rewrites d's weights with change(tensors) applied (save_file)."""
    t = load_file(str(d / ST))
    change(t)
    save_file(t, str(d / ST), metadata={"format": "pt"})


def set_config(d, **fields):
    p = d / "config.json"
    cfg = json.loads(p.read_text())
    cfg.update(fields)
    p.write_text(json.dumps(cfg))


# ------------------------------------------------- stacks of one dtype

@pytest.mark.parametrize("name,dtype", [
    ("model.layers.1.self_attn.o_proj.weight", np.float16),
    ("model.layers.1.mlp.down_proj.weight", np.float64),
    ("model.layers.1.input_layernorm.weight", np.float16),
    # gate and up of one layer are concatenated into linear_fc1
    ("model.layers.0.mlp.up_proj.weight", np.float16),
    # q, k and v of one layer are fused into linear_qkv
    ("model.layers.0.self_attn.v_proj.weight", np.float64),
])
def test_mixed_dtypes_refused(hf, failing_mount, name, dtype):
    """A target made of stored tensors of two dtypes would be labelled
    with the first one's and read the others' bytes as that dtype."""
    restore(hf, lambda t: t.__setitem__(name, t[name].astype(dtype)))
    want = {np.float16: "float16", np.float64: "float64"}[dtype]
    for view in ("torch_dist", "zarr"):
        rc, err = failing_mount(hf, ["names=mcore", f"format={view}"])
        assert_refused(rc, err, name, f"({want})", "(float32)", "one dtype")


def test_one_dtype_mounts(hf, mount):
    """The same directory in one dtype (float16 throughout) mounts, and the
    stacked tensor holds every layer's stored values."""
    restore(hf, lambda t: t.update({k: v.astype(np.float16)
                                    for k, v in t.items()}))
    stored = load_file(str(hf / ST))
    m = mount(hf, ["names=mcore", "format=zarr", "tp=1"])
    got = zarr.open(str(m.mnt / "decoder.layers.self_attention.linear_proj.weight"),
                    mode="r")[...]
    assert got.dtype == np.float16
    for layer in range(2):
        assert np.array_equal(
            got[layer], stored[f"model.layers.{layer}.self_attn.o_proj.weight"])


# -------------------------------------------- numbers before narrowing

@pytest.mark.parametrize("field,value,shown", [
    ("num_key_value_heads", 2 ** 32, "4294967296"),        # was SIGFPE
    ("num_key_value_heads", 1e30, "1e+30"),                # was SIGFPE
    ("num_key_value_heads", 2 ** 32 + 4, "4294967300"),    # was 4 groups
    ("num_attention_heads", 2 ** 40, "1099511627776"),
    ("num_key_value_heads", 3, "3 does not divide"),
    ("vocab_size", 1e30, "1e+30"),
    ("max_position_embeddings", -1, "-1"),
    ("rope_theta", 1e300, "1.0000000000000001e+300"),
    ("tie_word_embeddings", 2, "2"),
])
def test_config_number_out_of_range(hf, failing_mount, field, value, shown):
    set_config(hf, **{field: value})
    for opts in (["names=mcore"], ["tp=1"]):
        rc, err = failing_mount(hf, opts)
        assert_refused(rc, err, "config.json", field, shown)


# ------------------------------------------------------- rules patterns

def long_named(hf, name):
    """hf with one more tensor, `name`."""
    restore(hf, lambda t: t.__setitem__(name, np.arange(4, dtype=np.float32)))


def test_star_pattern_is_bounded(hf, tmp_path, failing_mount, mount):
    """40 '*.' against a name of 300 dots: a backtracking matcher would
    try ~C(300, 40) splits; the mount answers within its usual deadline,
    whether the row matches or not."""
    name = "x." * 300 + "tail"
    long_named(hf, name)
    rules = tmp_path / "rules.json"
    row = {"family": "llama", "from": "hf", "to": "mcore", "target": None}
    rules.write_text(json.dumps({"names": [
        dict(row, sources=["*." * 40 + "nomatch"])]}))
    rc, err = failing_mount(hf, ["names=mcore", f"rules={rules}"])
    assert_refused(rc, err, name[:40], "has no mcore name")
    rules.write_text(json.dumps({"names": [
        dict(row, sources=["*." * 40 + "tail"])]}))
    m = mount(hf, ["names=mcore", f"rules={rules}"])
    assert (m.mnt / "common.pt").exists()


def test_star_only_in_drop_rows(hf, tmp_path, failing_mount):
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"names": [
        {"family": "llama", "from": "hf", "to": "mcore",
         "target": "decoder.extra.weight", "sources": ["model.*.weight"]}]}))
    rc, err = failing_mount(hf, ["names=mcore", f"rules={rules}"])
    assert_refused(rc, err, str(rules), "names row 0", "'*'", "null")


# ------------------------------------------------------ rows that clash

def rules_file(tmp_path, target, source):
    p = tmp_path / "rules.json"
    p.write_text(json.dumps({"names": [
        {"family": "llama", "from": "hf", "to": "mcore", "target": target,
         "sources": [source]}]}))
    return p


def test_user_row_taking_a_builtin_target_refused(hf, tmp_path,
                                                  failing_mount):
    """model.norm.weight would silently leave the view."""
    long_named(hf, "model.extra_norm.weight")
    rules = rules_file(tmp_path, "decoder.final_layernorm.weight",
                       "model.extra_norm.weight")
    rc, err = failing_mount(hf, ["names=mcore", f"rules={rules}"])
    assert_refused(rc, err, "decoder.final_layernorm.weight",
                   "made twice", "names row", str(rules),
                   "model.extra_norm.weight", "row", "of family llama",
                   "model.norm.weight")


def test_one_row_from_two_tensors_refused(hf, tmp_path, failing_mount):
    """A target without the layer pattern from a per-layer source: every
    layer but the first would be dropped."""
    rules = rules_file(tmp_path, "decoder.final_layernorm.weight",
                       "model.layers.#.post_attention_layernorm.weight")
    rc, err = failing_mount(hf, ["names=mcore", f"rules={rules}"])
    assert_refused(rc, err, "made twice", "model.layers.0.post_attention_layernorm.weight",
                   "model.layers.1.post_attention_layernorm.weight")


def test_user_row_overriding_builtin_from_same_tensor(hf, tmp_path, mount):
    """A user's row for a built-in target from the same stored tensor is an
    override, not a clash: it mounts, with the stored bytes."""
    rules = rules_file(tmp_path, "decoder.final_layernorm.weight",
                       "model.norm.weight")
    m = mount(hf, ["names=mcore", "format=zarr", f"rules={rules}"])
    got = zarr.open(str(m.mnt / "decoder.final_layernorm.weight"), mode="r")[...]
    assert np.array_equal(got, load_file(str(hf / ST))["model.norm.weight"])


def test_target_clashing_with_a_view_file(hf, tmp_path, failing_mount):
    rules = rules_file(tmp_path, "common.pt", "model.norm.weight")
    rc, err = failing_mount(hf, ["names=mcore", "format=zarr",
                                 f"rules={rules}"])
    assert_refused(rc, err, "two things at common.pt", "tensor common.pt",
                   "names row", str(rules))


# --------------------------------------------------- Megatron's args

# Megatron-LM's legacy Llama form at tp 2, args telling every fact
legacy_base, legacy = written_once("legacy", LEGACY_WRITER, "--tp", 2,
                                   "--pp", 1, "--llama", "--untied")


RANKS = ["iter_0000010/mp_rank_00/model_optim_rng.pt",
         "iter_0000010/mp_rank_01/model_optim_rng.pt"]

SET_ARGS = """
import math, sys, torch
import torch.utils.cpp_extension as cpp_ext   # no JIT CUDA build on the CPU
def no_jit(*a, **k):
    raise RuntimeError("JIT CUDA extensions disabled (CPU-only run)")
cpp_ext.load_inline = no_jit
path, changes = sys.argv[1], eval(sys.argv[2], {"inf": math.inf, "nan": math.nan})
sd = torch.load(path, weights_only=False)
for k, v in changes.items():
    setattr(sd["args"], k, v)
torch.save(sd, path)
"""


def set_args(d, changes, ranks=RANKS):
    """torch.save every rank file of `ranks` with args fields changed
    (`changes`: a dict, or its Python text, where inf and nan may appear)."""
    for r in ranks:
        run_py("-c", SET_ARGS, d / r,
               changes if isinstance(changes, str) else repr(changes))


@pytest.mark.parametrize("changes,needles", [
    ({"position_embedding_type": "learned_absolute"},
     ['position_embedding_type is "learned_absolute"', "llama.json",
      '["rope"]']),
    ({"normalization": "LayerNormWithAVeryLongName"},
     ['normalization is "LayerNormWithAVeryLongName"', "llama.json",
      '["RMSNorm"]']),
])
def test_long_args_strings_checked(legacy, failing_mount, changes, needles):
    """16 bytes or more no longer read as unknown (which passed the Llama
    check)."""
    set_args(legacy, changes)
    rc, err = failing_mount(legacy, ["format=hf"])
    assert_refused(rc, err, "args", *needles)


@pytest.mark.parametrize("changes,needles", [
    ('{"rotary_base": inf}', ["args.rotary_base is inf", "finite"]),
    ('{"norm_epsilon": nan}', ["args.norm_epsilon is nan", "finite"]),
    ({"num_attention_heads": 2 ** 32}, ["args.num_attention_heads is 4294967296"]),
    ({"kv_channels": -8}, ["args.kv_channels is -8"]),
    ({"vocab_size": "1000"}, ["args.vocab_size is '1000'", "integer"]),
])
def test_args_out_of_range_refused(legacy, failing_mount, changes, needles):
    """Whatever the view: the facts of every mount come from these args."""
    set_args(legacy, changes)
    for opts in (["tp=1"], ["format=hf"]):
        rc, err = failing_mount(legacy, opts)
        assert_refused(rc, err, "mp_rank_00/model_optim_rng.pt", *needles)


@pytest.mark.parametrize("field,value,shown", [
    ("num_attention_heads", 8, "8"),
    ("rotary_base", 500000, "500000"),
    ("position_embedding_type", "learned_absolute", "'learned_absolute'"),
    ("hidden_size", 96, "96"),
])
def test_ranks_disagree(legacy, failing_mount, field, value, shown):
    """Rank 1 says another thing of the model than rank 0, whose facts the
    view would take."""
    set_args(legacy, {field: value}, ranks=RANKS[1:])
    rc, err = failing_mount(legacy, ["tp=1"])
    assert_refused(rc, err, "mp_rank_01/model_optim_rng.pt", f"args.{field} is {shown}",
                   "mp_rank_00/model_optim_rng.pt")


def test_hf_config_out_of_range(legacy, tmp_path, failing_mount):
    cfg = tmp_path / "hf_config.json"
    for field, value, shown in [("vocab_size", 1e30, "1e+30"),
                                ("num_key_value_heads", 2 ** 32, "4294967296"),
                                ("hidden_size", -64, "-64")]:
        cfg.write_text(json.dumps({field: value}))
        rc, err = failing_mount(legacy, ["format=hf", f"hf_config={cfg}"])
        assert_refused(rc, err, str(cfg), field, shown)
