"""megatron-core's distributed optimizer resumed at a new TP through a view.

megatron-core 0.15.3 trains a tiny bf16 GPTModel two steps at tp=2, dp=2 on
CPU over gloo and saves it with its DistributedOptimizer in each form
(scripts/make_distopt_checkpoint.py); megatron-core 0.13.1 runs the same
training and saves its flattened_range form. Then 0.15.3's
DistributedOptimizer loads a view at tp 1 and 4, and what it holds (fp32
main params, exp_avg, exp_avg_sq, steps) must equal, value for value, what
it holds after loading the fully_reshardable save of the same run at that
TP by itself.
"""

import pytest

from mcore import MCORE13, REPO, needs_mcore, needs_mcore13, run_py
from test_bad_input import assert_refused
from test_torch_dist import _copy, _rewrite_metadata

pytestmark = needs_mcore

SCRIPT = REPO / "scripts" / "make_distopt_checkpoint.py"

@pytest.fixture(scope="module")
def distopt(tmp_path_factory):
    """The saves of one run in each form, what the optimizer held when it
    saved, and a cache of megatron-core's own loads."""
    base = tmp_path_factory.mktemp("distopt")
    run_py(SCRIPT, "save", base, "--tp", 2, "--world", 4, "--forms",
           "fully_reshardable,dp_reshardable,dp_reshardable:fully_parallel,"
           "fully_sharded_model_space,fully_sharded_model_space:fully_parallel",
           "--dump", base / "saved.pt")
    return base


@pytest.fixture(scope="module")
def distopt13(tmp_path_factory):
    """The same run under megatron-core 0.13.1, saved in its default form
    (fully_sharded_model_space: flattened_range pieces), plainly and fully
    parallel.  Its .metadata has no mcore_data (see
    requirements-mcore13.txt)."""
    base = tmp_path_factory.mktemp("distopt13")
    run_py(SCRIPT, "save", base, "--tp", 2, "--world", 4, "--forms",
           "fully_sharded_model_space,fully_sharded_model_space:fully_parallel",
           "--dump", base / "saved.pt", mcore=MCORE13)
    return base


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    """A SwiGLU run (fc1 stored as [W; V] in 2*tp chunks), saved twice:
    fully_reshardable with one bucket (the oracle's), dp_reshardable with
    three buckets per buffer (overlap_grad_reduce), whose DP shards cut
    params inside rows."""
    base = tmp_path_factory.mktemp("distopt_gated")
    run_py(SCRIPT, "save", base / "one", "--swiglu", "--forms",
           "fully_reshardable")
    run_py(SCRIPT, "save", base / "three", "--swiglu", "--buckets", 3,
           "--forms", "dp_reshardable")
    return base


def load(ckpt, tp, dump, *more):
    run_py(SCRIPT, "load", ckpt, "--tp", tp, "--world", 4, "--dump", dump,
           *more)
    return dump


def direct(distopt, tp):
    """megatron-core's load of the fully_reshardable save at tp."""
    dump = distopt / f"direct_tp{tp}.pt"
    return dump if dump.exists() else load(distopt / "fully_reshardable", tp, dump)


def assert_same_states(got, want):
    out = run_py(SCRIPT, "compare", got, want)
    # Each of the tiny model's 28 params (2 layers of 12, and 4) is on
    # some rank.
    assert " state shards of 28 params on 4 ranks" in out, out


def test_oracle_loads_what_was_saved(distopt):
    """At the saved layout megatron-core's own load gives back what the
    optimizer held: the oracle for the other layouts is sound."""
    assert_same_states(direct(distopt, 2), distopt / "saved.pt")


# dp_reshardable_fully_parallel: Megatron-LM's default save, whose
# .metadata lists keys out of module order (ranks write shares).
# fully_sharded_model_space: 0.15.3's flattened_range pieces, with the
# shapes they were cut from in mcore_data.
@pytest.mark.parametrize("form", [
    "fully_reshardable", "dp_reshardable", "dp_reshardable_fully_parallel",
    "fully_sharded_model_space", "fully_sharded_model_space_fully_parallel"])
@pytest.mark.parametrize("tp", [1, 4])
def test_view_resumes_at_new_tp(distopt, mount, tmp_path, form, tp):
    m = mount(distopt / form, [f"tp={tp}"])
    got = load(m.mnt, tp, tmp_path / "view.pt")
    assert_same_states(got, direct(distopt, tp))


@needs_mcore13
def test_013_trains_as_015(distopt, distopt13):
    """megatron-core 0.13.1 and 0.15.3 hold the same optimizer state after
    the same training: 0.15.3's own loads are the oracle for 0.13's saves."""
    assert_same_states(distopt13 / "saved.pt", distopt / "saved.pt")


@needs_mcore13
@pytest.mark.parametrize("form", ["fully_sharded_model_space",
                                  "fully_sharded_model_space_fully_parallel"])
@pytest.mark.parametrize("tp", [1, 4])
def test_013_flattened_range_resumes_at_new_tp(distopt, distopt13, mount,
                                               tmp_path, form, tp):
    """0.13's flattened_range state, whose shapes only the model tensors
    tell, through a view 0.15.3 loads at a new TP."""
    m = mount(distopt13 / form, [f"tp={tp}"])
    got = load(m.mnt, tp, tmp_path / "view.pt")
    assert_same_states(got, direct(distopt, tp))


@needs_mcore13
def test_013_with_mcore_data(distopt, distopt13, mount, tmp_path):
    """0.13 under a torch whose DCP writer pickles the Metadata it is given:
    the attribute 0.13's planner sets (plain Metadata, not 0.15's
    MCoreMetadata) names the shapes.  Made by setting it, as that planner
    does, on a copy of the 0.13.1 save."""
    src = _copy(distopt13 / "fully_sharded_model_space", tmp_path / "with_md")
    _rewrite_metadata(src, """
sdm = md.state_dict_metadata
assert type(md).__name__ == "Metadata" and not hasattr(md, "mcore_data")
md.mcore_data = {k: ({"nd_reformulated_orig_global_shape":
                      tuple(sdm[k.split(".", 3)[3]].size)}
                     if k.startswith("optimizer.state.") else {})
                 for k in sdm if hasattr(sdm[k], "chunks")}
""")
    m = mount(src, ["tp=4"])
    assert_same_states(load(m.mnt, 4, tmp_path / "view.pt"), direct(distopt, 4))


def test_flattened_range_wrong_shape_refused(distopt, failing_mount, tmp_path):
    """An mcore_data shape the stored reformulation does not fit: refused,
    naming the tensor, not served as some other cut."""
    src = _copy(distopt / "fully_sharded_model_space", tmp_path / "bad_shape")
    k = "optimizer.state.exp_avg.decoder.final_layernorm.weight"
    _rewrite_metadata(src, f"""
md.mcore_data[{k!r}]["nd_reformulated_orig_global_shape"] = (63,)
""")
    rc, err = failing_mount(src, ["tp=1"])
    assert_refused(rc, err, ".metadata", k, "flattened_range",
                   "its shards would hold 63 elements")


def test_gated_three_buckets(gated, mount, tmp_path):
    """Params spread over three buckets and cut by DP shards inside rows,
    of a gated fc1 whose state must keep the [W; V] split at tp 4.
    Bucketing does not change the training (each grad is reduced over the
    same two ranks), so the one-bucket save is the oracle."""
    want = load(gated / "one" / "fully_reshardable", 4,
                tmp_path / "direct.pt", "--swiglu")
    m = mount(gated / "three" / "dp_reshardable", ["tp=4"])
    assert_same_states(load(m.mnt, 4, tmp_path / "view.pt", "--swiglu"), want)


@needs_mcore13
def test_013_gated_three_buckets(gated, mount, tmp_path):
    """0.13's flattened_range pieces of a gated fc1 over three buckets, cut
    by DP shards, become boxes of each half of [W; V] at tp 4."""
    want = load(gated / "one" / "fully_reshardable", 4,
                tmp_path / "direct.pt", "--swiglu")
    run_py(SCRIPT, "save", tmp_path / "three13", "--swiglu", "--buckets", 3,
           "--forms", "fully_sharded_model_space", mcore=MCORE13)
    m = mount(tmp_path / "three13" / "fully_sharded_model_space", ["tp=4"])
    assert_same_states(load(m.mnt, 4, tmp_path / "view.pt", "--swiglu"), want)


def test_keys_out_of_order_are_placed_by_value(distopt, mount, tmp_path):
    """Two params of one size swapped in .metadata (sizes alone cannot tell
    them apart) and the embedding moved past the layers: the main params'
    values put each in its place."""
    src = _copy(distopt / "dp_reshardable", tmp_path / "swapped")
    a = "decoder.layers.self_attention.linear_qkv.layer_norm_weight"
    b = "decoder.layers.self_attention.linear_qkv.layer_norm_bias"
    emb = "embedding.word_embeddings.weight"
    _rewrite_metadata(src, f"""
old = md.state_dict_metadata
keys = [{b!r} if k == {a!r} else {a!r} if k == {b!r} else k
        for k in old if k != {emb!r}]
keys.insert(keys.index("decoder.final_layernorm.weight"), {emb!r})
md.state_dict_metadata = {{k: old[k] for k in keys}}
""")
    m = mount(src, ["tp=4"])
    assert_same_states(load(m.mnt, 4, tmp_path / "view.pt"), direct(distopt, 4))


def test_buckets_without_main_params_refused(distopt, failing_mount, tmp_path):
    """Without the fp32 main params nothing checks the recomputed layout:
    the mount is refused, saying so."""
    src = _copy(distopt / "dp_reshardable", tmp_path / "no_param")
    _rewrite_metadata(src, """
md.state_dict_metadata = {k: v for k, v in md.state_dict_metadata.items()
                          if not k.endswith(".param")}
""")
    rc, err = failing_mount(src, ["tp=1"])
    assert_refused(rc, err, ".metadata", "no 'param' state")
