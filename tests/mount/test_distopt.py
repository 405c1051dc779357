"""megatron-core's distributed optimizer resumed at a new TP through a view.

megatron-core 0.15.3 trains a tiny bf16 GPTModel two steps at tp=2, dp=2 on
CPU over gloo and saves it with its DistributedOptimizer in each form
(scripts/make_distopt_checkpoint.py). Then its DistributedOptimizer loads a
view at tp 1 and 4, and what it holds (fp32 main params, exp_avg,
exp_avg_sq, steps) must equal, value for value, what it holds after loading
the fully_reshardable save of the same run at that TP by itself.
"""

import pytest

from mcore import REPO, needs_mcore, run_py

pytestmark = needs_mcore

SCRIPT = REPO / "scripts" / "make_distopt_checkpoint.py"

@pytest.fixture(scope="module")
def distopt(tmp_path_factory):
    """The saves of one run in each form, what the optimizer held when it
    saved, and a cache of megatron-core's own loads."""
    base = tmp_path_factory.mktemp("distopt")
    run_py(SCRIPT, "save", base, "--tp", 2, "--world", 4,
           "--forms", "fully_reshardable,dp_reshardable",
           "--dump", base / "saved.pt")
    return base


def load(ckpt, tp, dump, form="fully_reshardable"):
    run_py(SCRIPT, "load", ckpt, "--tp", tp, "--world", 4, "--form", form,
           "--dump", dump)
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


@pytest.mark.parametrize("form", ["fully_reshardable", "dp_reshardable"])
@pytest.mark.parametrize("tp", [1, 4])
def test_view_resumes_at_new_tp(distopt, mount, tmp_path, form, tp):
    m = mount(distopt / form, [f"tp={tp}"])
    got = load(m.mnt, tp, tmp_path / "view.pt")
    assert_same_states(got, direct(distopt, tp))
