"""Mixture-of-Experts in legacy per-rank checkpoints, as a source and as a
view (mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt).

megatron-core 0.15.3 builds the sources on CPU over gloo
(scripts/make_moe_checkpoint.py: a GPTModel of 4 layers with 8 experts,
top-2, SwiGLU, a gated shared expert and a router expert bias; every layer
MoE, or the first layer dense) and saves each rank the way Megatron-LM's
--ckpt-format torch does: args, checkpoint_version 3.0 and
model.state_dict_for_save_checkpoint() in the directory its
get_checkpoint_name names.  SequentialMLP is the only expert module that
builds without a GPU; the TEGroupedMLP and GroupedMLP sources are the same
model's keys renamed into those modules' forms by the writer.

The oracle is megatron-core itself: it loads the source at the source's
layout (each rank torch.loads its own file and load_state_dict(strict=
True), as Megatron-LM's load_checkpoint does) and every view at the view's
layout the same way; both dumps are merged into global tensors (every
expert under its global index, TP shards joined, replicas compared) and
must be equal byte for byte.  A torch_dist view of the source is loaded
with dist_checkpointing.load (strict) as a cross-check.  Bad sources are
real saves with one thing changed, each refused with one line.
"""
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from mcore import REPO, needs_mcore, run_py
from test_bad_input import assert_refused

pytestmark = needs_mcore

SCRIPT = REPO / "scripts" / "make_moe_checkpoint.py"
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO / "scripts"))
from make_moe_checkpoint import load_dump  # noqa: E402  (numpy only)

# name: (save arguments, layout (tp, pp, ep), first dense)
SOURCES = {
    "tp2ep2": (["--tp", 2, "--ep", 2], (2, 1, 2), False),
    "te": (["--tp", 2, "--ep", 2, "--form", "te"], (2, 1, 2), False),
    "grouped": (["--tp", 2, "--ep", 2, "--form", "grouped"], (2, 1, 2),
                False),
    "ep4dense0": (["--ep", 4, "--first-dense"], (1, 1, 4), True),
    "pp2ep2": (["--pp", 2, "--ep", 2, "--first-dense"], (1, 2, 2), True),
}
# the forms renamed from SequentialMLP's keys share its oracle
ORACLE_OF = {"te": "tp2ep2", "grouped": "tp2ep2"}


def layout(tp, pp, ep, first_dense):
    args = ["--tp", tp, "--pp", pp, "--ep", ep]
    return args + (["--first-dense"] if first_dense else [])


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """moe(name) -> (source iteration directory, oracle dump prefix)."""
    base = tmp_path_factory.mktemp("moe_legacy")
    made = {}

    def _make(name):
        if name not in made:
            args, (tp, pp, ep), dense = SOURCES[name]
            src = base / name / "iter_0000001"
            run_py(SCRIPT, "save", src, *args, "--format", "torch")
            oracle = ORACLE_OF.get(name)
            if oracle:
                made[name] = (src, _make(oracle)[1])
            else:
                dump = base / f"{name}.oracle"
                run_py(SCRIPT, "load", src, *layout(tp, pp, ep, dense),
                       "--format", "torch", "--dump", dump)
                made[name] = (src, dump)
        return made[name]
    return _make


def load_view(mnt, dump, tp, pp, ep, dense, form="sequential",
              fmt="torch"):
    """megatron-core loads the view strictly at (tp, pp, ep); its
    parameters must be the source's."""
    got = dump.parent / f"{dump.name}.view_{tp}_{pp}_{ep}_{form}_{fmt}"
    run_py(SCRIPT, "load", mnt, *layout(tp, pp, ep, dense), "--form", form,
           "--format", fmt, "--dump", got)
    out = run_py(SCRIPT, "compare", got, dump)
    assert out.strip().splitlines()[-1].startswith("OK"), out


def rank_dirs(mnt):
    return sorted(p.name for p in mnt.iterdir())


@pytest.mark.parametrize("tp,ep", [(1, 1), (1, 2), (1, 4), (2, 1), (2, 2)])
def test_view_at_new_tp_ep(moe, mount, tp, ep):
    """Every layer MoE, stored at tp=2, ep=2: the view at each (tp, ep)
    loads strictly and holds the source's parameters."""
    src, dump = moe("tp2ep2")
    m = mount(src, [f"tp={tp}", f"ep={ep}"])
    want = [f"mp_rank_{t:02d}" + (f"_{e:03d}" if ep > 1 else "")
            for t in range(tp) for e in range(ep)]
    assert rank_dirs(m.mnt) == sorted(want)
    load_view(m.mnt, dump, tp, 1, ep, False)


def test_view_keeps_source_ep(moe, mount):
    """Without -o ep= a per-rank view keeps the source's expert
    parallelism, as it keeps its pipeline."""
    src, dump = moe("ep4dense0")
    m = mount(src, ["tp=1"])
    assert rank_dirs(m.mnt) == [f"mp_rank_00_{e:03d}" for e in range(4)]
    load_view(m.mnt, dump, 1, 1, 4, True)


@pytest.mark.parametrize("tp,pp,ep", [(1, 1, 1), (2, 1, 2), (1, 2, 2)])
def test_first_layer_dense(moe, mount, tp, pp, ep):
    """moe_layer_freq [0, 1, 1, 1]: layer 0 a dense MLP."""
    src, dump = moe("ep4dense0")
    m = mount(src, [f"tp={tp}", f"pp={pp}", f"ep={ep}"])
    load_view(m.mnt, dump, tp, pp, ep, True)


@pytest.mark.parametrize("tp,pp,ep", [(1, 2, 2), (2, 1, 1), (1, 1, 4)])
def test_pipeline_and_expert_source(moe, mount, tp, pp, ep):
    """Stored at pp=2, ep=2: mp_rank_00_000_000 .. mp_rank_00_001_001."""
    src, dump = moe("pp2ep2")
    assert rank_dirs(src) == ["mp_rank_00_000_000", "mp_rank_00_000_001",
                              "mp_rank_00_001_000", "mp_rank_00_001_001"]
    m = mount(src, [f"tp={tp}", f"pp={pp}", f"ep={ep}"])
    load_view(m.mnt, dump, tp, pp, ep, True)


@pytest.mark.parametrize("name", ["te", "grouped"])
def test_grouped_key_forms(moe, mount, name):
    """TEGroupedMLP's linear_fc1.weight<i> and GroupedMLP's weight1/weight2
    (experts transposed in one matrix) read as SequentialMLP's values;
    -o experts= writes either form."""
    src, dump = moe(name)
    m = mount(src, ["tp=1", "ep=2", "experts=sequential"], name="seq")
    load_view(m.mnt, dump, 1, 1, 2, False)
    m = mount(src, ["tp=2", "ep=1", "experts=grouped"], name="grouped")
    load_view(m.mnt, dump, 2, 1, 1, False, form="te")


def test_te_form_kept(moe, mount):
    """A TEGroupedMLP source keeps its form by default, with the
    GroupedLinear's _extra_state (None) a strict load of TE expects."""
    src, dump = moe("te")
    m = mount(src, ["tp=1", "ep=1"])
    out = run_py("-c", f"""
import torch
sd = torch.load({str(m.mnt / 'mp_rank_00' / 'model_optim_rng.pt')!r},
                weights_only=False)
keys = [k for k in sd['model'] if '.layers.0.mlp.experts.' in k]
print(sd['args'].moe_grouped_gemm, sd['args'].expert_model_parallel_size,
      ' '.join(keys))
""").strip().splitlines()[-1].split()
    assert out[:2] == ["True", "1"], out
    want = [f"decoder.layers.0.mlp.experts.linear_fc1.weight{i}"
            for i in range(8)] + \
        ["decoder.layers.0.mlp.experts.linear_fc1._extra_state"] + \
        [f"decoder.layers.0.mlp.experts.linear_fc2.weight{i}"
         for i in range(8)] + \
        ["decoder.layers.0.mlp.experts.linear_fc2._extra_state"]
    assert out[2:] == want
    load_view(m.mnt, dump, 1, 1, 1, False, form="te")


def test_grouped_view_refused(moe, failing_mount):
    src, _ = moe("grouped")
    rc, err = failing_mount(src, ["tp=1"])
    assert_refused(rc, err, "GroupedMLP", "experts=sequential")


def test_torch_dist_cross_check(moe, mount, tmp_path):
    """The same source as a torch_dist view at a new layout, read whole by
    torch's own DCP reader (tests/mount/dcp_dump.py; megatron-core's
    dist_checkpointing.load wants a common.pt, which a view of a per-rank
    source has no content for): expert weights are (E, out, in) under
    megatron-core's dist names, expert g the source's global expert g."""
    src, dump = moe("ep4dense0")
    m = mount(src, ["format=torch_dist", "tp=2", "ep=2"])
    out = tmp_path / "dcp.npz"
    run_py(HERE / "dcp_dump.py", m.mnt, out)
    got = np.load(out)
    want = load_dump(dump)
    seen = set()
    for name, value in want.items():
        hit = re.match(r"(.*\.mlp\.experts\.)local_experts\.(\d+)\.(.*)$",
                       name)
        if hit:
            key = f"{hit.group(1)}experts.{hit.group(3)}"
            assert np.array_equal(got[key][int(hit.group(2))], value), name
        else:
            key = name
            assert np.array_equal(got[key], value), name
        seen.add(key)
    assert seen == set(got.files), sorted(seen ^ set(got.files))


# ------------------------------------------------------------- refusals

EDIT = """
import sys, glob, torch
src, what = sys.argv[1], sys.argv[2]
for path in sorted(glob.glob(src + '/mp_rank_*/model_optim_rng.pt')):
    sd = torch.load(path, weights_only=False)
    a, m = sd['args'], sd['model']
    last = 'mp_rank_01_001' in path
    if what == 'etp':
        a.expert_tensor_parallel_size = 1
    elif what == 'ep':
        a.expert_model_parallel_size = 4
    elif what == 'num_experts':
        a.num_experts = 16
    elif what == 'freq':
        a.moe_layer_freq = 1
    elif what in ('hole', 'beyond') and last:
        for k in [k for k in m if '.layers.2.mlp.experts.local_experts.1.' in k]:
            v = m.pop(k)
            if what == 'beyond':
                m[k.replace('local_experts.1.', 'local_experts.4.')] = v
    elif what == 'overlap' and last:
        # local expert 0's fc1 once more, in TEGroupedMLP's form
        pre = 'decoder.layers.2.mlp.experts.'
        m[pre + 'linear_fc1.weight0'] = m[pre + 'local_experts.0.linear_fc1.weight']
    elif what == 'shared' and last:
        k = 'decoder.layers.1.mlp.shared_experts.linear_fc2.weight'
        m[k] = m[k][:, :8].clone()
    torch.save(sd, path)
"""


def broken(moe, tmp_path, name, what):
    src, _ = moe(name)
    out = tmp_path / what / src.name
    shutil.copytree(src, out)
    run_py("-c", EDIT, out, what)
    return out


@pytest.mark.parametrize("what,needles", [
    ("etp", ["mp_rank_00_000/model_optim_rng.pt",
             "args.expert_tensor_parallel_size", "TP, PP and EP rank"]),
    ("ep", ["args.expert_model_parallel_size is not 2"]),
    ("num_experts", ["mp_rank_00_000/model_optim_rng.pt",
                     "decoder.layers.0.mlp.experts.experts.linear_fc1.weight",
                     "lacks local expert 4 (global expert 4 of 16)"]),
    ("hole", ["mp_rank_01_001/model_optim_rng.pt",
              "decoder.layers.2.mlp.experts.experts.linear_fc1.weight",
              "lacks local expert 1 (global expert 5 of 8)"]),
    ("beyond", ["mp_rank_01_001/model_optim_rng.pt",
                "decoder.layers.2.mlp.experts.local_experts.4.linear_fc1.weight",
                "local expert 4", "makes 4 per rank"]),
    ("shared", ["mp_rank_01_001/model_optim_rng.pt",
                "decoder.layers.1.mlp.shared_experts.linear_fc2.weight",
                "differs in dtype or shape"]),
])
def test_bad_source_refused(moe, failing_mount, tmp_path, what, needles):
    rc, err = failing_mount(broken(moe, tmp_path, "tp2ep2", what), ["tp=1"])
    assert_refused(rc, err, *needles)


def test_expert_overlap_refused(moe, failing_mount, tmp_path):
    """Local expert 0 twice in one file, once in another module's key form
    (a dict holds each key once, so two forms are the way to name an
    expert twice)."""
    rc, err = failing_mount(broken(moe, tmp_path, "tp2ep2", "overlap"),
                            ["tp=1"])
    assert_refused(rc, err, "mp_rank_01_001/model_optim_rng.pt",
                   "decoder.layers.2.mlp.experts.linear_fc1.weight0",
                   "key form")


def test_moe_layer_freq_contradicted(moe, failing_mount, tmp_path):
    """args say every layer is MoE, but layer 0 is dense."""
    rc, err = failing_mount(broken(moe, tmp_path, "ep4dense0", "freq"),
                            ["tp=1"])
    assert_refused(rc, err, "mp_rank_00_000/model_optim_rng.pt", "layer 0",
                   "holds no experts", "moe_layer_freq")


def test_missing_ep_rank_refused(moe, failing_mount, tmp_path):
    src, _ = moe("ep4dense0")
    out = tmp_path / "missing" / src.name
    shutil.copytree(src, out)
    shutil.rmtree(out / "mp_rank_00_002")
    rc, err = failing_mount(out, ["tp=1"])
    # the EP rank directories then say ep=4 (00_003 is there), args too
    assert_refused(rc, err, "mp_rank_00_002/model_optim_rng.pt", "missing")


def test_view_etp_refused(moe, failing_mount):
    src, _ = moe("tp2ep2")
    rc, err = failing_mount(src, ["tp=2", "etp=1"])
    assert_refused(rc, err, "etp=1", "TP, PP and EP rank")
