#!/usr/bin/env python3
"""Checks reshardfs's views of a DeepSpeed ZeRO save against DeepSpeed and
transformers themselves (run in .venv-mcore by tests/mount/test_deepspeed.py).

    ds_check.py weights SAVE VIEW [--dtype bf16]
        every tensor of DeepSpeed's get_fp32_state_dict_from_zero_checkpoint
        (SAVE: the save or tag directory) equals the view's safetensors
        files' (cast to bf16 first with --dtype bf16); the view's other
        tensors are optimizer.state.* or the module's frozen params (stage
        1 saves keep them only there), which equal the module's.
    ds_check.py hf SAVE VIEW [--dtype bf16]
        transformers' from_pretrained(VIEW) reports no missing or unexpected
        key and its logits equal those of the same model loaded with
        DeepSpeed's fp32 state dict.
    ds_check.py universal REF GOT
        two ds_resume.py results (DeepSpeed resumed from its own
        ds_to_universal output, and from the view): every param's fp32,
        exp_avg and exp_avg_sq, the frozen params, the buffers, the steps,
        and the params after one more step are equal.

Prints one line of what it compared; exits 1 with the first difference.
"""
import glob
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import torch  # noqa: E402


def fail(msg):
    print("MISMATCH:", msg)
    sys.exit(1)


def oracle(save):
    """DeepSpeed's fp32 state dict of a save directory, or of a tag
    directory (its parent and tag: DeepSpeed reads only through latest)."""
    from deepspeed.utils.zero_to_fp32 import \
        get_fp32_state_dict_from_zero_checkpoint
    if os.path.exists(os.path.join(save, "latest")):
        sd = get_fp32_state_dict_from_zero_checkpoint(save)
    else:
        sd = get_fp32_state_dict_from_zero_checkpoint(
            os.path.dirname(save), tag=os.path.basename(save))
    return {k: v.contiguous() for k, v in sd.items()}


def module_states(save):
    """The model-states file's module dict (rank 0's)."""
    tag = save
    if os.path.exists(os.path.join(save, "latest")):
        tag = os.path.join(save, open(os.path.join(save, "latest")).read().strip())
    files = sorted(glob.glob(os.path.join(tag, "*model_states.pt")))
    return torch.load(files[0], map_location="cpu", weights_only=False)["module"]


def view_tensors(view):
    from safetensors.torch import load_file
    sd = {}
    files = sorted(glob.glob(os.path.join(view, "*.safetensors")))
    if not files:
        fail(f"{view} holds no safetensors file")
    for f in files:
        sd.update(load_file(f))
    return sd


def cast(t, dtype):
    return t.to(torch.bfloat16) if dtype == "bf16" else t


def weights(save, view, dtype):
    ref, got = oracle(save), view_tensors(view)
    module = module_states(save)
    for k, v in ref.items():
        if k not in got:
            fail(f"{k} missing from the view")
        if got[k].dtype != cast(v, dtype).dtype or not torch.equal(got[k], cast(v, dtype)):
            fail(f"{k}: the view's {got[k].dtype} {tuple(got[k].shape)} differs from DeepSpeed's")
    extra = [k for k in got if k not in ref]
    states = [k for k in extra if k.startswith("optimizer.state.")]
    for k in extra:
        if k in states:
            continue
        if k not in module or not torch.equal(got[k], cast(module[k], dtype)):
            fail(f"{k}: in the view, but neither DeepSpeed's nor the module's")
    print(f"weights: {len(ref)} tensors equal DeepSpeed's fp32 state dict, "
          f"{len(extra) - len(states)} frozen from the module, "
          f"{len(states)} optimizer states")


def hf(save, view, dtype):
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM
    transformers.logging.set_verbosity_error()
    model, info = AutoModelForCausalLM.from_pretrained(
        view, output_loading_info=True, torch_dtype=torch.float32)
    bad = {k: v for k, v in info.items() if v and k != "mismatched_keys"}
    if bad or info.get("mismatched_keys"):
        fail(f"from_pretrained({view}): {info}")
    sd = oracle(save)
    for k, v in module_states(save).items():       # stage 1's frozen params
        sd.setdefault(k, v.float())
    ref = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(view),
                                           torch_dtype=torch.float32)
    ref.load_state_dict({k: cast(v, dtype).float() for k, v in sd.items()},
                        strict=False)
    ids = torch.arange(0, 16).reshape(2, 8) % ref.config.vocab_size
    with torch.no_grad():
        a, b = model(ids).logits, ref(ids).logits
    if not torch.equal(a, b):
        fail(f"logits differ by {(a - b).abs().max().item()}")
    print(f"hf: from_pretrained loads every key; logits equal "
          f"({tuple(a.shape)}, max |logit| {a.abs().max().item():.3f})")


def universal(ref_path, got_path):
    ref = torch.load(ref_path, weights_only=False)
    got = torch.load(got_path, weights_only=False)
    n = 0
    for part in ("fp32", "exp_avg", "exp_avg_sq", "frozen", "buffers",
                 "after_step"):
        r, g = ref[part], got[part]
        if set(r) != set(g):
            fail(f"{part}: names differ: {sorted(set(r) ^ set(g))[:5]}")
        for name in r:
            if not torch.equal(r[name], g[name]):
                fail(f"{part} {name} differs (max {(r[name] - g[name]).abs().max().item()})")
            n += 1
    for part in ("step", "global_steps"):
        if ref[part] != got[part]:
            fail(f"{part}: {got[part]}, DeepSpeed's own conversion resumes with {ref[part]}")
    print(f"universal: at world size {got['world_size']}, {n} resumed tensors, "
          f"step {got['step']} and global_steps {got['global_steps']} equal "
          f"those resumed from DeepSpeed's own conversion")


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    dtype = None
    if "--dtype" in args:
        i = args.index("--dtype")
        dtype = args[i + 1]
        del args[i:i + 2]
    if cmd == "weights":
        weights(args[0], args[1], dtype)
    elif cmd == "hf":
        hf(args[0], args[1], dtype)
    elif cmd == "universal":
        universal(args[0], args[1])
    else:
        fail(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
