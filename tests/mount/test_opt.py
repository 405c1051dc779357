"""OPT as metaseq releases it: model parts of fairscale flat params with no
shard_metadata (reshard-model_part-<m>.pt), mounted with no options, and
its hf and metaseq views.

Checkpoints are written by scripts/make_opt_release.py with the real
fairscale FullyShardedDataParallel (one wrapper per layer plus the root,
fp16, 3 CPU ranks over gloo, so the flat params pad) and released as
metaseq's reshard_mp.py does.  Every view is read by the real loader in
.venv-mcore (tests/mount/opt_check.py): safetensors.safe_open,
transformers' OPTForCausalLM.from_pretrained (logits against
transformers' own forward pass on the consolidated weights),
torch.load(weights_only=True) (against the parts as fairscale's
consolidate_shard_weights unflattens them).
"""
import hashlib
import json
import shutil
from pathlib import Path

import pytest

from mcore import REPO, clients_missing, needs_mcore, run_py
from test_bad_input import assert_refused

WRITER = REPO / "scripts" / "make_opt_release.py"
CHECKER = Path(__file__).resolve().parent / "opt_check.py"


MISSING = clients_missing(["torch", "fairscale", "transformers", "omegaconf",
                           "safetensors"],
                          "fairscale, transformers and omegaconf")
pytestmark = [needs_mcore,
              pytest.mark.skipif(MISSING is not None, reason=MISSING or "")]

# name: writer arguments
VARIANTS = {
    # OPT-125m's form: 2 model parts, fused qkv, pre-norm with a final
    # layer norm, tied output projection, cfg.model an argparse.Namespace
    "release": [],
    # one part, separate k/v/q_proj (arch transformer_lm), cfg an
    # OmegaConf DictConfig whose model_parallel_size is an interpolation
    "omegaconf_kvq": ["--parts", "1", "--separate-qkv", "--cfg",
                      "omegaconf"],
    # post-norm (no final layer norm), untied output projection, cfg a
    # plain dict
    "dict_post_untied": ["--post-norm", "--untied", "--cfg", "dict"],
}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """made(variant) -> (checkpoint dir, oracle dir)."""
    cache = {}
    base = tmp_path_factory.mktemp("opt")

    def _make(name, *extra):
        key = (name,) + extra
        if key not in cache:
            stem = "_".join(key).replace("-", "").replace("/", "")
            if len(stem) > 80:      # a cfg written out in the arguments
                stem = f"{name}_{hashlib.sha1(stem.encode()).hexdigest()}"
            src = base / stem
            run_py(WRITER, src, "--oracle", f"{src}.oracle",
                   *VARIANTS[name], *extra)
            cache[key] = (src, Path(f"{src}.oracle"))
        return cache[key]
    return _make


def check(*args):
    assert run_py(CHECKER, *args).strip().endswith("ok")


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_mounts_without_options(made, mount, variant):
    """The release form needs no -o params=: the default view holds every
    consolidated tensor."""
    src, oracle = made(variant)
    m = mount(src, [])
    assert "model.safetensors" in [p.name for p in m.mnt.iterdir()]
    check("safetensors", m.mnt / "model.safetensors", oracle)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_hf_view(made, mount, variant):
    """format=hf loads in transformers without key warnings and gives the
    consolidated weights' logits exactly."""
    src, oracle = made(variant)
    m = mount(src, ["format=hf"])
    assert sorted(p.name for p in m.mnt.iterdir()) == [
        "config.json", "dict.txt", "merges.txt", "model.safetensors",
        "vocab.json"]
    check("hf", m.mnt, oracle)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_metaseq_view(made, mount, tp):
    """format=metaseq: restored.pt at tp=1, reshard-model_part-<m>.pt at
    tp=M; at the stored tp the parts are the released ones as fairscale
    unflattens them."""
    src, oracle = made("release")
    m = mount(src, ["format=metaseq", f"tp={tp}"])
    check("metaseq", m.mnt, oracle, tp)


def test_training_shards(made, mount):
    """The FSDP training shards themselves (with shard_metadata, padded):
    the same hf model and the same released parts."""
    src, oracle = made("release", "--training-only")
    assert sorted(p.name for p in src.glob("*.pt")) == [
        f"checkpoint_last-model_part-{m}-shard{r}.pt"
        for m in range(2) for r in range(3)]
    m = mount(src, ["format=hf"])
    check("hf", m.mnt, oracle)
    m = mount(src, ["format=metaseq", "tp=2"])
    check("metaseq", m.mnt, oracle, 2)


def test_metaseq_view_separate_qkv(made, mount):
    src, oracle = made("omegaconf_kvq")
    m = mount(src, ["format=metaseq", "tp=2"])
    check("metaseq", m.mnt, oracle, 2)


def params_map(a, fused):
    """-o params=FILE (the flat-param map) for the release variant, with
    a fused qkv_proj or separate q/k/v_proj (the same numels)."""
    H, Hp, Fp = a["hidden"], a["hidden"] // a["parts"], a["ffn"] // a["parts"]
    Vp = a["vocab"] // a["parts"]
    root = {"names": ["decoder.embed_tokens.weight",
                      "decoder.embed_positions.weight",
                      "decoder.layer_norm.weight", "decoder.layer_norm.bias"],
            "shapes": [[Vp, H], [a["positions"] + 2, H], [H], [H]]}
    attn = ([("self_attn.qkv_proj.weight", [3 * Hp, H]),
             ("self_attn.qkv_proj.bias", [3 * Hp])] if fused else
            [(f"self_attn.{x}_proj.{s}", [Hp, H] if s == "weight" else [Hp])
             for x in "qkv" for s in ("weight", "bias")])
    rest = [("self_attn.out_proj.weight", [H, Hp]),
            ("self_attn.out_proj.bias", [H]),
            ("self_attn_layer_norm.weight", [H]),
            ("self_attn_layer_norm.bias", [H]),
            ("fc1.weight", [Fp, H]), ("fc1.bias", [Fp]),
            ("fc2.weight", [H, Fp]), ("fc2.bias", [H]),
            ("final_layer_norm.weight", [H]), ("final_layer_norm.bias", [H])]
    layer = attn + rest
    desc = {"flat_param_0": root}
    for i in range(a["layers"]):
        desc[f"decoder.layers.{i}.flat_param_0"] = {
            "names": [n for n, _ in layer], "shapes": [s for _, s in layer]}
    return desc


def test_params_file_checked_against_cfg(made, mount, failing_mount,
                                         tmp_path):
    """A plausible wrong params file - q/k/v apart where the model fuses
    them, the same numels - is refused, naming the param; the right one
    mounts."""
    src, oracle = made("release")
    a = json.loads((oracle / "model.json").read_text())
    bad = tmp_path / "wrong.params.json"
    bad.write_text(json.dumps(params_map(a, fused=False)))
    rc, err = failing_mount(src, [f"params={bad}"])
    assert_refused(rc, err, str(bad), "decoder.layers.0.flat_param_0",
                   "self_attn.q_proj.weight", "self_attn.qkv_proj.weight",
                   "contradicts the checkpoint's cfg")
    good = tmp_path / "right.params.json"
    good.write_text(json.dumps(params_map(a, fused=True)))
    m = mount(src, [f"params={good}"])
    check("safetensors", m.mnt / "model.safetensors", oracle)


@pytest.mark.parametrize("field", ["decoder_ffn_embed_dim",
                                   "max_target_positions"])
def test_refuses_what_cfg_does_not_say(made, failing_mount, field):
    src, _ = made("release", "--drop-cfg", field)
    rc, err = failing_mount(src, [])
    assert_refused(rc, err, "reshard-model_part-0.pt",
                   f"model.{field} is missing", "-o params=FILE")


@pytest.mark.parametrize("setting,needles", [
    ("decoder_layers=1", ["reshard-model_part-0.pt",
                          "model holds decoder.layers.1.flat_param_0, which "
                          "cfg (1 decoder layers) does not describe"]),
    ("decoder_layers=3", ["reshard-model_part-0.pt", "cfg says 3 decoder "
                          "layers but model has no "
                          "decoder.layers.2.flat_param_0"]),
    ("decoder_ffn_embed_dim=66", ["reshard-model_part-0.pt",
                                  "decoder.layers.0.flat_param_0: numels "
                                  "add up to", "but the shards hold"]),
    ("decoder_embed_dim=30", ["decoder_attention_heads 4 does not divide "
                              "decoder_embed_dim 30"]),
    ("decoder_ffn_embed_dim=63", ["2 model parts do not divide"]),
    ("decoder_learned_pos=false", ["decoder_learned_pos is not true"]),
    ("alibi=true", ["model.alibi is set"]),
    ("decoder_attention_heads=\"4\"",
     ["model.decoder_attention_heads is '4' (a str), not a positive "
      "integer"]),
    # numbers are range-checked before they narrow, and named
    ("decoder_layers=1099511627776",
     ["model.decoder_layers is 1099511627776, past 100000"]),
    ("decoder_layers=18446744073709551616",
     ["model.decoder_layers is an int wider than 64 bits"]),
    ("max_target_positions=-2",
     ["model.max_target_positions is -2, not a positive integer"]),
    ("decoder_embed_dim=Infinity",
     ["model.decoder_embed_dim is inf (a float), not a positive integer"]),
    ("decoder_normalize_before=NaN",
     ["model.decoder_normalize_before is nan (a float), not a bool"]),
    ("activation_fn=3", ["model.activation_fn is 3, not a string"]),
])
def test_refuses_cfg_that_contradicts_the_file(made, failing_mount, setting,
                                               needles):
    """cfg fields that the stored sizes contradict, or that cannot describe
    an OPT model, are refused with a line naming them."""
    src, _ = made("release", "--set-cfg", setting)
    rc, err = failing_mount(src, [])
    assert_refused(rc, err, *needles)


def test_stale_model_parallel_size(made, mount):
    """metaseq's resharding tools leave cfg's model_parallel_size stale:
    the parts SOURCE holds decide."""
    src, oracle = made("release", "--set-cfg", "model_parallel_size=8")
    m = mount(src, [])
    check("safetensors", m.mnt / "model.safetensors", oracle)


def test_refuses_missing_last_part(made, tmp_path, failing_mount):
    """Without the last part every layer's flat param is too large for
    the part count cfg's sizes then imply."""
    src0, _ = made("release")
    src = tmp_path / "one_part"
    shutil.copytree(src0, src)
    (src / "reshard-model_part-1.pt").unlink()
    rc, err = failing_mount(src, [])
    assert_refused(rc, err, "reshard-model_part-0.pt",
                   "flat_param_0: numels add up to", "but the shards hold")


def test_refuses_hf_at_tp2(made, failing_mount):
    src, _ = made("release")
    rc, err = failing_mount(src, ["format=hf", "tp=2"])
    assert_refused(rc, err, "the hf view is one model directory")


def test_refuses_hf_without_architecture(tmp_path, failing_mount):
    """A checkpoint whose cfg does not describe the model (here with
    shard_metadata, so it mounts otherwise) has no hf view; the line says
    what cfg lacks."""
    src = tmp_path / "partial_cfg"
    run_py(REPO / "scripts" / "make_metaseq_checkpoint.py", src)
    rc, err = failing_mount(src, ["format=hf"])
    assert_refused(rc, err, "checkpoint_last-model_part-0-shard0.pt",
                   "model.decoder_ffn_embed_dim is missing",
                   "the hf view needs the model's architecture")
