"""Real Megatron-core checkpoints through the mount.

megatron-core 0.15 (the last line with the zarr backend) writes the source
checkpoints on CPU over gloo (scripts/make_mcore_checkpoint.py, run in
.venv-mcore).  Every file of each view is checked against the numpy oracle,
and megatron's own loader must read the view into a model at the view's TP
and get exactly what it gets when it reshards the source itself.
"""

import numpy as np
import pytest

from mcore import needs_mcore, run_mcore
from oracle import ExpectedView
from test_zarr_view import assert_tree_equals_oracle

pytestmark = needs_mcore


@pytest.fixture(scope="module")
def mcore_ckpt(tmp_path_factory):
    """tp -> a zarr checkpoint megatron-core saved at that TP, with the
    optimizer state of one AdamW step."""
    made = {}

    def get(tp):
        if tp not in made:
            out = tmp_path_factory.mktemp(f"mcore_tp{tp}") / "iter_0000001"
            run_mcore(out, "--tp", tp, "--backend", "zarr", "--with-optimizer")
            made[tp] = out
        return made[tp]
    return get


def load_dumps(prefix, tp):
    return [dict(np.load(f"{prefix}.{r}.npz")) for r in range(tp)]


# The tiny model has 4 query groups, so TP is at most 4.
@pytest.mark.parametrize("src_tp,tp", [(2, 1), (1, 2), (2, 4)])
def test_every_file_matches_oracle(mcore_ckpt, mount, src_tp, tp):
    src = mcore_ckpt(src_tp)
    m = mount(src, [f"tp={tp}"])
    assert_tree_equals_oracle(m.mnt, ExpectedView(src, tp))


@pytest.mark.parametrize("src_tp,tp", [(2, 1), (1, 2), (2, 4)])
def test_megatron_loads_view(mcore_ckpt, mount, tmp_path, src_tp, tp):
    src = mcore_ckpt(src_tp)
    m = mount(src, [f"tp={tp}"])
    run_mcore(tmp_path / "view", "--tp", tp, "--load-from", m.mnt)
    run_mcore(tmp_path / "direct", "--tp", tp, "--load-from", src)
    via_view = load_dumps(tmp_path / "view", tp)
    direct = load_dumps(tmp_path / "direct", tp)
    for rank in range(tp):
        assert sorted(via_view[rank]) == sorted(direct[rank])
        assert len(direct[rank]) >= 10
        for key, want in direct[rank].items():
            assert np.array_equal(via_view[rank][key], want), (rank, key)
