"""The model families (share/reshardfs/families/) against two oracles no
one here wrote, beside test_families.py's megatron-core and transformers
4.57 checks:

- Megatron-Bridge 0.6.2 (.venv-bridge, Python 3.12): its own HF ->
  megatron-core conversion of an HF directory equals the names=mcore view
  of the same directory, tensor for tensor, for every family it has a
  bridge for (Llama with llama3 rope scaling, Qwen2, Qwen3, Mistral,
  Qwen3-MoE, DeepSeek-V3; 0.6.2 has none for Mixtral or Phi-3);
- transformers 5 (.venv-mcore/transformers-5.24.0 over .venv-mcore's
  torch): from_pretrained of the format=hf view of a
  megatron-core MoE checkpoint, per-expert and packed
  (-o hf_experts=packed), gives megatron-core's logits; and a packed HF
  directory (transformers 5's in-memory form) under names=mcore loads in
  megatron-core.

Each skips, saying why, without its venv.  About 4 minutes here.
"""
import subprocess
from pathlib import Path

import pytest

from mcore import REPO, TF5, needs_mcore, needs_tf5, run_py

BRIDGE_PY = REPO / ".venv-bridge" / "bin" / "python"
VENV_PY = REPO / ".venv" / "bin" / "python"
MAKER = REPO / "scripts" / "make_hf_family.py"
FAMILY_CHECK = REPO / "tests" / "mount" / "family_check.py"
HERE = Path(__file__).resolve().parent

needs_bridge = pytest.mark.skipif(
    not BRIDGE_PY.exists(),
    reason=".venv-bridge missing: scripts/setup makes it when a Python 3.12 is here")


def run(py, *args):
    r = subprocess.run([str(py), *map(str, args)], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:]
    return r.stdout


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """make_hf_family.py's tiny models, made once: FAMILY -> directory."""
    root = tmp_path_factory.mktemp("families")
    made = {}

    def get(family, packed=False):
        key = (family, packed)
        if key not in made:
            out = root / (family + ("_packed" if packed else ""))
            run_py(MAKER, family, out, *(["--experts", "packed"] if packed else []))
            made[key] = out
        return made[key]
    return get


@needs_mcore
@needs_bridge
@pytest.mark.parametrize("family", ["llama3", "qwen2", "qwen3", "mistral",
                                    "qwen3_moe", "deepseek_v3"])
def test_megatron_bridge_equals_view(hf_dirs, mount, tmp_path, family):
    src = hf_dirs(family)
    npz = tmp_path / "bridge.npz"
    run(BRIDGE_PY, HERE / "bridge_oracle.py", "convert", src, npz,
        "--keys", "sharded")
    m = mount(src, ["names=mcore", "format=zarr", "tp=1"])
    assert "ok" in run(VENV_PY, HERE / "bridge_compare.py", m.mnt, npz)


@needs_mcore
@needs_tf5
def test_transformers5_loads_hf_view(mount, tmp_path_factory):
    """megatron-core saves Mixtral at tp=2, ep=2; transformers 5 loads the
    hf view in both expert forms, logits equal to megatron-core's."""
    out = tmp_path_factory.mktemp("tf5") / "mixtral"
    run_py(FAMILY_CHECK, "save", "mixtral", out, "--tp", "2", "--ep", "2",
           "--format", "zarr")
    oracle = Path(str(out) + ".oracle")
    for form in ([], ["hf_experts=packed"]):
        m = mount(out, ["format=hf", *form])
        assert "ok" in run_py(HERE / "tf5_check.py", "hf", m.mnt, oracle,
                              mcore=TF5)
        m.unmount()


@needs_mcore
def test_packed_hf_dir_to_mcore(hf_dirs, mount):
    """transformers 5's packed experts (Qwen3-MoE) under names=mcore at
    ep=2, loaded strictly by megatron-core."""
    src = hf_dirs("qwen3_moe", packed=True)
    m = mount(src, ["names=mcore", "tp=1", "ep=2"])
    out = run_py(FAMILY_CHECK, "mcore", m.mnt, src, Path(str(src) + ".oracle"),
                 1, 2, "torch_dist")
    assert out.rstrip().endswith("ok")
