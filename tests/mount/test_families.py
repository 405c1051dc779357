"""Model families as data files (share/reshardfs/families/*.json) both
ways, every check against the real libraries through the oracle scripts:

* HF -> megatron-core: scripts/make_hf_family.py writes a tiny model of
  each family with transformers' save_pretrained (per expert, or with
  --experts packed transformers 5's packed experts) and the oracle of its
  forward; the names=mcore view is loaded by family_check.py mcore
  (dist_checkpointing.load strict at TP*EP gloo ranks, every tensor and
  transformers' logits).
* megatron-core -> HF: family_check.py save writes a megatron-core
  checkpoint of the family (Megatron-LM's args in common.pt); the
  format=hf view is checked by family_check.py hf (config.json's family
  fields, from_pretrained strict, every tensor, megatron-core's logits).
* --dry-run -v: the family file and the config facts with their sources.
* A family that lives only in a -o rules= file.
* Refusals: an unknown architecture, an hf_config or args that contradict
  the shapes, a rules family with two rows making one name, a malformed
  family.

Every real-writer source is made once per module (fixtures hf_family and
saved below) and shared.
"""
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import daemon_path
from mcore import REPO, needs_transformers, run_py
from test_bad_input import assert_refused

HF_WRITER = REPO / "scripts" / "make_hf_family.py"
CHECKER = Path(__file__).resolve().parent / "family_check.py"
FAMILIES_DIR = REPO / "share" / "reshardfs" / "families"


def families_dir():
    """The family files the daemon reads: share/reshardfs/families beside
    it (formats/bridge/family.c rs_families_dir), else the source tree's."""
    d = (Path(daemon_path()).resolve().parent / ".." / "share" / "reshardfs"
         / "families").resolve()
    return d if d.is_dir() else FAMILIES_DIR


pytestmark = needs_transformers

DENSE = ["qwen2", "qwen3", "mistral", "llama3", "phi3"]
MOE = ["mixtral", "qwen3_moe"]
# the architecture an HF config names (mistral and phi3 are never guessed
# from a megatron-core checkpoint's tensors: -o hf_config= names them)
ARCH = {"mistral": "MistralForCausalLM", "phi3": "Phi3ForCausalLM"}
# family_check.py's family name -> the family file that serves it
FILE = {"llama3": "llama"}


# ------------------------------------------------------------ fixtures

@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tmp_path_factory.mktemp("families")


@pytest.fixture(scope="module")
def hf_family(base):
    """hf_family(family, packed=False) -> (HF dir, oracle): what
    make_hf_family.py writes (transformers' save_pretrained, with
    --experts packed transformers 5's packed experts) and transformers'
    logits."""
    cache = {}

    def _make(family, packed=False):
        key = (family, packed)
        if key not in cache:
            d = base / f"hf_{family}{'_packed' if packed else ''}"
            o = Path(f"{d}.oracle")
            run_py(HF_WRITER, family, d, "--oracle", o,
                   *(["--experts", "packed"] if packed else []))
            cache[key] = (d, o)
        return cache[key]
    return _make


@pytest.fixture(scope="module")
def saved(base):
    """saved(family, tp, ep, fmt) -> (checkpoint, oracle): a megatron-core
    checkpoint of the family written by family_check.py save (dist
    checkpointing, Megatron-LM's args in common.pt) and its oracle."""
    cache = {}

    def _make(family, tp, ep, fmt):
        key = (family, tp, ep, fmt)
        if key not in cache:
            d = base / f"mcore_{family}_tp{tp}_ep{ep}_{fmt}"
            o = Path(f"{d}.oracle")
            run_py(CHECKER, "save", family, d, "--tp", tp, "--ep", ep,
                   "--format", fmt, "--oracle", o)
            cache[key] = (d, o)
        return cache[key]
    return _make


def check(*args):
    out = run_py(CHECKER, *args)
    assert out.strip().endswith("ok"), out[-4000:]
    return out


def dry_run(*args):
    """reshardfs --dry-run -v ARGS -> (returncode, stdout, stderr)."""
    r = subprocess.run([daemon_path(), "--dry-run", "-v", *map(str, args)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=60)
    return r.returncode, r.stdout, r.stderr


def write_json(path, obj):
    path.write_text(json.dumps(obj, indent=1))
    return path


def hf_config(tmp_path, name="hf_config.json", **fields):
    return write_json(tmp_path / name, fields)


def copy_hf(src, dst, **config):
    """A copy of an HF dir (a view refuses links that leave SOURCE) with
    config.json fields changed."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(config)
    write_json(dst / "config.json", cfg)
    return dst


def user_qwen2(name="my_qwen2", **over):
    """A family only a rules file has: qwen2's facts, checks and rows on
    llama, under another name, naming Qwen2ForCausalLM."""
    q = json.loads((FAMILIES_DIR / "qwen2.json").read_text())
    fam = {"family": name, "base": "llama",
           "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
           "detect": q["detect"], "config": q["config"],
           "checks": q["checks"], "names": q["names"]}
    fam.update(over)
    return fam


def rules_file(tmp_path, families, name="rules.json", names_list=True):
    """-o rules=FILE with a "families" list.  names_list: an empty "names"
    list beside it (planner/rules.c refuses a file with neither "rules"
    nor "names"; test_rules_only_families checks the documented form)."""
    obj = {"families": families}
    if names_list:
        obj["names"] = []
    return write_json(tmp_path / name, obj)


# ------------------------------------------------- HF -> megatron-core

MCORE_CASES = (
    [pytest.param(f, 2, 1, "torch_dist", False, id=f"{f}-tp2-torch_dist")
     for f in DENSE]
    + [pytest.param("qwen3", 2, 1, "zarr", False, id="qwen3-tp2-zarr")]
    + [pytest.param(f, 2, 2, "torch_dist", False,
                    id=f"{f}-tp2-ep2-torch_dist") for f in MOE]
    + [pytest.param(f, 1, 2, "torch_dist", True,
                    id=f"{f}-packed-tp1-ep2-torch_dist") for f in MOE]
    # multi-latent attention, dense first layer: layers keyed apart
    + [pytest.param("deepseek_v3", 2, 2, "torch_dist", False,
                    id="deepseek_v3-tp2-ep2-torch_dist")])


@pytest.mark.parametrize("family,tp,ep,fmt,packed", MCORE_CASES)
def test_mcore_view(hf_family, mount, family, tp, ep, fmt, packed):
    """names=mcore of the family's HF dir: megatron-core loads it strictly
    at tp, ep with every tensor exact and transformers' logits."""
    src, oracle = hf_family(family, packed)
    opts = ["names=mcore", f"tp={tp}", f"format={fmt}"]
    if ep > 1:
        opts.append(f"ep={ep}")
    m = mount(src, opts)
    check("mcore", m.mnt, src, oracle, tp, ep, fmt)


# ------------------------------------------------- megatron-core -> HF

HF_CASES = (
    [pytest.param(f, 2, 1, "torch_dist", id=f"{f}-tp2-torch_dist")
     for f in DENSE]
    + [pytest.param("qwen2", 2, 1, "zarr", id="qwen2-tp2-zarr")]
    + [pytest.param(f, 2, 2, "torch_dist", id=f"{f}-tp2-ep2-torch_dist")
       for f in MOE]
    + [pytest.param("deepseek_v3", 2, 2, "zarr",
                    id="deepseek_v3-tp2-ep2-zarr")])


@pytest.mark.parametrize("family,tp,ep,fmt", HF_CASES)
def test_hf_view(saved, mount, tmp_path, family, tp, ep, fmt):
    """format=hf of a saved megatron-core checkpoint: the family from the
    stored tensors (mistral and phi3 from hf_config's architectures) and
    every fact from the args; family_check hf loads it."""
    src, oracle = saved(family, tp, ep, fmt)
    opts = ["format=hf"]
    if family in ARCH:
        opts.append("hf_config=" + str(hf_config(
            tmp_path, architectures=[ARCH[family]])))
    m = mount(src, opts)
    check("hf", m.mnt, oracle)


def test_hf_view_packed_experts(saved, mount):
    """-o hf_experts=packed: transformers 5's packed experts, checked
    unpacked against the oracle."""
    src, oracle = saved("qwen3_moe", 2, 2, "torch_dist")
    m = mount(src, ["format=hf", "hf_experts=packed"])
    names = json.dumps(sorted(p.name for p in m.mnt.iterdir()))
    assert "model.safetensors" in names, names
    out = check("hf", m.mnt, oracle)
    assert "packed experts" in out, out[-2000:]


# ------------------------------------------------------------ --dry-run

def facts(out):
    """The `config facts:` lines of a dry run: {field: (value, source)}."""
    got, on = {}, False
    for ln in out.splitlines():
        if ln.startswith("config facts:"):
            on = True
            continue
        if on:
            if not ln.startswith("  ") or " = " not in ln:
                break
            field, rest = ln.strip().split(" = ", 1)
            value, _, source = rest.partition(" (")
            got[field] = (value, source[:-1] if source.endswith(")")
                          else source)
    return got


def test_dry_run_mcore_source(saved, reshardfs_bin):
    """A saved checkpoint: the family guessed from its tensors, the file
    named, and each fact with where it came from (Megatron-LM's args)."""
    src, oracle = saved("qwen2", 2, 1, "torch_dist")
    rc, out, err = dry_run(src, "-o", "format=hf")
    assert rc == 0, err
    want = f"family: qwen2, mcore to hf ({families_dir() / 'qwen2.json'})"
    assert want in out.splitlines(), out
    got = facts(out)
    cfg = json.loads((oracle / "model.json").read_text())["config"]
    assert got["num_attention_heads"] == (
        str(cfg["num_attention_heads"]), "common.pt args.num_attention_heads"), got
    assert got["num_key_value_heads"] == (
        str(cfg["num_key_value_heads"]), "common.pt args.num_query_groups"), got
    assert got["hidden_size"] == (
        str(cfg["hidden_size"]), "common.pt args.hidden_size"), got
    assert got["tie_word_embeddings"][0] == "false", got
    assert all(s for _, s in got.values()), got


def test_dry_run_hf_source(hf_family, reshardfs_bin):
    """An HF dir: the family by its architectures, facts from config.json
    and the shapes."""
    src, _ = hf_family("qwen3")
    rc, out, err = dry_run(src, "-o", "names=mcore,tp=2")
    assert rc == 0, err
    want = f"family: qwen3, hf to mcore ({families_dir() / 'qwen3.json'})"
    assert want in out.splitlines(), out
    cfg = json.loads((src / "config.json").read_text())
    got = facts(out)
    assert got["num_attention_heads"] == (
        str(cfg["num_attention_heads"]), "config.json"), got
    assert got["head_dim"][0] == str(cfg["head_dim"]), got


def test_dry_run_named_family(saved, tmp_path, reshardfs_bin):
    """mistral is never guessed: hf_config's architectures picks it."""
    src, _ = saved("mistral", 2, 1, "torch_dist")
    cfg = hf_config(tmp_path, architectures=["MistralForCausalLM"])
    rc, out, err = dry_run(src, "-o", f"format=hf,hf_config={cfg}")
    assert rc == 0, err
    want = f"family: mistral, mcore to hf ({families_dir() / 'mistral.json'})"
    assert want in out.splitlines(), out


# ------------------------------------------------ a family in -o rules=

def test_user_family_picked(hf_family, tmp_path, reshardfs_bin):
    """A rules file's family that names an architecture is picked before
    the built-in one (reshardfs(1), FAMILY FILES); the dry run names the
    rules file."""
    src, _ = hf_family("qwen2")
    rules = rules_file(tmp_path, [user_qwen2()])
    rc, out, err = dry_run(src, "-o", f"names=mcore,tp=2,rules={rules}")
    assert rc == 0, err
    fam = [ln for ln in out.splitlines() if ln.startswith("family:")]
    assert fam == [f"family: my_qwen2, hf to mcore ({rules})"], out


def test_user_family_mcore_view(hf_family, mount, tmp_path):
    """The view made through the user's family loads in megatron-core."""
    src, oracle = hf_family("qwen2")
    rules = rules_file(tmp_path, [user_qwen2()])
    m = mount(src, ["names=mcore", "tp=2", "format=torch_dist",
                    f"rules={rules}"])
    check("mcore", m.mnt, src, oracle, 2, 1, "torch_dist")


def test_user_family_replaces_builtin(hf_family, tmp_path, reshardfs_bin):
    """A user family with a built-in's name replaces it."""
    src, _ = hf_family("qwen2")
    rules = rules_file(tmp_path, [user_qwen2("qwen2")])
    rc, out, err = dry_run(src, "-o", f"names=mcore,tp=2,rules={rules}")
    assert rc == 0, err
    assert f"family: qwen2, hf to mcore ({rules})" in out.splitlines(), out


def test_rules_only_families(hf_family, tmp_path, reshardfs_bin):
    """The documented form: a rules file that holds only "families"
    (reshardfs(1)'s example) is taken."""
    src, _ = hf_family("qwen2")
    rules = rules_file(tmp_path, [user_qwen2()], names_list=False)
    rc, out, err = dry_run(src, "-o", f"names=mcore,tp=2,rules={rules}")
    assert rc == 0, err
    assert f"family: my_qwen2, hf to mcore ({rules})" in out.splitlines(), \
        out


# ------------------------------------------------------------ refusals

def test_unknown_architecture_refused(hf_family, failing_mount, tmp_path):
    """config.json naming an architecture no family has: refused naming
    it, the families known and how to add one."""
    src, _ = hf_family("qwen2")
    bad = copy_hf(src, tmp_path / "gemma", architectures=["GemmaForCausalLM"],
                  model_type="gemma")
    rc, err = failing_mount(bad, ["names=mcore", "tp=2"])
    assert_refused(rc, err, "config.json", "GemmaForCausalLM", "qwen2",
                   "-o rules=")


@pytest.mark.parametrize("field,value", [("head_dim", 16),
                                         ("intermediate_size", 256)])
def test_hf_config_contradicts_shapes(saved, failing_mount, tmp_path, field,
                                      value):
    """An hf_config fact the stored shapes (and args) contradict: refused
    naming the field and both values."""
    src, oracle = saved("qwen2", 2, 1, "torch_dist")
    real = json.loads((oracle / "model.json").read_text())["config"]
    want = real.get(field) or real["hidden_size"] // \
        real["num_attention_heads"]
    assert want != value
    cfg = hf_config(tmp_path, architectures=["Qwen2ForCausalLM"],
                    **{field: value})
    rc, err = failing_mount(src, ["format=hf", f"hf_config={cfg}"])
    assert_refused(rc, err, field, str(value), str(want))


DROP_ARGS = """
import sys, torch
p = sys.argv[1]
sd = torch.load(p, weights_only=False)
del sd["args"]
torch.save(sd, p)
print("ok")
"""


@pytest.mark.parametrize("field,value", [("head_dim", 16),
                                         ("intermediate_size", 256)])
def test_hf_config_contradicts_shapes_no_args(saved, failing_mount, tmp_path,
                                              field, value):
    """The same checkpoint without Megatron-LM's args: hf_config (the
    source's own config.json but one field) must tell every fact, and the
    stored shapes refuse the wrong one, naming it and both values."""
    src, oracle = saved("qwen2", 2, 1, "torch_dist")
    real = json.loads((oracle / "model.json").read_text())["config"]
    want = real.get(field) or real["hidden_size"] // \
        real["num_attention_heads"]
    bad = tmp_path / "qwen2_no_args"
    shutil.copytree(src, bad)
    run_py("-c", DROP_ARGS, bad / "common.pt")
    good = hf_config(tmp_path, "good.json", **real)
    rc, err = failing_mount(bad, ["format=hf"])
    assert_refused(rc, err, "-o hf_config=")
    cfg = hf_config(tmp_path, **dict(real, **{field: value}))
    rc, err = failing_mount(bad, ["format=hf", f"hf_config={cfg}"])
    assert_refused(rc, err, field, str(value), str(want), "shape")
    # and the source's own config.json is taken
    rc, out, err = dry_run(bad, "-o", f"format=hf,hf_config={good}")
    assert rc == 0, err


EDIT_ARGS = """
import sys, torch
p, field, value = sys.argv[1], sys.argv[2], int(sys.argv[3])
sd = torch.load(p, weights_only=False)
setattr(sd["args"], field, value)
torch.save(sd, p)
print("ok")
"""


def test_args_num_experts_contradicts_router(saved, failing_mount, tmp_path):
    """args.num_experts that the router's shape contradicts: refused
    naming the fact and both values."""
    src, oracle = saved("mixtral", 2, 2, "torch_dist")
    E = json.loads((oracle / "model.json").read_text())[
        "config"]["num_local_experts"]
    bad = tmp_path / "mixtral_bad_args"
    shutil.copytree(src, bad)
    run_py("-c", EDIT_ARGS, bad / "common.pt", "num_experts", E // 2)
    rc, err = failing_mount(bad, ["format=hf"])
    assert_refused(rc, err, "num_local_experts", str(E // 2), str(E))


def test_rules_family_two_rows_one_name(hf_family, failing_mount, tmp_path):
    """Two rows of a rules family that make one name: refused naming
    both rows."""
    src, _ = hf_family("qwen2")
    qkv = "decoder.layers.#.self_attention.linear_qkv.bias"
    fam = user_qwen2("qwen2", names=[
        {"from": "hf", "to": "mcore", "target": qkv, "op": "fuse_qkv",
         "sources": [f"model.layers.#.self_attn.{x}_proj.bias"
                     for x in "qkv"]},
        {"from": "hf", "to": "mcore", "target": qkv, "op": "same",
         "sources": ["model.layers.#.self_attn.o_proj.weight"]}])
    rules = rules_file(tmp_path, [fam])
    rc, err = failing_mount(src, ["names=mcore", "tp=2", f"rules={rules}"])
    assert_refused(rc, err, "made twice", "self_attn.q_proj.bias",
                   "self_attn.o_proj.weight", str(rules))


@pytest.mark.parametrize("what", ["bad_type", "not_a_list", "no_name"])
def test_rules_family_malformed(hf_family, failing_mount, tmp_path, what):
    """A malformed family in a rules file: refused naming the file."""
    src, _ = hf_family("qwen2")
    if what == "bad_type":
        fam = user_qwen2(config=[{"hf": "attention_bias",
                                  "type": "float128"}])
        rules = rules_file(tmp_path, [fam])
        needles = ["attention_bias", '"type"']
    elif what == "not_a_list":
        rules = write_json(tmp_path / "rules.json",
                           {"names": [], "families": user_qwen2()})
        needles = ['"families" must be a list']
    else:
        fam = user_qwen2()
        del fam["family"]
        rules = rules_file(tmp_path, [fam])
        needles = ["family"]
    rc, err = failing_mount(src, ["names=mcore", "tp=2", f"rules={rules}"])
    assert_refused(rc, err, str(rules), *needles)
