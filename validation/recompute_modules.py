#!/usr/bin/env python3
"""Measures one layer's saved bytes under Megatron-LM's recompute_modules, each module checkpointed with
torch.utils.checkpoint (reference_trainer.RECOMPUTE_MODULES), and compares them with memcalc's
--recompute selective --recompute-modules prediction (--platform cpu).

torch.utils.checkpoint keeps a module's inputs and lets its output live on in whatever saves it;
Megatron-LM's output-discarding checkpoint (layernorm, moe_act) frees that output once its consumer has
run and recomputes it in backward. memcalc predicts Megatron-LM's, so those rows differ by the outputs
(`discarded` below, exact bytes), and by the reference trainer's documented platform effects
(`platform`: torch 1.13's RMSNorm keeps x^2; GPT-2's MLP module holds its residual dropout).

    /usr/bin/python3 validation/recompute_modules.py --memcalc build/memcalc --out validation/results/cpu-recompute-modules.json
"""
import argparse
import json
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_trainer as rt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

# (model file, torch modes' selective flag, the modules, memcalc's --recompute-modules)
CASES = [
    ("models/llama-tiny.json", False, {"mlp"}, "mlp"),
    ("models/llama-tiny.json", True, {"mlp"}, "core_attn,mlp"),
    ("models/llama-tiny.json", False, {"layernorm"}, "layernorm"),
    ("models/gpt2-tiny.json", False, {"layernorm", "mlp"}, "layernorm,mlp"),
    ("models/mixtral-tiny.json", False, {"moe"}, "moe"),
    ("models/mixtral-tiny.json", True, {"moe_act"}, "core_attn,moe_act"),
    ("models/deepseek-v3-tiny.json", False, {"mla_up_proj"}, "mla_up_proj"),
    ("models/deepseek-v3-tiny.json", True, {"mla_up_proj"}, "core_attn,mla_up_proj"),
    ("models/deepseek-v2-lite-tiny.json", True, {"mla_up_proj"}, "core_attn,mla_up_proj"),
]


def discarded(spec, modules, s, b, selective=False):
    """Bytes Megatron-LM's output-discarding checkpoint frees that torch.utils.checkpoint keeps."""
    out = 0
    if "mla_up_proj" in modules:  # q and k at every head, and kv_b_proj's output that v views (bf16, eager)
        qk = spec.qk_nope_head_dim + spec.qk_rope_head_dim
        out += 2 * 2 * s * b * spec.heads * qk
        if b == 1 or selective:  # at b > 1 matmul copies v, and only the core attention's checkpoint keeps the view
            out += 2 * s * b * spec.heads * (spec.qk_nope_head_dim + spec.v_head_dim)
    if "layernorm" in modules:  # each norm's output, which the projections after it saved (bf16)
        out += 2 * 2 * s * b * spec.hidden
    if "moe_act" in modules:  # act(gate) x up, the down projection's input, for every routed slot
        out += 2 * s * b * spec.experts_per_token * spec.ffn
    return out


def platform_effects(spec, modules, s, b):
    """The reference trainer's documented differences (reference_trainer.KNOWN_EFFECTS) that remain."""
    out = 0
    if spec.norm == "rmsnorm" and "layernorm" not in modules:  # torch < 2.2: mean() keeps x^2 in fp32
        out += 4 * s * b * spec.hidden * spec.norms_per_layer
        out += 4 * s * b * (spec.q_lora_rank + spec.kv_lora_rank)  # the latents' norms (latent attention)
    if spec.style == "gpt2" and "mlp" in modules and spec.hidden_dropout:
        # GPT2MLP holds its residual dropout, so the checkpoint drops its noise (bf16 on CPU); Megatron-LM's
        # bias-dropout-add runs outside the MLP, where memcalc keeps it.
        out -= 2 * s * b * spec.hidden
    return out


def predict(memcalc, path, s, b, modules):
    cmd = [memcalc, "--model-file", path, "--seq", str(s), "--micro-batch", str(b), "--recompute", "selective",
           "--recompute-modules", modules, "--activations", "architecture", "--attention", "eager",
           "--platform", "cpu", "--format", "json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise SystemExit(f"memcalc failed: {' '.join(cmd)}: {p.stderr.strip()}")
    return int(json.loads(p.stdout)["activations"]["kept_layer_bytes"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--memcalc", required=True)
    ap.add_argument("--out", help="write the runs as JSON")
    ap.add_argument("--seq", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--micro-batch", type=int, nargs="+", default=[1, 2])
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    runs, failed = [], 0
    print(f"{'model':<14} {'modules':<18} {'s':>3} {'b':>2} {'measured':>9} {'memcalc':>9} {'discarded':>9} {'platform':>8}  verdict")
    for rel, selective, modules, names in CASES:
        path = os.path.join(HERE, rel)
        spec = rt.load_spec(path)
        model = rt.build_model(spec)
        for s in a.seq:
            for b in a.micro_batch:
                rt.RECOMPUTE_MODULES = frozenset(modules)
                try:
                    m = rt.measure(spec, model, s, b, "selective" if selective else "none")
                finally:
                    rt.RECOMPUTE_MODULES = frozenset()
                measured = m.layers[0].kept
                predicted = predict(a.memcalc, path, s, b, names)
                freed = discarded(spec, modules, s, b, selective)
                platform = platform_effects(spec, modules, s, b)
                ok = measured - predicted == freed + platform
                failed += not ok
                print(f"{spec.name:<14} {names:<18} {s:>3} {b:>2} {measured:>9} {predicted:>9} {freed:>9} {platform:>8}  "
                      f"{'ok' if ok else 'MISMATCH'}")
                runs.append({"model": spec.name, "model_file": os.path.relpath(path, os.path.dirname(HERE)),
                             "seq": s, "micro_batch": b, "recompute_modules": names,
                             "measured_layer_bytes": measured, "memcalc_layer_bytes": predicted,
                             "discarded_by_megatron_bytes": freed,
                             "platform_effect_bytes": platform, "agrees": ok})
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"torch": torch.__version__, "device": "cpu",
                       "method": "torch.utils.checkpoint (use_reentrant=True) around each module; saved-tensor "
                                 "hooks count one layer's storages (validation/reference_trainer.py)",
                       "runs": runs}, f, indent=2)
            f.write("\n")
    print(f"{len(runs) - failed}/{len(runs)} agree: measured - memcalc = what Megatron-LM's output-discarding "
          f"checkpoint frees + the documented platform effects")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
