"""The torch/transformers/megatron-core side of tests/mount/test_llama.py,
run in .venv-mcore: each command reads a mounted view with the real
library and compares it with an oracle, raising on the first difference
(exit status 1 with the reason); "ok" on success.

    llama_check.py hf MNT ORACLE
        MNT: a format=hf view of a megatron-core checkpoint; ORACLE: what
        scripts/make_mcore_checkpoint.py --logits-from wrote for its source
        (tokens.npy, logits.npy: megatron-core's own forward, state.npz:
        the source's tensors as megatron-core loads them at tp=1,
        model.json).  config.json must say the source's hyperparameters;
        AutoModelForCausalLM.from_pretrained(MNT) must report no missing,
        unexpected or mismatched keys; its logits must match megatron's
        (cut to the true vocab) within float32 tolerance; and every tensor
        in the view's safetensors files (through the index when sharded)
        must equal exactly what numpy derives from state.npz.

    llama_check.py hf_legacy MNT ORACLE_NPZ
        MNT: a format=hf view of a legacy Megatron-LM per-rank checkpoint
        of the Llama form (scripts/make_legacy_checkpoint.py --llama);
        ORACLE_NPZ: the full tensors it wrote.  from_pretrained must report
        no missing, unexpected or mismatched keys, and every tensor must
        equal what numpy derives from the oracle (query_key_value rows per
        query group [q; k; v], dense_h_to_4h [gate; up], vocab cut).  No
        logits: megatron-core cannot build the legacy model.

    llama_check.py mcore MNT HFDIR ORACLE TP FORMAT [VOCAB_DIVISOR]
        MNT: a names=mcore view of the HF directory HFDIR at tp=TP in
        FORMAT (zarr, torch_dist or megatron); ORACLE: what
        scripts/make_hf_llama.py wrote (transformers' logits).  TP gloo
        ranks each build the GPTModel HFDIR/config.json describes (vocab
        padded Megatron's way for TP, make_vocab_size_divisible_by
        VOCAB_DIVISOR, default 128), load the view - zarr/torch_dist:
        dist_checkpointing.load with StrictHandling.RAISE_ALL, so a missing
        or unexpected key fails; megatron: torch.load of
        mp_rank_0R/model_optim_rng.pt and load_state_dict(strict=True) -
        check every loaded tensor against the HF tensors mapped and split
        with numpy, run the forward, and rank 0 compares the gathered
        logits, cut to the true vocab, with transformers'.
"""
import json
import os
import sys
from pathlib import Path

import numpy as np

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

from hf_load import from_pretrained_strict  # noqa: E402  (tests/mount)

RTOL = 1e-4   # logits: max |diff| <= RTOL * max(1, max |want|)


def close(got, want, what):
    assert got.shape == want.shape, (what, got.shape, want.shape)
    err = float(np.abs(got.astype(np.float64) - want).max())
    tol = RTOL * max(1.0, float(np.abs(want).max()))
    assert err <= tol, f"{what}: logits differ by {err} (tolerance {tol})"
    return err


def same(got, want, what):
    assert got.dtype == want.dtype, (what, got.dtype, want.dtype)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert np.array_equal(got, want), \
        f"{what}: {int((got != want).sum())} elements differ"


# ------------------------------------------------------------ hf direction

def hf_from_mcore(state, size, tied):
    """HF Llama tensors from megatron-core's local-spec state_dict (tp=1)
    in numpy: linear_qkv rows per query group g are [q of the group's
    heads/groups query heads; k; v], linear_fc1 is [gate; up], the
    vocabulary padding rows are cut."""
    H, nh, ng, V = size["hidden"], size["heads"], size["groups"], size["vocab"]
    d, per = H // nh, nh // ng
    out = {"model.embed_tokens.weight": state["embedding.word_embeddings.weight"][:V],
           "model.norm.weight": state["decoder.final_layernorm.weight"]}
    if not tied:
        out["lm_head.weight"] = state["output_layer.weight"][:V]
    for i in range(size["layers"]):
        m, h = f"decoder.layers.{i}.", f"model.layers.{i}."
        qkv = state[m + "self_attention.linear_qkv.weight"]
        assert qkv.shape == ((nh + 2 * ng) * d, H), qkv.shape
        g = qkv.reshape(ng, per + 2, d, H)
        out[h + "self_attn.q_proj.weight"] = g[:, :per].reshape(nh * d, H)
        out[h + "self_attn.k_proj.weight"] = g[:, per].reshape(ng * d, H)
        out[h + "self_attn.v_proj.weight"] = g[:, per + 1].reshape(ng * d, H)
        out[h + "self_attn.o_proj.weight"] = state[m + "self_attention.linear_proj.weight"]
        fc1 = state[m + "mlp.linear_fc1.weight"]
        F = fc1.shape[0] // 2
        out[h + "mlp.gate_proj.weight"] = fc1[:F]
        out[h + "mlp.up_proj.weight"] = fc1[F:]
        out[h + "mlp.down_proj.weight"] = state[m + "mlp.linear_fc2.weight"]
        out[h + "input_layernorm.weight"] = state[m + "input_layernorm.weight"]
        out[h + "post_attention_layernorm.weight"] = state[m + "pre_mlp_layernorm.weight"]
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def view_tensors(mnt):
    """Every tensor of the view's safetensors files, as numpy (float32
    stays float32; bf16 goes through torch), and the file of each."""
    import torch
    from safetensors import safe_open
    mnt = Path(mnt)
    index = mnt / "model.safetensors.index.json"
    files = sorted(p.name for p in mnt.glob("*.safetensors"))
    where = {}
    if index.exists():
        assert "model.safetensors" not in files, files
        weight_map = json.loads(index.read_text())["weight_map"]
        assert sorted(set(weight_map.values())) == files, \
            (sorted(set(weight_map.values())), files)
        n = len(files)
        assert files == [f"model-{i:05d}-of-{n:05d}.safetensors"
                         for i in range(1, n + 1)], files
    else:
        assert files == ["model.safetensors"], files
        weight_map = None
    for name in files:
        with safe_open(mnt / name, framework="pt") as f:
            for k in f.keys():
                assert k not in where, f"{k} in {where[k]} and {name}"
                t = f.get_tensor(k)
                where[k] = (name, t.float().numpy() if t.dtype == torch.bfloat16
                            else t.numpy(), str(t.dtype))
    if weight_map is not None:
        assert sorted(weight_map) == sorted(where), \
            (sorted(set(weight_map) ^ set(where)))
        for k, (name, _, _) in where.items():
            assert weight_map[k] == name, (k, weight_map[k], name)
    return where


def check_hf(mnt, odir):
    import torch
    from transformers import AutoModelForCausalLM
    mnt, odir = Path(mnt), Path(odir)
    meta = json.loads((odir / "model.json").read_text())
    size, arch = meta["size"], meta["arch"]
    size["ffn"] = size["ffn"] or 2 * size["hidden"]
    V = size["vocab"]
    cfg = json.loads((mnt / "config.json").read_text())
    want_cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                "vocab_size": V, "hidden_size": size["hidden"],
                "intermediate_size": size["ffn"],
                "num_hidden_layers": size["layers"],
                "num_attention_heads": size["heads"],
                "num_key_value_heads": size["groups"],
                "rms_norm_eps": arch["norm_eps"],
                "rope_theta": arch["rope_base"],
                "tie_word_embeddings": arch["tied"]}
    for k, v in want_cfg.items():
        assert k in cfg, f"config.json lacks {k}: {cfg}"
        if isinstance(v, float):
            assert abs(cfg[k] - v) <= 1e-12 * abs(v), (k, cfg[k], v)
        else:
            assert cfg[k] == v, (k, cfg[k], v)

    # every tensor, exactly
    want = hf_from_mcore(dict(np.load(odir / "state.npz")), size, arch["tied"])
    got = view_tensors(mnt)
    assert sorted(got) == sorted(want), sorted(set(got) ^ set(want))
    for k in want:
        same(got[k][1], want[k], k)

    model = from_pretrained_strict(AutoModelForCausalLM, mnt,
                                   dtype=torch.float32)
    assert type(model).__name__ == "LlamaForCausalLM", type(model)
    sd = model.state_dict()
    for k in want:
        same(sd[k].numpy(), want[k], f"loaded {k}")
    if arch["tied"]:
        assert model.lm_head.weight.data_ptr() == \
            model.model.embed_tokens.weight.data_ptr(), "lm_head not tied"
    model.eval()
    tokens = torch.from_numpy(np.load(odir / "tokens.npy"))
    with torch.no_grad():
        logits = model(input_ids=tokens).logits.float().numpy()
    err = close(logits, np.load(odir / "logits.npy")[..., :V], "hf vs mcore")
    print(f"hf: {len(want)} tensors exact, logits within {err:.2e}")


def check_hf_legacy(mnt, npz):
    from transformers import AutoModelForCausalLM
    o = dict(np.load(npz))
    meta = json.loads(str(o.pop("__config__")))
    cfg = json.loads((Path(mnt) / "config.json").read_text())
    H, nh, ng = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d, per, V = H // nh, nh // ng, meta["vocab"]
    p = "language_model.encoder."
    want = {"model.embed_tokens.weight":
            o["language_model.embedding.word_embeddings.weight"][:V],
            "model.norm.weight": o[p + "final_norm.weight"]}
    if meta["untied"]:
        want["lm_head.weight"] = o["language_model.output_layer.weight"][:V]
    for i in range(meta["num_layers"]):
        m, h = f"{p}layers.{i}.", f"model.layers.{i}."
        g = o[m + "self_attention.query_key_value.weight"].reshape(ng, per + 2, d, H)
        want[h + "self_attn.q_proj.weight"] = g[:, :per].reshape(nh * d, H)
        want[h + "self_attn.k_proj.weight"] = g[:, per].reshape(ng * d, H)
        want[h + "self_attn.v_proj.weight"] = g[:, per + 1].reshape(ng * d, H)
        want[h + "self_attn.o_proj.weight"] = o[m + "self_attention.dense.weight"]
        fc1 = o[m + "mlp.dense_h_to_4h.weight"]
        want[h + "mlp.gate_proj.weight"], want[h + "mlp.up_proj.weight"] = \
            np.split(fc1, 2, axis=0)
        want[h + "mlp.down_proj.weight"] = o[m + "mlp.dense_4h_to_h.weight"]
        want[h + "input_layernorm.weight"] = o[m + "input_norm.weight"]
        want[h + "post_attention_layernorm.weight"] = o[m + "post_attention_norm.weight"]
    got = view_tensors(mnt)
    assert sorted(got) == sorted(want), sorted(set(got) ^ set(want))
    for k, w in want.items():
        same(got[k][1], np.ascontiguousarray(w), k)
    from_pretrained_strict(AutoModelForCausalLM, mnt)
    print(f"hf_legacy: {len(want)} tensors exact, loaded")


# --------------------------------------------------------- mcore direction

def mcore_from_hf(hf, cfg, padded):
    """Full (unsplit) megatron-core local-spec state_dict tensors from the
    HF Llama tensors, in numpy: q/k/v interleaved per query group, [gate;
    up], the vocabulary padded with zero rows."""
    H, nh, ng = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or H // nh
    per = nh // ng

    def pad(w):
        out = np.zeros((padded, w.shape[1]), w.dtype)
        out[:w.shape[0]] = w
        return out
    out = {"embedding.word_embeddings.weight": pad(hf["model.embed_tokens.weight"]),
           "decoder.final_layernorm.weight": hf["model.norm.weight"]}
    if not cfg.get("tie_word_embeddings", True):
        out["output_layer.weight"] = pad(hf["lm_head.weight"])
    for i in range(cfg["num_hidden_layers"]):
        m, h = f"decoder.layers.{i}.", f"model.layers.{i}."
        q = hf[h + "self_attn.q_proj.weight"].reshape(ng, per, d, H)
        k = hf[h + "self_attn.k_proj.weight"].reshape(ng, 1, d, H)
        v = hf[h + "self_attn.v_proj.weight"].reshape(ng, 1, d, H)
        out[m + "self_attention.linear_qkv.weight"] = \
            np.concatenate([q, k, v], axis=1).reshape(-1, H)
        out[m + "self_attention.linear_proj.weight"] = hf[h + "self_attn.o_proj.weight"]
        out[m + "mlp.linear_fc1.weight"] = np.concatenate(
            [hf[h + "mlp.gate_proj.weight"], hf[h + "mlp.up_proj.weight"]], axis=0)
        out[m + "mlp.linear_fc2.weight"] = hf[h + "mlp.down_proj.weight"]
        out[m + "input_layernorm.weight"] = hf[h + "input_layernorm.weight"]
        out[m + "pre_mlp_layernorm.weight"] = hf[h + "post_attention_layernorm.weight"]
    return out


def rank_part(name, full, rank, tp):
    """TP rank `rank`'s part of a full megatron-core tensor."""
    if name.endswith("linear_fc1.weight"):
        gate, up = np.split(full, 2, axis=0)
        return np.concatenate([np.split(gate, tp, 0)[rank],
                               np.split(up, tp, 0)[rank]], 0)
    if name.endswith(("linear_qkv.weight", "word_embeddings.weight",
                      "output_layer.weight")):
        return np.split(full, tp, axis=0)[rank]
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return np.split(full, tp, axis=1)[rank]
    return full


def read_hf(hfdir):
    import torch
    from safetensors import safe_open
    out = {}
    for p in sorted(Path(hfdir).glob("*.safetensors")):
        with safe_open(p, framework="pt") as f:
            for k in f.keys():
                out[k] = f.get_tensor(k).to(torch.float32).numpy()
    return out


def _mcore_rank(rank, tp, port, mnt, hfdir, odir, fmt, divisor, result):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    import make_mcore_checkpoint as mm
    mm._cpu_workarounds()
    import contextlib

    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=tp)
    from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
    from megatron.core.dist_checkpointing.strategies.zarr import (
        ZarrLoadShardedStrategy,
    )
    from megatron.core.dist_checkpointing.validation import StrictHandling
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    tensor_parallel.get_cuda_rng_tracker().fork = \
        lambda *a, **k: contextlib.nullcontext()

    cfg = json.loads((Path(hfdir) / "config.json").read_text())
    V = cfg["vocab_size"]
    size = dict(layers=cfg["num_hidden_layers"], hidden=cfg["hidden_size"],
                ffn=cfg["intermediate_size"], heads=cfg["num_attention_heads"],
                groups=cfg["num_key_value_heads"], vocab=V)
    tied = cfg.get("tie_word_embeddings", True)
    arch = dict(tied=tied, rope_base=cfg["rope_theta"], norm_eps=cfg["rms_norm_eps"])
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[
        cfg.get("dtype") or cfg.get("torch_dtype")]
    model = mm.build_model(tp, 99, size, arch=arch, vocab_divisor=divisor).to(dtype)
    if fmt == "megatron":
        sd = torch.load(Path(mnt) / f"mp_rank_{rank:02d}" / "model_optim_rng.pt",
                        map_location="cpu", weights_only=False)
        model.load_state_dict(sd["model"], strict=True)
    else:
        with open(Path(mnt) / "metadata.json") as f:
            backend = json.load(f)["sharded_backend"]
        assert backend == fmt, (backend, fmt)
        strategy = ZarrLoadShardedStrategy() if backend == "zarr" else None
        loaded = dist_checkpointing.load(
            model.sharded_state_dict(prefix=""), Path(mnt),
            sharded_strategy=strategy, strict=StrictHandling.RAISE_ALL)
        missing, unexpected = model.load_state_dict(loaded, strict=False)
        bad = [k for k in missing if not k.endswith("_extra_state")]
        assert not bad and not unexpected, (bad, unexpected)
    model = model.float()

    # every tensor exactly, against the HF tensors mapped with numpy
    padded = mm.pad_vocab(V, tp, divisor)
    full = mcore_from_hf(read_hf(hfdir), cfg, padded)
    state = {k: v for k, v in model.state_dict().items()
             if isinstance(v, torch.Tensor) and not k.endswith("_extra_state")}
    assert sorted(state) == sorted(full), sorted(set(state) ^ set(full))
    for k, v in full.items():
        same(state[k].numpy(), rank_part(k, v, rank, tp), f"rank {rank}: {k}")

    model.eval()
    tokens = torch.from_numpy(np.load(Path(odir) / "tokens.npy"))
    b, s = tokens.shape
    pos = torch.arange(s).unsqueeze(0).expand(b, -1)
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)[None, None]
    with torch.no_grad():
        logits = model(tokens, pos, attention_mask=mask).float().contiguous()
    parts = [torch.empty_like(logits) for _ in range(tp)]
    dist.all_gather(parts, logits)
    if rank == 0:
        got = torch.cat(parts, dim=-1).numpy()
        assert got.shape[-1] == padded, (got.shape, padded)
        err = close(got[..., :V], np.load(Path(odir) / "logits.npy"),
                    "mcore vs transformers")
        result.put(f"mcore tp={tp} {fmt}: {len(full)} tensors exact on each "
                   f"rank, logits within {err:.2e}")
    dist.barrier()
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


def check_mcore(mnt, hfdir, odir, tp, fmt, divisor=128):
    import torch.multiprocessing as mp
    import make_mcore_checkpoint as mm
    tp = int(tp)
    result = mp.get_context("fork").SimpleQueue()
    mm.spawn_ranks(_mcore_rank, (tp, mm._free_port(), str(mnt), str(hfdir),
                                 str(odir), fmt, int(divisor), result), tp)
    print(result.get())


def main(cmd, *args):
    {"hf": check_hf, "hf_legacy": check_hf_legacy,
     "mcore": check_mcore}[cmd](*args)
    print("ok")


if __name__ == "__main__":
    main(*sys.argv[1:])
