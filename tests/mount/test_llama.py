"""Llama both ways: a megatron-core GPTModel checkpoint as an HF
transformers model directory (-o format=hf), and an HF Llama directory
under megatron-core's names (-o names=mcore) in the zarr, torch_dist and
per-rank megatron views (the last refused: it needs a per-rank source).

megatron-core 0.15 saves the sources (scripts/make_mcore_checkpoint.py: a
tiny Llama-style GPTModel with GQA, SwiGLU, RMSNorm, RoPE, vocab 1000
padded to 1024, an RMSNorm epsilon and RoPE theta that are not the
defaults) and transformers saves the HF ones (scripts/make_hf_llama.py,
save_pretrained).  tests/mount/llama_check.py reads every view with the
real loader in .venv-mcore: AutoModelForCausalLM.from_pretrained, against
megatron-core's own forward of the source and its tensors mapped with
numpy; megatron-core's dist_checkpointing.load (StrictHandling.RAISE_ALL)
or torch.load + load_state_dict(strict=True) at TP ranks, against
transformers' forward and the HF tensors mapped and split with numpy.
"""
import json
import os
from pathlib import Path

import pytest

from mcore import REPO, needs_transformers, run_mcore, run_py
from test_bad_input import assert_erofs, assert_refused

HF_WRITER = REPO / "scripts" / "make_hf_llama.py"
CHECKER = Path(__file__).resolve().parent / "llama_check.py"


pytestmark = needs_transformers

ARCH = ["--rope-base", "50000", "--norm-eps", "1e-6"]
# name: (make_mcore_checkpoint.py layout arguments, model arguments)
MCORE = {
    # with the same model also saved the way Megatron-LM's --ckpt-format
    # torch does (mp_rank_0R/model_optim_rng.pt with args), which shares
    # the zarr's oracle
    "zarr": (["--tp", "2", "--backend", "zarr", "--legacy", "PER_RANK"],
             ARCH),
    "tied": (["--tp", "2", "--backend", "zarr"], ARCH + ["--tied"]),
    # Megatron-LM's form: args in common.pt (theta and epsilon are not
    # the defaults, so a view without hf_config shows they came from there)
    "torch_dist": (["--tp", "2", "--backend", "torch_dist", "--with-args"],
                   ARCH),
    # NeMo's form: the GPTModel's keys under "model."
    "nemo": (["--tp", "2", "--backend", "torch_dist", "--prefix", "model."],
             ARCH),
}
# what -o hf_config= must tell for the tiny model (tests/mount/llama_check.py
# checks config.json against the source's real values)
HF_CONFIG = {"num_attention_heads": 8, "num_key_value_heads": 4,
             "vocab_size": 1000, "rms_norm_eps": 1e-6, "rope_theta": 50000.0,
             "max_position_embeddings": 128, "tie_word_embeddings": False}
# name: make_hf_llama.py arguments
HF = {
    "single": [],
    "sharded": ["--max-shard-size", "100KB"],
    "tied": ["--tied"],
    "bf16": ["--dtype", "bfloat16"],
}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tmp_path_factory.mktemp("llama")


@pytest.fixture(scope="module")
def mcore_src(base):
    """mcore_src(name, per_rank=False) -> (checkpoint, oracle): the
    megatron-core checkpoint (per_rank: its per-rank form) and what
    --logits-from wrote for it (megatron-core's own forward and its
    tensors at tp=1)."""
    cache = {}

    def _make(name, per_rank=False):
        if name not in cache:
            layout, model = MCORE[name]
            src = base / f"mcore_{name}" / "iter_0000001"
            oracle = base / f"mcore_{name}.oracle"
            legacy = base / f"mcore_{name}_per_rank" / "iter_0000001"
            layout = [legacy if a == "PER_RANK" else a for a in layout]
            run_mcore(src, *layout, *model, "--oracle", oracle)
            cache[name] = (src, oracle, legacy if legacy in layout else None)
        src, oracle, legacy = cache[name]
        assert legacy or not per_rank, name
        return (legacy if per_rank else src), oracle
    return _make


@pytest.fixture(scope="module")
def hf_src(base):
    """hf_src(name) -> (HF directory, oracle with transformers' logits)."""
    cache = {}

    def _make(name):
        if name not in cache:
            d = base / f"hf_{name}"
            run_py(HF_WRITER, d, "--oracle", f"{d}.oracle", *HF[name])
            cache[name] = (d, Path(f"{d}.oracle"))
        return cache[name]
    return _make


def hf_config(tmp_path, **fields):
    """-o hf_config=FILE: HF_CONFIG with fields changed (None drops one)."""
    cfg = dict(HF_CONFIG)
    for k, v in fields.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    p = tmp_path / f"hf_config_{len(list(tmp_path.glob('hf_config_*')))}.json"
    p.write_text(json.dumps(cfg))
    return p


def hf_files(mnt):
    """The view's files, a generation_config.json aside (transformers
    writes one; a view may too)."""
    return sorted(p.name for p in Path(mnt).iterdir()
                  if p.name != "generation_config.json")


def check(*args):
    out = run_py(CHECKER, *args)
    assert out.strip().endswith("ok"), out[-4000:]
    return out


# ------------------------------------------------------ mcore -> format=hf

@pytest.mark.parametrize("name", ["zarr", "torch_dist", "nemo"])
def test_hf_view(mcore_src, mount, tmp_path, name):
    """format=hf with hf_config: config.json, one model.safetensors under
    HF names, loaded by from_pretrained with megatron's logits and
    exactly the source's bytes; hf_config fields beyond the required ones
    are copied into config.json.  (The torch_dist source also holds
    Megatron-LM args: an hf_config that agrees with them is taken.)"""
    src, oracle = mcore_src(name)
    cfg = hf_config(tmp_path, bos_token_id=1, eos_token_id=2)
    m = mount(src, ["format=hf", f"hf_config={cfg}"])
    assert hf_files(m.mnt) == ["config.json", "model.safetensors"]
    got = json.loads((m.mnt / "config.json").read_text())
    assert got["bos_token_id"] == 1 and got["eos_token_id"] == 2, got
    check("hf", m.mnt, oracle)


def test_hf_view_tied(mcore_src, mount, tmp_path):
    """A tied source: no lm_head.weight, tie_word_embeddings true."""
    src, oracle = mcore_src("tied")
    cfg = hf_config(tmp_path, tie_word_embeddings=True)
    m = mount(src, ["format=hf", f"hf_config={cfg}"])
    assert json.loads((m.mnt / "config.json").read_text())[
        "tie_word_embeddings"] is True
    check("hf", m.mnt, oracle)


def test_hf_view_from_args(mcore_src, mount):
    """Megatron-LM's args in common.pt tell everything: no hf_config."""
    src, oracle = mcore_src("torch_dist")
    m = mount(src, ["format=hf"])
    check("hf", m.mnt, oracle)


def test_hf_view_per_rank(mcore_src, mount):
    """A per-rank Megatron-LM checkpoint of the GPTModel (megatron-core
    names, layers numbered, args in every rank file): no hf_config."""
    src, oracle = mcore_src("zarr", per_rank=True)
    m = mount(src, ["format=hf"])
    assert hf_files(m.mnt) == ["config.json", "model.safetensors"]
    check("hf", m.mnt, oracle)


PER_RANK_VOCAB = """
import sys, numpy as np, torch
import torch.utils.cpp_extension as cpp_ext   # no JIT CUDA build on the CPU
def no_jit(*a, **k):
    raise RuntimeError("JIT CUDA extensions disabled (CPU-only run)")
cpp_ext.load_inline = no_jit
mnt, oracle, tp, padded = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
want = np.load(oracle + "/state.npz")
for name in ("embedding.word_embeddings.weight", "output_layer.weight"):
    parts = []
    for t in range(tp):
        sd = torch.load(f"{mnt}/mp_rank_{t:02d}/model_optim_rng.pt",
                        weights_only=False)
        assert sd["args"].padded_vocab_size == padded, sd["args"].padded_vocab_size
        assert sd["args"].tensor_model_parallel_size == tp
        parts.append(sd["model"][name].float().numpy())
    full = np.concatenate(parts)
    assert full.shape[0] == padded, (name, full.shape)
    # the rows the source stores (its padding included) as stored, zeros
    # past them
    ref = want[name]
    n = min(len(ref), padded)
    assert np.array_equal(full[:n], ref[:n]), name
    assert not full[n:].any(), name
print("ok")
"""


@pytest.mark.parametrize("tp,divisor,padded", [(4, 96, 1152), (2, 8, 1008)])
def test_per_rank_vocab_size_mcore_names(mcore_src, mount, tp, divisor,
                                         padded):
    """Per-rank files under megatron-core's names (Megatron-LM's
    --ckpt-format torch of an mcore model) re-padded by -o vocab_size=:
    every rank's args.padded_vocab_size says what the shapes are."""
    src, oracle = mcore_src("zarr", per_rank=True)
    m = mount(src, [f"tp={tp}", "vocab_size=1000",
                    f"vocab_divisor={divisor}"])
    assert run_py("-c", PER_RANK_VOCAB, m.mnt, oracle, tp,
                  padded).strip().endswith("ok")


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 2)])
def test_hf_view_legacy_llama(mount, tmp_path, tp, pp):
    """Megatron-LM's legacy model in its Llama form (per-rank files,
    query_key_value, dense_h_to_4h, input_norm), its args telling every
    fact: no hf_config."""
    src = tmp_path / "legacy"
    run_py(REPO / "scripts" / "make_legacy_checkpoint.py", src, "--tp", tp,
           "--pp", pp, "--llama", "--untied")
    m = mount(src, ["format=hf"])
    assert hf_files(m.mnt) == ["config.json", "model.safetensors"]
    check("hf_legacy", m.mnt, tmp_path / "legacy.oracle.npz")


def test_hf_view_vocab_size_option(mcore_src, mount, tmp_path):
    """The true vocab from -o vocab_size= when hf_config does not say it."""
    src, oracle = mcore_src("zarr")
    cfg = hf_config(tmp_path, vocab_size=None)
    m = mount(src, ["format=hf", f"hf_config={cfg}", "vocab_size=1000"])
    check("hf", m.mnt, oracle)


def test_hf_view_sharded(mcore_src, mount, tmp_path):
    """-o shard_size=100K: model-0000N-of-0000M.safetensors and an index
    whose weight_map lists every tensor (llama_check checks the map
    against the files), loaded by from_pretrained."""
    src, oracle = mcore_src("zarr")
    cfg = hf_config(tmp_path)
    m = mount(src, ["format=hf", f"hf_config={cfg}", "shard_size=100K"])
    names = hf_files(m.mnt)
    shards = [n for n in names if n.endswith(".safetensors")]
    assert len(shards) > 1, names
    assert names == sorted(["config.json", "model.safetensors.index.json",
                            *shards]), names
    index = json.loads((m.mnt / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == shards
    assert index["metadata"]["total_size"] == sum(
        os.path.getsize(m.mnt / s) for s in shards) - sum(
        8 + int.from_bytes((m.mnt / s).read_bytes()[:8], "little")
        for s in shards)
    check("hf", m.mnt, oracle)


def test_hf_view_without_facts_refused(mcore_src, failing_mount):
    """No args in common.pt and no hf_config: refused, naming what the
    shapes cannot tell and the option that tells it."""
    src, _ = mcore_src("zarr")
    rc, err = failing_mount(src, ["format=hf"])
    assert_refused(rc, err, "num_attention_heads", "-o hf_config=")


@pytest.mark.parametrize("field", ["rms_norm_eps", "num_key_value_heads"])
def test_hf_view_missing_field_refused(mcore_src, failing_mount, tmp_path,
                                       field):
    src, _ = mcore_src("zarr")
    cfg = hf_config(tmp_path, **{field: None})
    rc, err = failing_mount(src, ["format=hf", f"hf_config={cfg}"])
    assert_refused(rc, err, field, "-o hf_config=")


@pytest.mark.parametrize("field,value", [("num_hidden_layers", 3),
                                         ("hidden_size", 96),
                                         ("intermediate_size", 256),
                                         ("num_key_value_heads", 2)])
def test_hf_config_contradicting_shapes_refused(mcore_src, failing_mount,
                                                tmp_path, field, value):
    """hf_config fields that the stored shapes contradict are refused,
    naming the field."""
    src, _ = mcore_src("zarr")
    cfg = hf_config(tmp_path, **{field: value})
    rc, err = failing_mount(src, ["format=hf", f"hf_config={cfg}"])
    assert_refused(rc, err, field)


@pytest.mark.parametrize("field,value", [("rope_theta", 10000.0),
                                         ("rms_norm_eps", 1e-5),
                                         ("vocab_size", 1010)])
def test_hf_config_contradicting_args_refused(mcore_src, failing_mount,
                                              tmp_path, field, value):
    """An hf_config that contradicts the Megatron-LM args in common.pt is
    refused, naming the field."""
    src, _ = mcore_src("torch_dist")
    cfg = hf_config(tmp_path, **{field: value})
    rc, err = failing_mount(src, ["format=hf", f"hf_config={cfg}"])
    assert_refused(rc, err, field)


def test_hf_view_read_only(mcore_src, mount, tmp_path):
    src, _ = mcore_src("zarr")
    m = mount(src, ["format=hf", f"hf_config={hf_config(tmp_path)}"])
    f = m.mnt / "config.json"
    ops = {"write": lambda: os.open(f, os.O_WRONLY),
           "create": lambda: os.open(m.mnt / "new.json",
                                     os.O_WRONLY | os.O_CREAT, 0o644),
           "unlink": lambda: os.unlink(m.mnt / "model.safetensors"),
           "mkdir": lambda: os.mkdir(m.mnt / "d")}
    assert_erofs(ops)


# ---------------------------------------------------- HF -> names=mcore

@pytest.mark.parametrize("fmt,tp", [("zarr", 1), ("zarr", 2),
                                    ("torch_dist", 1), ("torch_dist", 2)])
def test_mcore_names(hf_src, mount, fmt, tp):
    """names=mcore: megatron-core loads the view strictly at tp and gets
    transformers' logits and the HF tensors exactly."""
    src, oracle = hf_src("single")
    m = mount(src, ["names=mcore", f"format={fmt}", f"tp={tp}"])
    check("mcore", m.mnt, src, oracle, tp, fmt)


@pytest.mark.parametrize("name,fmt", [("sharded", "zarr"),
                                      ("tied", "torch_dist"),
                                      ("bf16", "torch_dist")])
def test_mcore_names_variants(hf_src, mount, name, fmt):
    """A sharded HF source (index and several files), a tied one (no
    output_layer.weight) and a bf16 one (a bf16 GPTModel loads it)."""
    src, oracle = hf_src(name)
    m = mount(src, ["names=mcore", f"format={fmt}", "tp=2"])
    check("mcore", m.mnt, src, oracle, 2, fmt)


def test_mcore_names_vocab_divisor(hf_src, mount):
    """-o vocab_divisor=100 at tp=2: 1000 rows are already a multiple of
    200, so no padding row is added."""
    src, oracle = hf_src("single")
    m = mount(src, ["names=mcore", "format=torch_dist", "tp=2",
                    "vocab_divisor=100"])
    check("mcore", m.mnt, src, oracle, 2, "torch_dist", 100)


def test_mcore_names_megatron_view_refused(hf_src, failing_mount):
    """The per-rank megatron view re-emits a per-rank source's args and
    dicts; of an HF source it is refused, naming the views that work."""
    src, _ = hf_src("single")
    rc, err = failing_mount(src, ["names=mcore", "format=megatron", "tp=2"])
    assert rc != 0 and "choose -o format=zarr or torch_dist" in err, err


def test_mcore_names_default_view(hf_src, mount):
    """names=mcore without format=: the torch_dist view megatron-core
    loads, with the common.pt its loader reads first."""
    src, _ = hf_src("single")
    m = mount(src, ["names=mcore", "tp=2"])
    names = sorted(p.name for p in m.mnt.iterdir())
    assert ".metadata" in names and "common.pt" in names, names
    assert "__0_0.distcp" in names and "__1_0.distcp" in names, names
