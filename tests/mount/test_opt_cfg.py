"""OPT releases whose cfg, parts and side files must agree: OmegaConf
interpolations as OmegaConf resolves them, every part's cfg against part
0's, the vocab against dict.txt and the position table against cfg.

The releases are written by scripts/make_opt_release.py (real fairscale,
cfg made by OmegaConf 2.3's OmegaConf.create and saved in the checkpoint
as metaseq does).  The oracles: OmegaConf itself, resolving the cfg read
back from the written file (or refusing it); torch reading the written
files; transformers loading the hf view (tests/mount/opt_check.py).
"""
import json

import pytest

from mcore import REPO, run_py
from test_bad_input import assert_refused
from test_opt import check, made, pytestmark  # noqa: F401  (fixture)

# The head of every script reading a written file back: argv[1] is
# scripts/ (metaseq's meters, which the files pickle), argv[2] the file.
LOAD = r'''
import json, sys
sys.path.insert(0, sys.argv[1])
from make_metaseq_checkpoint import fake_metaseq_meters
fake_metaseq_meters()
import torch
'''

# cfg.model's fields as OmegaConf resolves them in a written file, or the
# name of the exception it raises; in a thread with a deep stack and a
# raised recursion limit, so that a chain OmegaConf can follow is
# followed (by default it stops some 60 links down).
OC_RESOLVE = LOAD + r'''
import threading
from omegaconf import OmegaConf
cfg = torch.load(sys.argv[2], weights_only=False)["cfg"]
out = {}
def run():
    global cfg
    try:    # a plain dict: metaseq makes it a DictConfig on loading
        cfg = cfg if OmegaConf.is_config(cfg) else OmegaConf.create(cfg)
    except Exception as e:
        out.update((k, "raises " + type(e).__name__) for k in sys.argv[3:])
        return
    for k in sys.argv[3:]:
        try:
            out[k] = OmegaConf.select(cfg, "model." + k,
                                      throw_on_missing=True)
        except Exception as e:
            out[k] = "raises " + type(e).__name__
sys.setrecursionlimit(200000)
threading.stack_size(1 << 29)
t = threading.Thread(target=run)
t.start()
t.join()
print(json.dumps(out))
'''

PART0 = "reshard-model_part-0.pt"


def read_back(script, path, *args):
    """What `script` (LOAD and its own lines) prints of the written file
    `path`, as JSON."""
    out = run_py("-c", script, REPO / "scripts", path, *args)
    return json.loads(out.strip().splitlines()[-1])


def omegaconf_says(src, *fields):
    return read_back(OC_RESOLVE, src / PART0, *fields)


def chain(n, target):
    """cfg section "chain": l0 -> l1 -> ... -> l<n> = target, each link
    relative to its own section."""
    links = {f"l{i}": f"${{.l{i + 1}}}" for i in range(n)}
    links[f"l{n}"] = target
    return {"chain": links}


def deep(n, target):
    """cfg section "deep": n nested sections k0.k1...k<n-2>, then v."""
    top = inner = {}
    for i in range(n - 1):
        inner[f"k{i}"] = {}
        inner = inner[f"k{i}"]
    inner["v"] = target
    path = ".".join(f"k{i}" for i in range(n - 1))
    return {"deep": top}, f"${{deep.{path}.v}}"


def args_of(cfg_json=None, **fields):
    """Writer arguments: cfg.model fields (JSON values) and a JSON object
    merged into cfg."""
    out = []
    for k, v in fields.items():
        out += ["--set-cfg", f"{k}={json.dumps(v)}"]
    if cfg_json:
        out += ["--cfg-json", json.dumps(cfg_json)]
    return out


DEEP60, PATH60 = deep(60, 64)
# name: writer arguments; the values the model was written with are 2
# layers, ffn 64, 20 positions (make_opt_release.py's defaults)
RESOLVED = {
    # relative to the node's own section, up to cfg's top and down again,
    # a list index in brackets
    "relative": args_of({"common": {"n_layers": 2, "sizes": [7, 20]}},
                        decoder_ffn_embed_dim="${.ffn_alias}",
                        ffn_alias=64,
                        decoder_layers="${..common.n_layers}",
                        max_target_positions="${..common.sizes[1]}"),
    # a path of 60 keys
    "path60": args_of(DEEP60, decoder_ffn_embed_dim=PATH60),
    # a chain of 300 links (and one more from the field)
    "chain300": args_of(chain(300, 2), decoder_layers="${chain.l0}"),
}


# cfg.model's fields of a metaseq view's file, loaded as metaseq loads
# it: torch.load, then OmegaConf.create of its plain dicts
VIEW_CFG = LOAD + r'''
from omegaconf import OmegaConf
cfg = OmegaConf.create(torch.load(sys.argv[2], weights_only=True)["cfg"])
print(json.dumps({k: OmegaConf.select(cfg, "model." + k)
                  for k in sys.argv[3:]}))
'''


@pytest.mark.parametrize("name", sorted(RESOLVED))
def test_omegaconf_interpolations_resolve(made, mount, name):  # noqa: F811
    """What OmegaConf resolves mounts with OmegaConf's values: the hf
    view's config.json holds them and transformers gives the consolidated
    weights' logits; the metaseq view's cfg (plain dicts one level deep)
    holds them resolved, the tensors as fairscale unflattens them."""
    src, oracle = made("omegaconf_kvq", *RESOLVED[name])
    fields = ("decoder_layers", "decoder_ffn_embed_dim",
              "max_target_positions")
    want = omegaconf_says(src, *fields)
    assert want == {"decoder_layers": 2, "decoder_ffn_embed_dim": 64,
                    "max_target_positions": 20}, want
    m = mount(src, ["format=hf"])
    config = json.loads((m.mnt / "config.json").read_text())
    assert (config["num_hidden_layers"], config["ffn_dim"],
            config["max_position_embeddings"]) == \
        (want["decoder_layers"], want["decoder_ffn_embed_dim"],
         want["max_target_positions"])
    check("hf", m.mnt, oracle)
    v = mount(src, ["format=metaseq", "tp=1"])
    assert read_back(VIEW_CFG, v.mnt / "restored.pt", *fields) == want
    check("metaseq", v.mnt, oracle, 1)


# name: (writer arguments, what OmegaConf does, needles of the refusal)
REFUSED = {
    "cycle": (args_of(decoder_layers="${.lb}", lb="${.decoder_layers}"),
              "raises InterpolationResolutionError",
              ["leads back to itself: OmegaConf would refuse it "
               "(recursive interpolation)"]),
    "missing_key": (args_of(decoder_layers="${.nope}"),
                    "raises InterpolationKeyError",
                    ['${.nope}: no key "nope" there: OmegaConf would refuse '
                     "it (interpolation key not found)"]),
    "above_top": (args_of(decoder_layers="${...common.n}"),
                  "raises InterpolationKeyError",
                  ["${...common.n} goes above cfg's top: OmegaConf would "
                   "refuse it"]),
    # (OmegaConf.create refuses to write it: a plain dict cfg)
    "grammar": (["--cfg", "dict"] + args_of(decoder_layers="${common . n}"),
                "raises GrammarParseError",
                ["is not an interpolation OmegaConf's grammar parses: "
                 "OmegaConf would refuse it"]),
    "missing_value": (args_of(decoder_layers="${.lb}", lb="???"),
                      "raises InterpolationToMissingValueError",
                      ["??? is OmegaConf's missing value: OmegaConf would "
                       "refuse to read it"]),
    # OmegaConf follows it (given the stack); reshardfs stops at its bound
    "chain4100": (args_of(chain(4100, 2), decoder_layers="${chain.l0}"),
                  2, ["a bound of reshardfs"]),
    # OmegaConf would run the resolver; reshardfs runs none
    "resolver": (args_of(decoder_layers="${oc.decode:'2'}"), 2,
                 ["${oc.decode:'2'} calls a resolver, which reshardfs does "
                  "not run (OmegaConf would)"]),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_omegaconf_interpolations_refused(made, failing_mount,  # noqa: F811
                                          name):
    """What OmegaConf refuses is refused saying so; what reshardfs does
    not follow says which bound or which feature."""
    args, omegaconf, needles = REFUSED[name]
    src, _ = made("omegaconf_kvq", *args)
    assert omegaconf_says(src, "decoder_layers") == \
        {"decoder_layers": omegaconf}
    rc, err = failing_mount(src, [])
    assert_refused(rc, err, PART0, "cfg: model.decoder_layers: ", *needles)


# cfg.model's fields of a written file, read back by torch
CFG_MODEL = LOAD + r'''
model = torch.load(sys.argv[2], weights_only=False)["cfg"]["model"]
get = (lambda k: model[k]) if isinstance(model, dict) else \
    (lambda k: getattr(model, k))
print(json.dumps([get(k) for k in sys.argv[3:]]))
'''


@pytest.mark.parametrize("extra,files,field,values", [
    # the release: part 1's cfg says another ffn width
    (["--part-set-cfg", "1:decoder_ffn_embed_dim=128"],
     ("reshard-model_part-1.pt", PART0), "decoder_ffn_embed_dim",
     ("128", "64")),
    # the FSDP training shards: part 1's say another activation
    (["--training-only", "--part-set-cfg", '1:activation_fn="gelu"'],
     ("checkpoint_last-model_part-1-shard0.pt",
      "checkpoint_last-model_part-0-shard0.pt"), "activation_fn",
     ("gelu", "relu")),
])
def test_refuses_parts_whose_cfg_differs(made, failing_mount,  # noqa: F811
                                         extra, files, field, values):
    """Every file's cfg must say what part 0's says of the model: the
    line names the file, the field and both values."""
    src, _ = made("release", *extra)
    got = [str(read_back(CFG_MODEL, src / f, field)[0]) for f in files]
    assert got == list(values)
    rc, err = failing_mount(src, [])
    assert_refused(rc, err, f"{files[0]}: cfg: model.{field} is "
                   f"{values[0]}, but {values[1]} in {files[1]}")


FLAT_ROWS = LOAD + r'''
sd = torch.load(sys.argv[2], weights_only=False)
print(json.dumps(sd["model"]["flat_param_0"].numel()))
'''


def test_refuses_root_flat_param_one_row_short(made,  # noqa: F811
                                                failing_mount):
    """A release whose every root flat param lacks its last row would
    mount with a vocab one row per part short, the position table and
    final norm read a row off: dict.txt's size refuses it, both sizes
    named."""
    src, oracle = made("release", "--short-root-rows", "1")
    a = json.loads((oracle / "model.json").read_text())
    H, M = a["hidden"], a["parts"]
    numel = read_back(FLAT_ROWS, src / PART0)
    # what the root holds beyond the positions and the final norm
    rows = M * (numel // H - (a["positions"] + 2) - 2)
    symbols = 4 + len((src / "dict.txt").read_text().splitlines())
    assert rows == a["vocab"] - M and symbols == a["vocab"]
    rc, err = failing_mount(src, [])
    assert_refused(rc, err, PART0, f"decoder.embed_tokens.weight has {rows} "
                   f"rows (the vocab), fewer than the {symbols} symbols of",
                   "dict.txt", "flat_param_0 is short")


def test_dictionary_smaller_than_the_vocab_mounts(made, mount):  # noqa: F811
    """A dictionary the vocab pads (OPT: 50264 symbols, 50272 rows)
    mounts."""
    src, oracle = made("release", "--dict-lines", "41")
    m = mount(src, [])
    check("safetensors", m.mnt / "model.safetensors", oracle)


POSITION_ROWS = LOAD + r'''
sm = torch.load(sys.argv[2], weights_only=False)["shard_metadata"]
root = next(p for p in sm["param_metadata"] if p["fsdp_path"] == "")
info = root["params"]["flat_param_0"]
i = info["names"].index("decoder.embed_positions.weight")
print(json.dumps(info["shapes"][i][0]))
'''


def test_refuses_position_table_cfg_contradicts(made,  # noqa: F811
                                                failing_mount):
    """FSDP shards whose shard_metadata gives the position table other
    rows than cfg's max_target_positions + 2: the line names both."""
    src, _ = made("release", "--training-only", "--set-cfg",
                  "max_target_positions=19")
    rows = read_back(POSITION_ROWS,
                     src / "checkpoint_last-model_part-0-shard0.pt")
    assert rows == 22
    rc, err = failing_mount(src, [])
    assert_refused(rc, err, "checkpoint_last-model_part-0-shard0.pt",
                   f"decoder.embed_positions.weight has {rows} rows, but "
                   "cfg's max_target_positions 19 makes 21")
