"""megatron-core's distributed optimizer with pipeline stages and MoE expert
buffers, resumed at a new layout through a view.

megatron-core 0.15.3 saves a tiny bf16 GPTModel's DistributedOptimizer after
two steps on CPU over gloo (scripts/make_distopt_checkpoint.py; the steps
take made-up gradients, since the harness runs no pipeline or expert
forward, but the optimizer, its buffers and its sharded state dicts are
megatron-core's own) in each form: at pp 2 (each stage's buffers over its
own layers), and as an MoE model at ep 2 (chained_0: the dense optimizer,
chained_1: the expert one, with buffers per expert group).  Then 0.15.3's
DistributedOptimizer loads a view at another TP, PP or EP, and what it holds
(fp32 main params, exp_avg, exp_avg_sq, steps) must equal, value for value,
what it holds after loading the fully_reshardable save of the same run at
that layout by itself.
"""

import pytest

from mcore import REPO, needs_mcore, run_py
from test_bad_input import assert_refused
from test_torch_dist import _copy, _rewrite_metadata

pytestmark = needs_mcore

SCRIPT = REPO / "scripts" / "make_distopt_checkpoint.py"
FORMS = ("fully_reshardable,dp_reshardable,dp_reshardable:fully_parallel,"
         "fully_sharded_model_space")
MOE = ("--experts", 4, "--topk", 2)
# Layer 0 dense (so every layer has keys of its own), a shared expert,
# four layers over two stages.
MOE_PP = (*MOE, "--shared-expert", "--first-dense", "--layers", 4)


def _save(base, *args):
    run_py(SCRIPT, "save", base, "--forms", FORMS, "--dump",
           base / "saved.pt", *args)
    return base


@pytest.fixture(scope="module")
def pp2(tmp_path_factory):
    """tp 1, pp 2, dp 2: two stages' buffers, dp_group_idx_0 and _1."""
    return _save(tmp_path_factory.mktemp("distopt_pp2"), "--tp", 1, "--pp", 2,
                 "--world", 4)


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """tp 1, ep 2, dp 2 (expert dp 1): chained_0 and chained_1."""
    return _save(tmp_path_factory.mktemp("distopt_moe"), *MOE, "--tp", 1,
                 "--ep", 2, "--world", 2)


@pytest.fixture(scope="module")
def moe_ep1(tmp_path_factory):
    """tp 1, ep 1, dp 2: megatron-core keeps the experts in the one
    optimizer's buffers, with the dense params (no chained_ records)."""
    return _save(tmp_path_factory.mktemp("distopt_moe_ep1"), *MOE,
                 "--tp", 1, "--ep", 1, "--world", 2)


@pytest.fixture(scope="module")
def moe_pp(tmp_path_factory):
    """tp 1, pp 2, ep 2, dp 2: expert groups per stage and EP rank, keys
    per layer (decoder.layers.<n>.mlp.experts.experts.*)."""
    return _save(tmp_path_factory.mktemp("distopt_moe_pp"), *MOE_PP,
                 "--tp", 1, "--pp", 2, "--ep", 2, "--world", 4)


def load(ckpt, dump, *layout):
    run_py(SCRIPT, "load", ckpt, "--dump", dump, *layout)
    return dump


def direct(base, layout):
    """megatron-core's load of the fully_reshardable save at layout."""
    dump = base / ("direct" + "_".join(map(str, layout)).replace("-", "") + ".pt")
    return dump if dump.exists() else load(base / "fully_reshardable", dump,
                                           *layout)


def assert_same_states(got, want, ranks):
    out = run_py(SCRIPT, "compare", got, want)
    assert f" on {ranks} ranks" in out, out


def resume(base, form, mount, tmp_path, layout, world):
    tp = layout[layout.index("--tp") + 1]
    m = mount(base / form, [f"tp={tp}"])
    layout = (*layout, "--world", world)
    assert_same_states(load(m.mnt, tmp_path / "view.pt", *layout),
                       direct(base, layout), world)


def test_oracles_load_what_was_saved(pp2, moe):
    """At the saved layouts megatron-core's own loads give back what the
    optimizers held: the oracle is sound for stages and experts."""
    assert_same_states(direct(pp2, ("--tp", 1, "--pp", 2, "--world", 4)),
                       pp2 / "saved.pt", 4)
    assert_same_states(direct(moe, (*MOE, "--tp", 1, "--ep", 2, "--world", 2)),
                       moe / "saved.pt", 2)


# dp_reshardable_fully_parallel: Megatron-LM's default save, whose
# .metadata lists keys out of module order.
@pytest.mark.parametrize("form,layout,world", [
    ("dp_reshardable", ("--tp", 1, "--pp", 1), 2),
    ("dp_reshardable", ("--tp", 2, "--pp", 1), 4),
    ("dp_reshardable", ("--tp", 2, "--pp", 2), 4),
    ("dp_reshardable_fully_parallel", ("--tp", 2, "--pp", 1), 4),
    ("fully_sharded_model_space", ("--tp", 1, "--pp", 1), 2),
])
def test_stages_resume_at_new_layout(pp2, mount, tmp_path, form, layout,
                                     world):
    resume(pp2, form, mount, tmp_path, layout, world)


@pytest.mark.parametrize("form,layout,world", [
    ("dp_reshardable", ("--tp", 2, "--ep", 2), 4),
    ("dp_reshardable", ("--tp", 1, "--ep", 4), 4),
    ("dp_reshardable_fully_parallel", ("--tp", 2, "--ep", 2), 4),
    ("fully_sharded_model_space", ("--tp", 2, "--ep", 2), 4),
])
def test_experts_resume_at_new_layout(moe, mount, tmp_path, form, layout,
                                      world):
    resume(moe, form, mount, tmp_path, (*MOE, *layout), world)


def test_experts_of_one_optimizer_resume_at_new_tp(moe_ep1, mount, tmp_path):
    """ep 1: each layer's experts in the one optimizer's buffers, after
    its router, expert by expert."""
    resume(moe_ep1, "dp_reshardable", mount, tmp_path,
           (*MOE, "--tp", 2, "--ep", 1), 2)


@pytest.mark.parametrize("form", ["dp_reshardable",
                                  "fully_sharded_model_space"])
def test_expert_stages_resume_at_new_layout(moe_pp, mount, tmp_path, form):
    """Stages and expert groups together, a dense first layer and a shared
    expert (dense params in an MoE layer): pp 2, ep 2 to pp 1, tp 2."""
    resume(moe_pp, form, mount, tmp_path,
           (*MOE_PP, "--tp", 2, "--pp", 1, "--ep", 2), 4)


def _rename(src, old, new=None):
    """Keys starting with old renamed to start with new (dropped when new
    is None) in .metadata."""
    _rewrite_metadata(src, f"""
import dataclasses
old, new = {old!r}, {new!r}
def ren(k):
    return k if not k.startswith(old) else None if new is None else new + k[len(old):]
md.state_dict_metadata = {{ren(k): v for k, v in md.state_dict_metadata.items()
                          if ren(k) is not None}}
md.storage_data = {{dataclasses.replace(i, fqn=ren(i.fqn)): s
                    for i, s in md.storage_data.items() if ren(i.fqn) is not None}}
""")


def test_other_chains_refused(moe, failing_mount, tmp_path):
    """Chained optimizers other than megatron-core's dense and expert pair
    (here the expert one as chained_2.) are refused, not passed through."""
    src = _copy(moe / "dp_reshardable", tmp_path / "chain2")
    _rename(src, "chained_1.", "chained_2.")
    rc, err = failing_mount(src, ["tp=1"])
    assert_refused(rc, err, ".metadata", "chained optimizers",
                   "dense (chained_0.) and an expert (chained_1.)")


def test_expert_buckets_missing_refused(moe, failing_mount, tmp_path):
    """The dense optimizer's buckets as the only optimizer's (the expert
    optimizer's dropped): the model's expert params are then in no bucket,
    refused, not mounted without their state."""
    src = _copy(moe / "dp_reshardable", tmp_path / "one")
    _rename(src, "chained_1.")
    _rename(src, "chained_0.", "")
    rc, err = failing_mount(src, ["tp=1"])
    assert_refused(rc, err, ".metadata",
                   "the recomputed bucket layout does not match")


def test_missing_stage_refused(pp2, failing_mount, tmp_path):
    """Without the second stage's buckets the first stage's would have to
    hold every layer: refused, since their main params do not fit there."""
    src = _copy(pp2 / "dp_reshardable", tmp_path / "one_stage")
    _rename(src, "optimizer.distributed.dp_group_idx_1.")
    rc, err = failing_mount(src, ["tp=1"])
    assert_refused(rc, err, ".metadata", "no param fits at element 0",
                   "the recomputed bucket layout does not match")


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    """Tied embedding and output layer at tp 1, pp 2, dp 2: the last
    stage's buffers hold the output layer's copy of the embedding (in a
    bucket of its own, as the first stage's embedding is), saved under no
    key."""
    base = tmp_path_factory.mktemp("distopt_tied")
    run_py(SCRIPT, "save", base, "--tied", "--tp", 1, "--pp", 2, "--world", 4,
           "--forms", "dp_reshardable,fully_sharded_model_space", "--dump",
           base / "saved.pt")
    return base


@pytest.mark.parametrize("form", ["dp_reshardable",
                                  "fully_sharded_model_space"])
def test_tied_stages_resume_at_saved_layout(tied, mount, tmp_path, form):
    """megatron-core 0.15.3's own fully_reshardable save of this run is
    wrong (the shared embedding's bucket makes two buckets per buffer,
    docs/FORMATS.md), so here the oracle is what the optimizer held when it
    saved: the view at the saved layout gives it back, the last stage's
    copy included."""
    m = mount(tied / form, ["tp=1"])
    got = load(m.mnt, tmp_path / "view.pt", "--tied", "--tp", 1, "--pp", 2,
               "--world", 4)
    assert_same_states(got, tied / "saved.pt", 4)


def test_tied_stages_resume_at_new_layout(tied, mount, tmp_path):
    """At pp 1, tp 2 the views of the two forms, read by separate code
    (buckets laid out again; flattened ranges unflattened), load the same
    state; each gave back the saved state at the saved layout."""
    layout = ("--tied", "--tp", 2, "--pp", 1, "--world", 2)
    dp = load(mount(tied / "dp_reshardable", ["tp=2"]).mnt,
              tmp_path / "dp.pt", *layout)
    fs = load(mount(tied / "fully_sharded_model_space", ["tp=2"]).mnt,
              tmp_path / "fs.pt", *layout)
    assert_same_states(dp, fs, 2)
