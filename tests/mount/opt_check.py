"""The torch/transformers side of tests/mount/test_opt.py, run in
.venv-mcore: each command reads a mounted view with the real library and
compares it with the oracle scripts/make_opt_release.py wrote, raising on
the first difference (exit status 1 with the reason).

    opt_check.py safetensors FILE ORACLE    safetensors.safe_open vs full.pt
    opt_check.py hf MNT ORACLE              transformers from_pretrained:
                                            no key warnings, exact logits
    opt_check.py metaseq MNT ORACLE TP      torch.load(weights_only=True)
                                            of every part file
"""
import json
import os
import sys
from pathlib import Path

import torch

from hf_load import from_pretrained_strict  # tests/mount

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"


def oracle(d):
    d = Path(d)
    return (torch.load(d / "full.pt", weights_only=True),
            json.loads((d / "model.json").read_text()))


def same(got, want, what):
    assert got.dtype == want.dtype, (what, got.dtype, want.dtype)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert torch.equal(got, want), what


def check_safetensors(path, odir):
    """The default view: the consolidated weights under metaseq's names,
    the tied output projection (fairscale's shared param) and the
    decoder.version buffer beside them."""
    from safetensors import safe_open
    full, a = oracle(odir)
    want = dict(full)
    if not a["untied"]:
        want["decoder.output_projection.weight"] = \
            full["decoder.embed_tokens.weight"]
    want["decoder.version"] = torch.tensor([3.0]).half()
    with safe_open(path, framework="pt") as f:
        got = {k: f.get_tensor(k) for k in f.keys()}
    assert sorted(got) == sorted(want), (sorted(got), sorted(want))
    for k in want:
        same(got[k], want[k], k)


def hf_names(full, untied):
    """The consolidated metaseq weights as HF's OPT conversion
    (convert_opt_original_pytorch_checkpoint_to_pytorch.py) renames them:
    decoder.version and a tied output projection dropped,
    decoder.layer_norm -> decoder.final_layer_norm, "model." in front, an
    untied output projection as lm_head."""
    sd = {}
    for k, v in full.items():
        if k == "decoder.output_projection.weight":
            sd["lm_head.weight"] = v
            continue
        k = k.replace("decoder.layer_norm.", "decoder.final_layer_norm.")
        sd["model." + k] = v
    return sd


def check_hf(mnt, odir):
    from transformers import OPTConfig, OPTForCausalLM
    full, a = oracle(odir)
    for name in ("vocab.json", "merges.txt"):
        assert (Path(mnt) / name).read_text() == \
            f"{name} of the test tokenizer\n", name
    assert (Path(mnt) / "dict.txt").read_bytes() == \
        (Path(odir) / "dict.txt").read_bytes()
    # every warning transformers logs while loading
    model = from_pretrained_strict(OPTForCausalLM, mnt,
                                   torch_dtype=torch.float32)
    # the oracle: transformers' own OPT built from the hyperparameters
    # the checkpoint was written with, the consolidated weights loaded
    config = OPTConfig(
        vocab_size=a["vocab"], hidden_size=a["hidden"],
        num_hidden_layers=a["layers"], ffn_dim=a["ffn"],
        num_attention_heads=a["heads"],
        max_position_embeddings=a["positions"],
        do_layer_norm_before=not a["post_norm"],
        word_embed_proj_dim=a["hidden"], activation_function="relu",
        tie_word_embeddings=not a["untied"], dropout=0.0,
        attention_dropout=0.0, pad_token_id=1, bos_token_id=2,
        eos_token_id=2)
    ref = OPTForCausalLM(config).to(torch.float32)
    missing, unexpected = ref.load_state_dict(
        {k: v.float() for k, v in hf_names(full, a["untied"]).items()},
        strict=False)
    assert not unexpected, unexpected
    assert set(missing) <= {"lm_head.weight"}, missing
    ref.tie_weights()
    model.eval()
    ref.eval()
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(3, a["vocab"], (2, a["positions"] - 1), generator=g)
    with torch.no_grad():
        got = model(input_ids=ids).logits
        want = ref(input_ids=ids).logits
    assert got.shape == want.shape, (got.shape, want.shape)
    assert torch.equal(got, want), (got - want).abs().max()
    cfg = json.loads((Path(mnt) / "config.json").read_text())
    assert cfg["torch_dtype"] == "float16", cfg


def part_of(name, t, m, M):
    """Part m of M of a consolidated weight by metaseq's megatron rules
    (the inverse of stitch_fsdp_ckpt.py's reshard_megatron_parts)."""
    if any(k in name for k in ("k_proj", "v_proj", "q_proj", "fc1",
                               "embed_tokens", "output_projection")):
        return t.chunk(M, 0)[m]
    if ("out_proj" in name or "fc2" in name) and name.endswith("weight"):
        return t.chunk(M, 1)[m]
    return t


def expected_part(full, a, m, M):
    """Part m as metaseq holds it: qkv fused as [k_m; v_m; q_m] (unless
    the model keeps them apart), no tied output projection (fairscale
    shares it; metaseq rebuilds it), decoder.version."""
    out = {}
    for k, v in full.items():
        out[k] = part_of(k, v, m, M)
    if not a["separate_qkv"]:
        for i in range(a["layers"]):
            p = f"decoder.layers.{i}.self_attn."
            for s in ("weight", "bias"):
                out[p + f"qkv_proj.{s}"] = torch.cat(
                    [out.pop(p + f"{x}_proj.{s}") for x in "kvq"], 0)
    out["decoder.version"] = torch.tensor([3.0]).half()
    return out


def check_metaseq(mnt, odir, tp):
    full, a = oracle(odir)
    tp = int(tp)
    names = (["restored.pt"] if tp == 1 else
             [f"reshard-model_part-{m}.pt" for m in range(tp)])
    assert sorted(n for n in os.listdir(mnt) if n.endswith(".pt")) == \
        sorted(names), os.listdir(mnt)
    for m, name in enumerate(names):
        sd = torch.load(Path(mnt) / name, weights_only=True)
        assert sorted(sd) == ["cfg", "model"], sorted(sd)
        assert sd["cfg"]["model"]["model_parallel_size"] == tp, sd["cfg"]
        assert sd["cfg"]["common"]["model_parallel_size"] == tp, sd["cfg"]
        assert sd["cfg"]["model"]["decoder_layers"] == a["layers"]
        want = expected_part(full, a, m, tp)
        # the stored parts, unflattened by fairscale: the same bytes
        released = Path(odir) / f"part{m}.pt"
        if tp == a["parts"]:
            want = torch.load(released, weights_only=True)
        got = sd["model"]
        # in metaseq's module order where the oracle has it (the
        # released parts); the key set otherwise
        if tp == a["parts"]:
            assert list(got) == list(want), (list(got), list(want))
        assert sorted(got) == sorted(want), (sorted(got), sorted(want))
        for k in want:
            same(got[k], want[k], f"{name}: {k}")


def main(cmd, *args):
    {"safetensors": check_safetensors, "hf": check_hf,
     "metaseq": check_metaseq}[cmd](*args)
    print("ok")


if __name__ == "__main__":
    main(*sys.argv[1:])
