"""The torch/transformers/megatron-core oracle of the model families
(scripts/make_hf_family.py), run in .venv-mcore: each command raises on
the first difference (exit status 1 with the reason); "ok" on success.

    family_check.py mcore MNT HFDIR ORACLE TP EP FORMAT [VOCAB_DIVISOR]
        MNT: a names=mcore view (zarr or torch_dist) of the HF directory
        HFDIR (per-expert or packed experts) at tp=TP, ep=EP; ORACLE: what
        make_hf_family.py wrote (transformers' logits).  TP*EP gloo ranks
        each build the GPTModel (local spec, CPU) that HFDIR/config.json
        describes (settings() below: HF config -> TransformerConfig), load
        MNT with dist_checkpointing.load(strict=StrictHandling.RAISE_ALL),
        check every tensor against the HF tensors mapped with numpy
        (mcore_from_hf) and split for the rank, run the forward; rank 0
        compares the logits gathered over TP, cut to the true vocab, with
        transformers' within 1e-4 * max(1, max |want|).

    family_check.py save FAMILY OUT --tp T [--ep E] --format zarr|torch_dist
                         [--oracle DIR] [--seed S] [--tied] [--set KEY=VALUE ...]
        A megatron-core checkpoint of FAMILY: the weights of
        make_hf_family's random FAMILY model, mapped to megatron-core
        (mcore_from_hf), loaded into the GPTModel at tp/ep and saved with
        dist_checkpointing as Megatron-LM's training loop does ('model'
        sharded, 'args' (an argparse.Namespace: megatron_lm_args below),
        'checkpoint_version', 'iteration' in common.pt).  --oracle DIR
        (default OUT.oracle): tokens.npy, logits.npy (megatron-core's own
        forward, [2, 24, padded vocab]), hf_state.npz (the HF tensors the
        format=hf view must show, transformers 4.57 names, per expert) and
        model.json (family, layout, the HF config.json the view should
        say).  Also checks megatron-core's logits against transformers' on
        the same weights.  --set: make_hf_family.py's (a bigger model of
        the family, as scripts/bench_hf makes).

    family_check.py hf MNT ORACLE
        MNT: a format=hf view of a checkpoint `save` wrote.  The config's
        family fields must equal the oracle's; from_pretrained strict (no
        missing, unexpected or mismatched keys); every tensor equal to
        hf_state.npz; float32 logits within tolerance of megatron-core's.
        A view with transformers 5's packed experts (which 4.57 cannot
        from_pretrained) is checked unpacked: the model from its
        config.json, load_state_dict(strict=True).

    family_check.py selftest FAMILY [TP EP]
        The harness checked without reshardfs: make_hf_family's FAMILY
        model, mapped by hand (mcore_from_hf) into megatron-core at TP, EP
        (default 1 1): its logits must equal transformers'.  Families
        megatron-core 0.15.3 cannot express (olmoe: q/k norm over all
        heads) fail with the reason.  deepseek_v3 runs MLA on the local
        spec through mla_core_attention() (megatron-core's local
        DotProductAttention does not take MLA's k/v channels).

    family_check.py keys FAMILY [TP EP]
        Prints model.sharded_state_dict()'s keys, global shapes and
        dtypes (rank 0) for the FAMILY model: the names a names=mcore
        view must carry.
"""
import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import llama_check as lc  # noqa: E402  (sets the offline env, scripts/ on sys.path)
from hf_load import from_pretrained_strict  # noqa: E402

import make_hf_family as mhf  # noqa: E402  (scripts/)
import make_mcore_checkpoint as mm  # noqa: E402

MAX_SEQ = 128


class NotExpressible(Exception):
    """The HF model uses something megatron-core 0.15.3 cannot build."""


# --------------------------------------------------------- config mapping

def family_of(cfg):
    mt = cfg["model_type"]
    if mt == "llama":
        rs = cfg.get("rope_scaling") or {}
        return "llama3" if rs.get("rope_type", rs.get("type")) == "llama3" else "llama"
    return mt


MOE_FAMILIES = ("mixtral", "qwen3_moe", "olmoe", "deepseek_v3")
# megatron-core 0.15.3's RotaryEmbedding._apply_scaling hardcodes these
LLAMA3_FIXED = dict(low_freq_factor=1, high_freq_factor=4,
                    original_max_position_embeddings=8192)


def num_experts(cfg):
    return (cfg.get("num_local_experts") or cfg.get("num_experts")
            or cfg.get("n_routed_experts"))


def moe_pattern(cfg):
    """1 per MoE layer, 0 per dense one."""
    fam, L = family_of(cfg), cfg["num_hidden_layers"]
    if fam in ("mixtral", "olmoe"):
        return [1] * L
    if fam == "qwen3_moe":
        only = set(cfg.get("mlp_only_layers") or [])
        step = cfg.get("decoder_sparse_step") or 1
        return [0 if i in only or (i + 1) % step else 1 for i in range(L)]
    if fam == "deepseek_v3":
        k = cfg["first_k_dense_replace"]
        step = cfg.get("moe_layer_freq") or 1
        return [1 if i >= k and i % step == 0 else 0 for i in range(L)]
    return [0] * L


def settings(cfg, strict=True):
    """(TransformerConfig fields, GPTModel fields) for the HF config, or
    NotExpressible with every reason megatron-core 0.15.3 cannot build it
    (strict False: the nearest model, the reasons ignored)."""
    fam = family_of(cfg)
    H, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    ng = cfg.get("num_key_value_heads") or nh
    d = cfg.get("head_dim") or H // nh
    why = []
    if cfg.get("hidden_act", "silu") != "silu":
        why.append(f"hidden_act {cfg['hidden_act']}")
    tc = dict(num_layers=cfg["num_hidden_layers"], hidden_size=H,
              ffn_hidden_size=cfg["intermediate_size"],
              num_attention_heads=nh, num_query_groups=ng, kv_channels=d,
              layernorm_epsilon=cfg["rms_norm_eps"],
              add_qkv_bias=False, qk_layernorm=False)
    gpt = dict(rotary_base=cfg["rope_theta"],
               share_embeddings_and_output_weights=bool(
                   cfg.get("tie_word_embeddings", False)),
               rotary_percent=1.0, rope_scaling=False)
    if fam == "qwen2":
        tc["add_qkv_bias"] = True          # Qwen2Attention: q/k/v bias, o none
    elif cfg.get("attention_bias"):
        why.append("attention_bias (q/k/v and o_proj bias: megatron's "
                   "add_bias_linear would bias the MLP too)")
    if cfg.get("mlp_bias"):
        why.append("mlp_bias")
    if fam in ("qwen3", "qwen3_moe"):
        tc["qk_layernorm"] = True          # RMSNorm over head_dim, per head
    if fam == "olmoe":
        why.append("q_norm/k_norm normalise over all heads (q_norm weight "
                   f"[{nh * d}], k_norm [{ng * d}]); megatron-core's "
                   "qk_layernorm is per head ([head_dim])")
        if cfg.get("clip_qkv") is not None:
            why.append("clip_qkv")
    rs = cfg.get("rope_scaling")
    if rs:
        kind = rs.get("rope_type", rs.get("type"))
        if kind == "llama3":
            bad = {k: rs.get(k) for k, v in LLAMA3_FIXED.items()
                   if float(rs.get(k)) != float(v)}
            if bad:
                why.append(f"llama3 rope_scaling {bad}: megatron-core "
                           f"0.15.3 hardcodes {LLAMA3_FIXED}, only the "
                           "factor is free")
            gpt.update(rope_scaling=True, rope_scaling_factor=float(rs["factor"]))
        else:
            why.append(f"rope_scaling {kind}")
    prf = cfg.get("partial_rotary_factor", 1.0)
    if prf != 1.0:
        gpt["rotary_percent"] = prf        # megatron rotates the first part too
    for k in ("sliding_window",):
        if cfg.get(k) is not None and cfg.get("use_sliding_window", True):
            why.append(f"{k} {cfg[k]} (TransformerConfig.window_size is not "
                       "mapped here: the local spec builds its window mask "
                       "on 'cuda' (transformer/utils.py "
                       "get_sliding_window_causal_mask), so not on the CPU)")
    if fam == "deepseek_v3":
        # multi-latent attention: megatron's MLA always reads the rope part
        # of q and k interleaved (rope_utils: x[0::2], x[1::2]) = HF's
        # rope_interleave True; its q/kv layernorms come with qk_layernorm
        if not cfg.get("rope_interleave", True):
            why.append("rope_interleave False (megatron's MLA de-interleaves "
                       "the rope dims; the rows would need permuting)")
        if not cfg.get("q_lora_rank"):
            why.append("q_lora_rank None (linear_q_proj: not mapped here)")
        tc.update(multi_latent_attention=True, qk_layernorm=True,
                  q_lora_rank=cfg["q_lora_rank"], kv_lora_rank=cfg["kv_lora_rank"],
                  qk_head_dim=cfg["qk_nope_head_dim"],
                  qk_pos_emb_head_dim=cfg["qk_rope_head_dim"],
                  v_head_dim=cfg["v_head_dim"], rope_type="rope",
                  rotary_base=cfg["rope_theta"])
        tc.pop("kv_channels")
    if fam in MOE_FAMILIES:
        E = num_experts(cfg)
        pat = moe_pattern(cfg)
        tc.update(
            num_moe_experts=E, moe_router_topk=cfg["num_experts_per_tok"],
            moe_ffn_hidden_size=cfg.get("moe_intermediate_size") or cfg["intermediate_size"],
            # HF: softmax over all experts, top-k, renormalise when
            # norm_topk_prob (Mixtral always) == megatron's top-k of the
            # logits then softmax; without renormalising == pre-softmax
            moe_router_pre_softmax=not cfg.get("norm_topk_prob", fam == "mixtral"),
            moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0,
            moe_token_dispatcher_type="allgather", moe_grouped_gemm=False,
            moe_layer_freq=1 if all(pat) else pat)
        if fam == "deepseek_v3":
            tc.update(moe_router_score_function="sigmoid",
                      moe_router_enable_expert_bias=True,
                      moe_router_num_groups=cfg["n_group"],
                      moe_router_group_topk=cfg["topk_group"],
                      moe_router_topk_scaling_factor=cfg["routed_scaling_factor"],
                      moe_shared_expert_intermediate_size=(
                          cfg["n_shared_experts"] * cfg["moe_intermediate_size"]))
        if fam == "mixtral" and cfg.get("router_jitter_noise"):
            why.append("router_jitter_noise")
    if why and strict:
        raise NotExpressible(f"{fam}: " + "; ".join(why))
    return tc, gpt


def build(cfg, tp, ep, seed=99, vocab_divisor=128, strict=True):
    """The GPTModel (local spec, float32, CPU) of the HF config at tp/ep."""
    import torch
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.transformer import TransformerConfig

    tc, gpt = settings(cfg, strict)
    torch.manual_seed(seed)
    if tc.get("multi_latent_attention"):
        from megatron.core.transformer.transformer_config import (
            MLATransformerConfig as TransformerConfig)
    config = TransformerConfig(
        **tc, gated_linear_unit=True, activation_func=F.silu,
        normalization="RMSNorm", add_bias_linear=False,
        tensor_model_parallel_size=tp, expert_model_parallel_size=ep,
        pipeline_model_parallel_size=1, use_cpu_initialization=True,
        hidden_dropout=0.0, attention_dropout=0.0,
        params_dtype=torch.float32, bf16=False, fp16=False,
        sequence_parallel=False, gradient_accumulation_fusion=False,
        bias_activation_fusion=False, masked_softmax_fusion=False,
        bias_dropout_fusion=False, apply_rope_fusion=False,
        persist_layer_norm=False)
    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False,
                                      normalization="RMSNorm")
    if tc.get("multi_latent_attention"):
        for ls in spec.layer_specs:
            ls.submodules.self_attention.submodules.core_attention = \
                mla_core_attention()
    return GPTModel(config=config, transformer_layer_spec=spec,
                    vocab_size=mm.pad_vocab(cfg["vocab_size"], tp, vocab_divisor),
                    max_sequence_length=MAX_SEQ, pre_process=True,
                    post_process=True, position_embedding_type="rope", **gpt)


def mla_core_attention():
    """The local spec's DotProductAttention for MLA.  megatron-core 0.15.3
    cannot build MLA on the local spec as it is: MLASelfAttention passes
    k_channels and v_channels (q/k head dim nope+rope != v head dim),
    which only TEDotProductAttention takes.  The local module reshapes q,
    k and v with -1 and only sizes its output by kv_channels, so this
    subclass takes the two and sizes the output by v_channels."""
    from megatron.core.transformer.dot_product_attention import (
        DotProductAttention)

    class MLADotProductAttention(DotProductAttention):
        def __init__(self, *args, k_channels=None, v_channels=None, **kw):
            # (Attention.__init__ builds one without them first; MLA's
            # __init__ then builds the one it keeps)
            super().__init__(*args, **kw)
            if v_channels is not None:
                self.hidden_size_per_partition = \
                    v_channels * self.num_attention_heads_per_partition

    return MLADotProductAttention


def megatron_lm_args(cfg, tp, ep, fmt):
    """The args a Megatron-LM run of this model saves: its arguments.py
    names for the TransformerConfig fields."""
    import torch
    tc, gpt = settings(cfg)
    V = cfg["vocab_size"]
    a = argparse.Namespace(
        num_layers=tc["num_layers"], hidden_size=tc["hidden_size"],
        ffn_hidden_size=tc["ffn_hidden_size"],
        num_attention_heads=tc["num_attention_heads"],
        group_query_attention=tc["num_query_groups"] != tc["num_attention_heads"],
        num_query_groups=tc["num_query_groups"],
        kv_channels=tc.get("kv_channels", tc["hidden_size"] // tc["num_attention_heads"]),
        norm_epsilon=tc["layernorm_epsilon"], rotary_base=gpt["rotary_base"],
        rotary_percent=gpt["rotary_percent"], rotary_interleaved=False,
        use_rope_scaling=gpt["rope_scaling"],
        rope_scaling_factor=gpt.get("rope_scaling_factor", 8.0),
        qk_layernorm=tc["qk_layernorm"], add_qkv_bias=tc["add_qkv_bias"],
        max_position_embeddings=MAX_SEQ, seq_length=MAX_SEQ,
        untie_embeddings_and_output_weights=not gpt["share_embeddings_and_output_weights"],
        swiglu=True, normalization="RMSNorm", position_embedding_type="rope",
        add_bias_linear=False, padded_vocab_size=mm.pad_vocab(V, tp),
        vocab_size=V, make_vocab_size_divisible_by=128,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=1,
        virtual_pipeline_model_parallel_size=None,
        expert_model_parallel_size=ep, expert_tensor_parallel_size=tp,
        num_experts=tc.get("num_moe_experts"),
        params_dtype=torch.float32, bf16=False, fp16=False,
        use_dist_ckpt=True, ckpt_format=fmt, iteration=1)
    for k in ("moe_router_topk", "moe_ffn_hidden_size", "moe_router_pre_softmax",
              "moe_router_load_balancing_type", "moe_aux_loss_coeff",
              "moe_token_dispatcher_type", "moe_grouped_gemm", "moe_layer_freq",
              "moe_router_score_function", "moe_router_enable_expert_bias",
              "moe_router_num_groups", "moe_router_group_topk",
              "moe_router_topk_scaling_factor",
              "moe_shared_expert_intermediate_size", "multi_latent_attention",
              "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
              "v_head_dim", "rope_type"):
        if k in tc:
            setattr(a, k, tc[k])
    return a


COMMON = ("args", "checkpoint_version", "iteration",
          "num_floating_point_operations_so_far", "rng_state",
          "opt_param_scheduler", "content_metadata")


def check_args(args, cfg):
    """A view's args, where it has them, must say what megatron_lm_args
    says for the fields a converter reads (tp/ep and the vocab padding
    may differ: the view's layout is its own)."""
    want = megatron_lm_args(cfg, 1, 1, "torch_dist")
    skip = {"tensor_model_parallel_size", "expert_model_parallel_size",
            "expert_tensor_parallel_size", "padded_vocab_size", "ckpt_format",
            "params_dtype", "bf16", "fp16", "use_dist_ckpt", "iteration",
            "max_position_embeddings", "seq_length",
            "make_vocab_size_divisible_by", "moe_token_dispatcher_type",
            "moe_grouped_gemm", "moe_router_load_balancing_type",
            "moe_aux_loss_coeff", "virtual_pipeline_model_parallel_size",
            "pipeline_model_parallel_size"}
    a = vars(args) if not isinstance(args, dict) else args
    for k, w in vars(want).items():
        if k in skip or k not in a:
            continue
        g = a[k]
        if k == "moe_layer_freq" and isinstance(g, int) and isinstance(w, list):
            g = [1 if i % g == 0 else 0 for i in range(len(w))]
        assert g == w or (isinstance(w, float) and isinstance(g, (int, float))
                          and abs(g - w) <= 1e-12 * max(1.0, abs(w))), \
            f"args.{k} = {g!r}, want {w!r}"


# ------------------------------------------------------------- the tensors

PER_EXPERT_RE = re.compile(r"^(model\.layers\.\d+)\.(mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight$")


def unpack_experts(hf, cfg):
    """HF tensors with transformers 5's packed experts
    (`mlp.experts.gate_up_proj` [E, 2F, H], `mlp.experts.down_proj`
    [E, H, F]) as transformers 4.57's per-expert ones; others as they are."""
    fam = family_of(cfg)
    if fam not in MOE_FAMILIES:
        return hf
    moe, (gate, up, down) = mhf.PER_EXPERT[fam]
    out = {}
    for k, v in hf.items():
        m = re.match(r"^(model\.layers\.\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$", k)
        if not m:
            if fam == "mixtral":
                k = k.replace(".mlp.", f".{moe}.")
            out[k] = v
            continue
        pre = f"{m.group(1)}.{moe}.experts"
        for e in range(v.shape[0]):
            if m.group(2) == "down_proj":
                out[f"{pre}.{e}.{down}.weight"] = v[e]
            else:
                g, u = np.split(v[e], 2, axis=0)
                out[f"{pre}.{e}.{gate}.weight"] = g
                out[f"{pre}.{e}.{up}.weight"] = u
    return out


def mcore_from_hf(hf, cfg, padded):
    """Full (unsplit, all experts) megatron-core local-spec state_dict
    tensors from the HF tensors (4.57 names), in numpy: q/k/v (weights and
    biases) interleaved per query group [the group's q heads; k; v];
    linear_fc1 [gate; up] (Phi-3's gate_up_proj already is); experts as
    mlp.experts.local_experts.<global e>; vocabulary padded with zeros."""
    fam = family_of(cfg)
    H, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    ng = cfg.get("num_key_value_heads") or nh
    d = cfg.get("head_dim") or H // nh
    per = nh // ng
    moe_name, names = mhf.PER_EXPERT.get(fam, ("mlp", None))
    pattern = moe_pattern(cfg)

    def pad(w):
        out = np.zeros((padded,) + w.shape[1:], w.dtype)
        out[:w.shape[0]] = w
        return out

    def interleave(q, k, v):
        tail = q.shape[1:]
        q = q.reshape((ng, per, d) + tail)
        k = k.reshape((ng, 1, d) + tail)
        v = v.reshape((ng, 1, d) + tail)
        return np.concatenate([q, k, v], axis=1).reshape((-1,) + tail)

    out = {"embedding.word_embeddings.weight": pad(hf["model.embed_tokens.weight"]),
           "decoder.final_layernorm.weight": hf["model.norm.weight"]}
    if not cfg.get("tie_word_embeddings", False):
        out["output_layer.weight"] = pad(hf["lm_head.weight"])
    for i in range(cfg["num_hidden_layers"]):
        m, h = f"decoder.layers.{i}.", f"model.layers.{i}."
        a = h + "self_attn."
        if fam == "deepseek_v3":
            # MLA: same row orders (q_b rows per head [nope; rope], kv_a
            # rows [kv_lora; rope], kv_b rows per head [k nope; v])
            sa = m + "self_attention."
            out[sa + "linear_q_down_proj.weight"] = hf[a + "q_a_proj.weight"]
            out[sa + "q_layernorm.weight"] = hf[a + "q_a_layernorm.weight"]
            out[sa + "linear_q_up_proj.weight"] = hf[a + "q_b_proj.weight"]
            out[sa + "linear_kv_down_proj.weight"] = hf[a + "kv_a_proj_with_mqa.weight"]
            out[sa + "kv_layernorm.weight"] = hf[a + "kv_a_layernorm.weight"]
            out[sa + "linear_kv_up_proj.weight"] = hf[a + "kv_b_proj.weight"]
        elif fam == "phi3":
            q, k, v = np.split(hf[a + "qkv_proj.weight"],
                               [nh * d, nh * d + ng * d], axis=0)
        else:
            q, k, v = (hf[a + f"{x}_proj.weight"] for x in "qkv")
        if fam != "deepseek_v3":
            out[m + "self_attention.linear_qkv.weight"] = interleave(q, k, v)
        if a + "q_proj.bias" in hf:
            out[m + "self_attention.linear_qkv.bias"] = interleave(
                *(hf[a + f"{x}_proj.bias"] for x in "qkv"))
        if a + "q_norm.weight" in hf:
            out[m + "self_attention.q_layernorm.weight"] = hf[a + "q_norm.weight"]
            out[m + "self_attention.k_layernorm.weight"] = hf[a + "k_norm.weight"]
        out[m + "self_attention.linear_proj.weight"] = hf[a + "o_proj.weight"]
        out[m + "input_layernorm.weight"] = hf[h + "input_layernorm.weight"]
        out[m + "pre_mlp_layernorm.weight"] = hf[h + "post_attention_layernorm.weight"]
        if not pattern[i]:
            if fam == "phi3":
                out[m + "mlp.linear_fc1.weight"] = hf[h + "mlp.gate_up_proj.weight"]
            else:
                out[m + "mlp.linear_fc1.weight"] = np.concatenate(
                    [hf[h + "mlp.gate_proj.weight"], hf[h + "mlp.up_proj.weight"]], 0)
            out[m + "mlp.linear_fc2.weight"] = hf[h + "mlp.down_proj.weight"]
            continue
        gate, up, down = names
        p = f"{h}{moe_name}."
        out[m + "mlp.router.weight"] = hf[p + "gate.weight"]
        if p + "gate.e_score_correction_bias" in hf:
            out[m + "mlp.router.expert_bias"] = hf[p + "gate.e_score_correction_bias"]
        for e in range(num_experts(cfg)):
            x = f"{p}experts.{e}."
            me = f"{m}mlp.experts.local_experts.{e}."
            out[me + "linear_fc1.weight"] = np.concatenate(
                [hf[x + f"{gate}.weight"], hf[x + f"{up}.weight"]], 0)
            out[me + "linear_fc2.weight"] = hf[x + f"{down}.weight"]
        if p + "shared_experts.gate_proj.weight" in hf:
            s = p + "shared_experts."
            out[m + "mlp.shared_experts.linear_fc1.weight"] = np.concatenate(
                [hf[s + "gate_proj.weight"], hf[s + "up_proj.weight"]], 0)
            out[m + "mlp.shared_experts.linear_fc2.weight"] = hf[s + "down_proj.weight"]
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


LOCAL_EXPERT = re.compile(r"^(.*\.mlp\.experts\.local_experts\.)(\d+)(\..*)$")


def local_state(full, ranks, E):
    """This rank's part of the full tensors, under its local names: TP
    splits (tp), experts ep_rank*L .. +L-1 as local 0..L-1, split for the
    expert tensor-parallel rank (etp)."""
    out = {}
    L = E // ranks["ep"] if E else 0
    for k, v in full.items():
        m = LOCAL_EXPERT.match(k)
        if m:
            g = int(m.group(2))
            if g // L != ranks["ep_rank"]:
                continue
            k = f"{m.group(1)}{g - ranks['ep_rank'] * L}{m.group(3)}"
            out[k] = lc.rank_part(k, v, ranks["etp_rank"], ranks["etp"])
        elif k.endswith(("linear_qkv.bias", "linear_q_down_proj.weight",
                         "linear_q_up_proj.weight", "linear_kv_down_proj.weight",
                         "linear_kv_up_proj.weight")):
            out[k] = np.split(v, ranks["tp"], axis=0)[ranks["tp_rank"]]
        else:
            out[k] = lc.rank_part(k, v, ranks["tp_rank"], ranks["tp"])
    return out


def model_tensors(model):
    import torch
    return {k: v for k, v in model.state_dict().items()
            if isinstance(v, torch.Tensor) and not k.endswith("_extra_state")}


def set_tensors(model, local):
    """Copies `local` into the model; the names must be exactly the
    model's."""
    import torch
    have = model_tensors(model)
    assert sorted(have) == sorted(local), sorted(set(have) ^ set(local))
    with torch.no_grad():
        for k, t in have.items():
            assert tuple(t.shape) == local[k].shape, (k, t.shape, local[k].shape)
            t.copy_(torch.from_numpy(local[k]))


def read_hf(hfdir, cfg):
    return unpack_experts(lc.read_hf(hfdir), cfg)


# ---------------------------------------------------------- the processes

def _init(rank, world, port, tp, ep):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    import make_moe_checkpoint as mmoe
    mm._cpu_workarounds()
    mmoe._moe_workarounds()
    import contextlib

    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel
    ps.initialize_model_parallel(tensor_model_parallel_size=tp,
                                 expert_model_parallel_size=ep)
    tensor_parallel.get_cuda_rng_tracker().fork = \
        lambda *a, **k: contextlib.nullcontext()
    return dict(tp=tp, ep=ep, tp_rank=ps.get_tensor_model_parallel_rank(),
                ep_rank=ps.get_expert_model_parallel_rank(),
                etp=ps.get_expert_tensor_parallel_world_size(),
                etp_rank=ps.get_expert_tensor_parallel_rank())


def _done():
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    dist.barrier()
    ps.destroy_model_parallel()
    dist.destroy_process_group()


def forward(model, tokens):
    """Logits [b, s, padded vocab] gathered over the TP group."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    model.eval()
    tokens = torch.from_numpy(tokens)
    b, s = tokens.shape
    pos = torch.arange(s).unsqueeze(0).expand(b, -1)
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)[None, None]
    with torch.no_grad():
        logits = model(tokens, pos, attention_mask=mask).float().contiguous()
    tp = ps.get_tensor_model_parallel_world_size()
    parts = [torch.empty_like(logits) for _ in range(tp)]
    dist.all_gather(parts, logits, group=ps.get_tensor_model_parallel_group())
    return torch.cat(parts, dim=-1).numpy()


def _worker(rank, world, port, job, result):
    """job: dict(mode=mcore|selftest|save|keys, cfg, tp, ep, hfdir, ...)."""
    ranks = _init(rank, world, port, job["tp"], job["ep"])
    import torch
    from megatron.core import dist_checkpointing
    cfg, tp, ep = job["cfg"], job["tp"], job["ep"]
    V = cfg["vocab_size"]
    divisor = job.get("divisor", 128)
    padded = mm.pad_vocab(V, tp, divisor)
    model = build(cfg, tp, ep, seed=99 + rank, vocab_divisor=divisor,
                  strict=job["mode"] != "keys")
    msg = None
    if job["mode"] == "keys":
        if rank == 0:
            msg = sharded_keys(model)
    else:
        full = mcore_from_hf(read_hf(job["hfdir"], cfg), cfg, padded)
        want = local_state(full, ranks, num_experts(cfg))
        if job["mode"] == "mcore":
            from megatron.core.dist_checkpointing.strategies.zarr import (
                ZarrLoadShardedStrategy)
            from megatron.core.dist_checkpointing.validation import StrictHandling
            mnt = Path(job["mnt"])
            backend = json.loads((mnt / "metadata.json").read_text())["sharded_backend"]
            assert backend == job["format"], (backend, job["format"])
            strategy = ZarrLoadShardedStrategy() if backend == "zarr" else None
            loaded = dist_checkpointing.load(
                model.sharded_state_dict(prefix=""), mnt,
                sharded_strategy=strategy, strict=StrictHandling.RAISE_ALL)
            # the common state Megatron-LM saves beside the model
            common = {k: loaded.pop(k) for k in COMMON if k in loaded}
            if "args" in common:
                check_args(common["args"], cfg)
            missing, unexpected = model.load_state_dict(loaded, strict=False)
            bad = [k for k in missing if not k.endswith("_extra_state")]
            assert not bad and not unexpected, (bad, unexpected)
            have = {k: v.numpy() for k, v in model_tensors(model).items()}
            assert sorted(have) == sorted(want), sorted(set(have) ^ set(want))
            for k, v in want.items():
                lc.same(have[k], v, f"rank {rank}: {k}")
        else:
            set_tensors(model, want)
        if job["mode"] == "save":
            from megatron.core import parallel_state as ps  # noqa: F401
            import torch.distributed as dist
            out = job["out"]
            if rank == 0:
                os.makedirs(out, exist_ok=True)
            dist.barrier()
            sd = {"model": model.sharded_state_dict(prefix=""),
                  "args": megatron_lm_args(cfg, tp, ep, job["format"]),
                  "checkpoint_version": 3.0, "iteration": 1}
            strategy = ("zarr", 1) if job["format"] == "zarr" else None
            dist_checkpointing.save(sd, out, sharded_strategy=strategy)
        tokens = np.load(Path(job["oracle_in"]) / "tokens.npy")
        got = forward(model, tokens)
        if rank == 0:
            assert got.shape[-1] == padded, (got.shape, padded)
            want_logits = np.load(Path(job["oracle_in"]) / "logits.npy")
            err = lc.close(got[..., :V], want_logits,
                           "megatron-core vs transformers")
            msg = (f"{job['mode']} {family_of(cfg)} tp={tp} ep={ep}: "
                   f"{len(full)} tensors, logits within {err:.2e} of "
                   "transformers'")
            if job["mode"] == "mcore":
                msg += f" ({job['format']}, every tensor exact on each rank)"
            if job["mode"] == "save":
                np.save(Path(job["oracle"]) / "logits.npy", got)
    if rank == 0:
        result.put(msg)
    _done()


def sharded_keys(model):
    """One line per key of model.sharded_state_dict() (factories
    applied): the key, its global shape and dtype (ShardedObject: its
    shape of objects), and the first state_dict name saved under it."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import apply_factories
    sd = model.sharded_state_dict(prefix="")
    names = {}
    for k, v in sd.items():
        names.setdefault(id(v), k)
    apply_factories(sd)
    seen = {}
    for v in nested_values(sd):
        if not hasattr(v, "key") or v.key in seen:
            continue
        if hasattr(v, "dtype"):
            seen[v.key] = (f"{v.key} {list(v.global_shape)} "
                           f"{str(v.dtype).replace('torch.', '')}"
                           + (f" (local {list(v.local_shape)})"
                              if list(v.local_shape) != list(v.global_shape) else ""))
        else:
            seen[v.key] = f"{v.key} ShardedObject {list(v.global_shape)}"
    return "\n".join(seen[k] for k in sorted(seen))


def spawn(job):
    import torch.multiprocessing as mp
    world = job["tp"] * job["ep"]
    assert world <= 8, world
    result = mp.get_context("fork").SimpleQueue()
    mm.spawn_ranks(_worker, (world, mm._free_port(), job, result), world)
    return result.get()


def hf_model(family, outdir, seed=4321, tied=False, sets=()):
    """make_hf_family's FAMILY model in outdir (its oracle outdir.oracle);
    sets: its --set KEY=VALUE arguments."""
    if not (Path(outdir) / "config.json").exists():
        # in a child: this process forks the ranks later (spawn), so it
        # runs no torch computation itself
        import multiprocessing
        p = multiprocessing.get_context("fork").Process(
            target=lambda: sys.exit(mhf.main(
                [family, str(outdir), "--seed", str(seed)]
                + (["--tied"] if tied else [])
                + [x for s in sets for x in ("--set", s)])))
        p.start()
        p.join()
        assert p.exitcode == 0, p.exitcode
    return json.loads((Path(outdir) / "config.json").read_text())


# ---------------------------------------------------------------- commands

def check_mcore(mnt, hfdir, odir, tp, ep, fmt, divisor=128):
    cfg = json.loads((Path(hfdir) / "config.json").read_text())
    print(spawn(dict(mode="mcore", cfg=cfg, tp=int(tp), ep=int(ep),
                     hfdir=str(hfdir), oracle_in=str(odir), mnt=str(mnt),
                     format=fmt, divisor=int(divisor))))


def selftest(family, tp=1, ep=1):
    with tempfile.TemporaryDirectory() as tmp:
        hfdir = Path(tmp) / family
        cfg = hf_model(family, hfdir)
        try:
            settings(cfg)
        except NotExpressible as e:
            raise SystemExit(f"selftest {family}: megatron-core 0.15.3 cannot "
                             f"express it: {e}")
        print(spawn(dict(mode="selftest", cfg=cfg, tp=int(tp), ep=int(ep),
                         hfdir=str(hfdir), oracle_in=str(hfdir) + ".oracle")))


def keys(family, tp=1, ep=1):
    cfg = json.loads(mhf.family_config(family).to_json_string())
    print(spawn(dict(mode="keys", cfg=cfg, tp=int(tp), ep=int(ep))))


def save(argv):
    ap = argparse.ArgumentParser(prog="family_check.py save")
    ap.add_argument("family", choices=mhf.FAMILIES)
    ap.add_argument("out")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--ep", type=int, default=1)
    ap.add_argument("--format", required=True, choices=["zarr", "torch_dist"])
    ap.add_argument("--oracle")
    ap.add_argument("--seed", type=int, default=4321)
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="make_hf_family.py's --set: a bigger model")
    a = ap.parse_args(argv)
    out = os.path.abspath(a.out)
    if os.path.exists(out) and os.listdir(out):
        ap.error(f"{out} exists and is not empty")
    oracle = Path(os.path.abspath(a.oracle or out + ".oracle"))
    try:
        settings(json.loads(mhf.family_config(
            a.family, a.tied, mhf.parse_set(a.set)).to_json_string()))
    except NotExpressible as e:
        ap.error(f"megatron-core 0.15.3 cannot express it: {e}")
    with tempfile.TemporaryDirectory() as tmp:
        hfdir = Path(tmp) / a.family
        cfg = hf_model(a.family, hfdir, a.seed, a.tied, a.set)
        oracle.mkdir(parents=True, exist_ok=True)
        print(spawn(dict(mode="save", cfg=cfg, tp=a.tp, ep=a.ep,
                         hfdir=str(hfdir), oracle_in=str(hfdir) + ".oracle",
                         out=out, oracle=str(oracle), format=a.format)))
        hf = lc.read_hf(hfdir)
        np.savez(oracle / "hf_state.npz", **hf)
        np.save(oracle / "tokens.npy", np.load(str(hfdir) + ".oracle/tokens.npy"))
    with open(oracle / "model.json", "w") as f:
        json.dump({"family": a.family, "source": "mcore", "tp": a.tp,
                   "ep": a.ep, "format": a.format, "seed": a.seed,
                   "tied": a.tied, "config": cfg}, f, indent=1)
    print(f"saved {a.format} {a.family} tp={a.tp} ep={a.ep} to {out}, "
          f"oracle {oracle}")


# config.json fields the format=hf view must carry as the source has them
CONFIG_FIELDS = (
    "model_type", "architectures", "vocab_size", "hidden_size",
    "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta",
    "rope_scaling", "tie_word_embeddings", "attention_bias",
    "num_local_experts", "num_experts", "num_experts_per_tok",
    "moe_intermediate_size", "norm_topk_prob", "decoder_sparse_step",
    "mlp_only_layers", "n_routed_experts", "n_shared_experts",
    "first_k_dense_replace", "routed_scaling_factor", "n_group",
    "topk_group", "partial_rotary_factor")


def check_hf(mnt, odir):
    import torch
    from transformers import AutoModelForCausalLM
    mnt, odir = Path(mnt), Path(odir)
    meta = json.loads((odir / "model.json").read_text())
    want_cfg = meta["config"]
    cfg = json.loads((mnt / "config.json").read_text())
    for k in CONFIG_FIELDS:
        if k not in want_cfg or want_cfg[k] is None:
            continue
        assert k in cfg, f"config.json lacks {k}"
        w, g = want_cfg[k], cfg[k]
        if isinstance(w, float):
            assert abs(g - w) <= 1e-12 * abs(w), (k, g, w)
        elif isinstance(w, dict):
            for kk, ww in w.items():
                assert kk in g and (g[kk] == ww or
                                    (isinstance(ww, float) and abs(g[kk] - ww) <= 1e-12 * abs(ww))), (k, g, w)
        else:
            assert g == w, (k, g, w)
    want = dict(np.load(odir / "hf_state.npz"))
    got = {k: v[1] for k, v in lc.view_tensors(mnt).items()}
    packed = any(k.endswith(("experts.gate_up_proj", "experts.down_proj"))
                 for k in got)
    if packed:
        got = unpack_experts(got, cfg)
    assert sorted(got) == sorted(want), sorted(set(got) ^ set(want))
    for k in want:
        lc.same(got[k], want[k], k)
    if packed:
        # transformers 4.57 cannot from_pretrained transformers 5's packed
        # experts: the model from config.json, the tensors unpacked
        from transformers import AutoConfig
        model = AutoModelForCausalLM.from_config(
            AutoConfig.from_pretrained(mnt), dtype=torch.float32)
        sd = {k: torch.from_numpy(v) for k, v in got.items()}
        if "lm_head.weight" not in sd and cfg.get("tie_word_embeddings"):
            sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
        model.load_state_dict(sd, strict=True)
    else:
        model = from_pretrained_strict(AutoModelForCausalLM, mnt,
                                       dtype=torch.float32)
    assert type(model).__name__ == want_cfg["architectures"][0], type(model)
    model.eval()
    tokens = torch.from_numpy(np.load(odir / "tokens.npy"))
    with torch.no_grad():
        logits = model(input_ids=tokens).logits.float().numpy()
    V = want_cfg["vocab_size"]
    err = lc.close(logits, np.load(odir / "logits.npy")[..., :V],
                   "transformers vs megatron-core")
    print(f"hf {meta['family']}: {len(want)} tensors exact"
          f"{' (packed experts, loaded unpacked)' if packed else ''}, "
          f"logits within {err:.2e}")


def main(cmd, *args):
    if cmd == "save":
        save(list(args))
    else:
        {"mcore": check_mcore, "hf": check_hf, "selftest": selftest,
         "keys": keys}[cmd](*args)
    print("ok")


if __name__ == "__main__":
    main(*sys.argv[1:])
