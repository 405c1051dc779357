"""DeepSpeed ZeRO saves (stages 1, 2 and 3, fp32 and bf16 training) through
the mount, checked by DeepSpeed and transformers themselves.

Saves are written by real DeepSpeed 0.19.8 on the CPU (DS_ACCELERATOR=cpu,
2 gloo ranks, a client AdamW, 2 real steps; tests/mount/ds_writer.py) of a
tiny HF LlamaForCausalLM with a frozen weight and tied embeddings, and of a
plain torch module with a buffer.  tests/mount/ds_check.py compares:
  - the safetensors and hf views with DeepSpeed's own
    get_fp32_state_dict_from_zero_checkpoint, tensor for tensor;
  - from_pretrained on the hf view (no missing or unexpected key) with the
    model loaded from DeepSpeed's state dict, logits for logits;
  - the universal view resumed by DeepSpeed (load_universal) at world
    sizes 1 and 4 with what DeepSpeed resumes from its own ds_to_universal
    output: params, exp_avg, exp_avg_sq, step, one more step.
"""
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mcore import MCORE_PY, clients_missing, needs_mcore
from test_bad_input import assert_refused

HERE = Path(__file__).resolve().parent
WRITER = HERE / "ds_writer.py"
RESUMER = HERE / "ds_resume.py"
CHECKER = HERE / "ds_check.py"


MISSING = clients_missing(["torch", "deepspeed", "transformers",
                           "safetensors"], "deepspeed")
pytestmark = [needs_mcore,
              pytest.mark.skipif(MISSING is not None, reason=MISSING or "")]

ENV = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1",
           TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
           PYTHONPATH=str(HERE))


def run(args, nproc=None, cwd=None):
    """.venv-mcore's python on args, under torchrun with nproc ranks."""
    cmd = [str(MCORE_PY)]
    if nproc:
        cmd += ["-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={nproc}"]
    r = subprocess.run(cmd + [str(a) for a in args], cwd=cwd, env=ENV,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-6000:]
    return r.stdout


@pytest.fixture(scope="module")
def save(tmp_path_factory):
    """save(stage, dtype, model="llama", hf_trainer=False) -> the save
    directory DeepSpeed wrote (made once per module)."""
    made = {}

    def _save(stage, dtype, model="llama", hf_trainer=False):
        key = (stage, dtype, model, hf_trainer)
        if key not in made:
            out = tmp_path_factory.mktemp(
                f"ds_z{stage}_{dtype}_{model}{'_trainer' if hf_trainer else ''}")
            run([WRITER, "--stage", stage, "--dtype", dtype, "--model", model,
                 "--out", out] + (["--hf-trainer"] if hf_trainer else []),
                nproc=2, cwd=out)
            made[key] = out
        return made[key]
    return _save


def check(*args):
    return run([CHECKER, *args])


# ------------------------------------------------------------ weights

# (stage, dtype, model): the default run keeps one of each stage and both
# models; the rest are in slow_cases.txt
CASES = [(2, "bf16", "llama"), (3, "bf16", "llama"), (1, "fp32", "plain"),
         (1, "bf16", "llama"), (2, "fp32", "plain"), (3, "fp32", "llama"),
         (3, "bf16", "plain"), (2, "fp16", "llama")]


@pytest.mark.parametrize("stage,dtype,model", CASES)
def test_weights(save, mount, stage, dtype, model):
    """The safetensors view holds DeepSpeed's fp32 masters, every one
    equal to its own conversion; bf16 and fp16 runs too, whose model-states
    files hold 16-bit copies the view must not serve."""
    src = save(stage, dtype, model)
    m = mount(src, ["format=safetensors"])
    out = check("weights", src, m.mnt)
    assert "equal DeepSpeed's fp32 state dict" in out, out


def test_weights_tp2(save, mount):
    """format=safetensors at tp=2: per-rank files whose halves put back
    together are DeepSpeed's tensors (checked on q_proj and the vocab)."""
    src = save(2, "bf16")
    m = mount(src, ["format=safetensors", "tp=2"])
    names = sorted(os.listdir(m.mnt))
    assert "model-rank-0-part-0.safetensors" in names, names
    assert "model-rank-1-part-0.safetensors" in names, names
    out = run(["-c", f"""
import torch, sys
from safetensors.torch import load_file
from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint as g
ref = g({str(src)!r})
a = load_file({str(m.mnt / 'model-rank-0-part-0.safetensors')!r})
b = load_file({str(m.mnt / 'model-rank-1-part-0.safetensors')!r})
for k in ("model.layers.1.self_attn.q_proj.weight", "model.embed_tokens.weight",
          "model.layers.0.self_attn.o_proj.weight"):
    ax = 1 if "o_proj" in k else 0
    assert torch.equal(torch.cat([a[k], b[k]], ax), ref[k]), k
print("tp2 ok")
"""])
    assert "tp2 ok" in out


def test_hf_view(save, mount):
    """The hf view of a bf16 ZeRO-3 save: config.json and the fp32
    masters, loaded by from_pretrained with the logits of the model
    DeepSpeed trained; the optimizer state stays out."""
    src = save(3, "bf16")
    m = mount(src, ["format=hf"])
    names = sorted(os.listdir(m.mnt))
    assert names == ["config.json", "model.safetensors"], names
    out = check("hf", src, m.mnt)
    assert "logits equal" in out, out


def test_hf_view_bf16(save, mount):
    """-o dtype=bf16 halves the hf view: every tensor bf16, equal to
    DeepSpeed's fp32 masters rounded as torch rounds them."""
    src = save(2, "bf16")
    m = mount(src, ["format=hf", "dtype=bf16"])
    assert json.loads((m.mnt / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert "logits equal" in check("hf", src, m.mnt, "--dtype", "bf16")
    m.unmount()
    m = mount(src, ["format=safetensors", "dtype=bf16"])
    assert "equal DeepSpeed's" in check("weights", src, m.mnt, "--dtype", "bf16")


def test_dry_run(save, reshardfs_bin, tmp_path):
    src = save(3, "bf16")
    r = subprocess.run([reshardfs_bin, str(src), str(tmp_path), "--dry-run",
                        "-o", "format=hf"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=60)
    assert r.returncode == 0, r.stdout
    assert "deepspeed: ZeRO stage 3, 2 data-parallel ranks" in r.stdout
    assert "trained in bfloat16 with fp32 master weights" in r.stdout
    assert "params: 19 trainable, 1 frozen, 1 shared, 0 buffers" in r.stdout
    assert "optimizer state: exp_avg, exp_avg_sq, step 2" in r.stdout
    assert f"config.json: {src}/config.json" in r.stdout
    assert "view: hf" in r.stdout


# ------------------------------------------------------------ HF Trainer

def test_hf_trainer_dirs(save, mount, tmp_path):
    """checkpoint-N holds the Trainer's model.safetensors and DeepSpeed's
    save: the mount follows latest and says so; global_stepN mounted
    alone takes config.json from its parent; tokenizer-like files of
    checkpoint-N pass through; the Trainer's weights do not shadow the
    view's."""
    root = save(2, "bf16", hf_trainer=True)
    ck = root / "checkpoint-2"
    assert (ck / "model.safetensors").exists() and (ck / "latest").exists()
    m = mount(ck, ["format=hf"])
    assert "holds the HF Trainer's model.safetensors and DeepSpeed's global_step2" in m.log()
    names = sorted(os.listdir(m.mnt))
    assert "trainer_state.json" in names and "latest" not in names, names
    assert "global_step2" not in names and "zero_to_fp32.py" not in names
    assert "logits equal" in check("hf", ck, m.mnt)
    m.unmount()
    m = mount(ck / "global_step2", ["format=hf"])
    assert sorted(os.listdir(m.mnt)) == ["config.json", "model.safetensors"]
    assert "logits equal" in check("hf", ck / "global_step2", m.mnt)


# ------------------------------------------------------------ universal

_converted = {}


def _universal_ref(src, tmp):
    """DeepSpeed's own ds_to_universal output of src's tag, as a save
    directory load_universal takes (its latest_universal, and the save's
    config.json), made once per save."""
    if src not in _converted:
        out = tmp / "ref"
        out.mkdir()
        run(["-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
             src / "global_step2", "--output_folder",
             out / "global_step2_universal", "--inject_missing_state"],
            cwd=tmp)
        (out / "latest_universal").write_text("global_step2_universal")
        shutil.copy(src / "config.json", out)
        _converted[src] = out
    return _converted[src]


@pytest.mark.parametrize("stage,world", [(2, 1), (2, 4), (3, 1)])
def test_universal(save, mount, tmp_path_factory, stage, world):
    """DeepSpeed loads the universal view with load_universal at another
    world size and resumes exactly as from its own ds_to_universal."""
    src = save(stage, "bf16")
    tmp = tmp_path_factory.mktemp(f"uni{stage}_{world}")
    ref = _universal_ref(src, tmp)
    m = mount(src, ["format=universal"])
    common = ["--model", "llama", "--stage", stage, "--dtype", "bf16",
              "--universal"]
    run([RESUMER, "--src", ref, "--out", tmp / "ref.pt", *common],
        nproc=world, cwd=tmp)
    run([RESUMER, "--src", m.mnt, "--out", tmp / "got.pt", *common],
        nproc=world, cwd=tmp)
    out = check("universal", tmp / "ref.pt", tmp / "got.pt")
    assert f"at world size {world}" in out, out


@pytest.mark.parametrize("stage", [2, 3])
def test_universal_source(save, mount, tmp_path_factory, stage):
    """DeepSpeed's own universal checkpoint as a source: its hf view
    loads in transformers with the logits of the model DeepSpeed saved
    (stage 3's frozen params come from the copied model-states files)."""
    src = save(stage, "bf16")
    ref = _universal_ref(src, tmp_path_factory.mktemp(f"ucsrc{stage}"))
    m = mount(ref, ["format=hf"])
    assert "logits equal" in check("hf", src, m.mnt)
    m.unmount()
    m = mount(ref / "global_step2_universal", ["format=hf"])
    assert "logits equal" in check("hf", src, m.mnt)


# ------------------------------------------------------------ bad input

def _copy(src, tmp, name):
    dst = tmp / name
    shutil.copytree(src, dst, symlinks=True)
    return dst


def _rewrite_optim(path, edit):
    """Loads an optimizer file with torch, edits its dict, saves it."""
    run(["-c", f"""
import torch
p = {str(path)!r}
sd = torch.load(p, weights_only=False)
{edit}
torch.save(sd, p)
"""])


def test_bad_input(save, failing_mount, tmp_path):
    src = save(2, "bf16")
    tag = "global_step2"
    opt1 = f"bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"

    bad = _copy(src, tmp_path, "missing_rank")
    (bad / tag / opt1).unlink()
    rc, err = failing_mount(bad, ["format=hf"])
    assert_refused(rc, err, "expected 2 *_optim_states.pt", "found 1",
                   f"rank 1's {opt1} is missing")

    bad = _copy(src, tmp_path, "count")
    _rewrite_optim(bad / tag / opt1,
                   "sd['optimizer_state_dict']['partition_count'] = [3]")
    rc, err = failing_mount(bad, ["format=hf"])
    assert_refused(rc, err, opt1, "partition_count is 3",
                   "rank 0's file says 2")

    bad = _copy(src, tmp_path, "shapes")
    ms = bad / tag / "mp_rank_00_model_states.pt"
    _rewrite_optim(ms, "k = next(iter(sd['param_shapes'][0])); "
                       "sd['param_shapes'][0][k] = torch.Size([97, 32])")
    rc, err = failing_mount(bad, ["format=hf"])
    assert_refused(rc, err, str(bad / tag), "param_shapes of group 0",
                   "fp32 partitions")

    bad = _copy(src, tmp_path, "class")
    _rewrite_optim(bad / tag / opt1,
                   "import fractions; sd['x'] = fractions.Fraction(1, 3)")
    rc, err = failing_mount(bad, ["format=hf"])
    assert_refused(rc, err, opt1, "fractions")

    bad = _copy(src, tmp_path, "latest")
    (bad / "latest").write_text("global_step9\n")
    rc, err = failing_mount(bad, ["format=hf"])
    assert_refused(rc, err, "latest", "global_step9", "missing")


def test_no_config(save, failing_mount, tmp_path):
    """The hf view of a save without config.json (a plain module) asks
    for -o hf_config=."""
    src = save(1, "fp32", "plain")
    rc, err = failing_mount(src, ["format=hf"])
    assert_refused(rc, err, "config.json", "-o hf_config=FILE")
