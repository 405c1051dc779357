"""-o rules=FILE and -o pp=N through a real mount.

A user rule overrides a built-in one: with linear_fc2.weight declared
replicated, its arrays keep the stored grid (byte-identical to the source)
while every other tensor is resharded as usual.  A user rule can also split
a tensor no built-in rule knows.  Malformed rule files and a pp that does
not divide the layer count refuse the mount with a line naming the cause.
"""
import json

import ml_dtypes  # noqa: F401
import numpy as np
import pytest
import zarr

from oracle import ExpectedView
from test_bad_input import assert_refused

FC2 = "decoder.layers.mlp.linear_fc2.weight"
QKV = "decoder.layers.self_attention.linear_qkv.weight"


def test_user_rule_overrides_builtin(sample, mount, tmp_path):
    src = sample(2)
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"rules": [
        {"match": "*linear_fc2.weight", "split": "replicated"}]}))
    m = mount(src, ["tp=8", f"rules={rules}"])
    for key in (FC2, "optimizer.state.exp_avg." + FC2):
        assert (m.mnt / key / ".zarray").read_bytes() == \
            (src / key / ".zarray").read_bytes()
        for chunk in (src / key).iterdir():
            assert (m.mnt / key / chunk.name).read_bytes() == \
                chunk.read_bytes(), chunk
    # everything else is still the tp=8 view
    exp = ExpectedView(src, 8)
    assert (m.mnt / QKV / ".zarray").read_bytes() == exp.read(f"{QKV}/.zarray")
    assert (m.mnt / QKV / "1.7.0").read_bytes() == exp.read(f"{QKV}/1.7.0")


def test_user_rule_splits_unknown_tensor(sample, mount, tmp_path):
    """Copy a row-parallel array under a name no rule knows; a user rule
    (axis 1 after one layer axis) must split it exactly like the known one."""
    src = sample(2)
    odd = src.parent / "odd_ckpt"
    if not odd.exists():
        import shutil
        shutil.copytree(src, odd)
        shutil.copytree(odd / FC2, odd / "decoder.layers.mystery.weight")
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"rules": [
        {"match": "*mystery.weight", "axis": 1, "layer_axes": 1}]}))
    m = mount(odd, ["tp=8", f"rules={rules}"])
    a = zarr.open(str(m.mnt / "decoder.layers.mystery.weight"), mode="r")
    b = zarr.open(str(m.mnt / FC2), mode="r")
    assert a.chunks == b.chunks and a.chunks != \
        zarr.open(str(odd / FC2), mode="r").chunks
    assert np.array_equal(a[...].view(np.uint16), b[...].view(np.uint16))


@pytest.mark.parametrize("text,needle", [
    ("{not json", "not valid JSON"),
    ('{"rules": [{"match": "*x", "split": "diagonal"}]}', '"split" must be'),
    ('{"rules": [{"split": "row"}]}', '"match"'),
    ('{"rules": [{"match": "*x", "axis": -1}]}', '"axis"'),
])
def test_bad_rules_file(sample, failing_mount, tmp_path, text, needle):
    rules = tmp_path / "rules.json"
    rules.write_text(text)
    rc, err = failing_mount(sample(2), ["tp=8", f"rules={rules}"])
    assert_refused(rc, err, str(rules), needle)


def test_missing_rules_file(sample, failing_mount, tmp_path):
    rc, err = failing_mount(sample(2), [f"rules={tmp_path}/nope.json"])
    assert_refused(rc, err, "nope.json")


def test_pp(sample, mount, failing_mount):
    src = sample(2)                      # 4 layers
    rc, err = failing_mount(src, ["pp=3"])
    assert_refused(rc, err, "pp=3", "4 layers")
    m = mount(src, ["tp=2", "pp=2"])     # divides: same names, same bytes
    exp = ExpectedView(src, 2)
    assert (m.mnt / QKV / "3.1.0").read_bytes() == exp.read(f"{QKV}/3.1.0")
