#!/usr/bin/env python3
"""Optimizer state and step temporaries of `--recipe adafactor`, `muon` and `lion`, measured on CPU.

torch 1.13 has neither optimiser, so each is written here in the order of operations of the code
memcalc's row follows, which is what decides the temporaries:
  adafactor: transformers' Adafactor.step (src/transformers/optimization.py) with its defaults
             (beta1=None, relative step, clip threshold 1.0), factored for tensors of >= 2 dimensions;
  muon:      KellerJordan/Muon muon.py, SingleDeviceMuonWithAuxAdam with the parameter groups of its
             docstring's example (head, embeddings and scalars under AdamW first, then the layers'
             matrices under Muon), 5 Newton-Schulz steps in bf16;
  lion:      timm's Lion (timm/optim/lion.py at 3086dd03, _single_tensor_lion, read in
             validation/published/optimizer-state.md: the update's name still holds the previous tensor's
             while the next is made), memcalc's --optimizer-impl for-loop.
The parameters are the fp32 master copy a mixed-precision recipe steps, each with an fp32 gradient;
their shapes are memcalc's own parameter table of the model (`memcalc estimate --format json`).

Measured: the state (the nbytes of every tensor in the optimiser's state after a first step) and the
most the second step allocates beyond what was live before it (torch.profiler's record of every CPU
allocation and free, replayed in order). memcalc's: the report's state.optimizer_state and the
workspace of its optimizer step. bitsandbytes' 8-bit Adam is not here: it needs CUDA (its figures are
read from its source, validation/published/optimizer-state.md).

  optimizer_state.py --memcalc build/memcalc [--check] [--out results.json]
"""
import argparse
import json
import math
import os
import pathlib
import subprocess
import sys

# On a CPU with AMX, oneDNN's bf16 matmul allocates a scratchpad of its own (9,856 B in Muon's
# Newton-Schulz on llama-tiny, measured 2026-12-01), which no GPU kernel does: capped below AMX, the
# step holds what memcalc models, as it does on a CPU without AMX.
os.environ.setdefault("DNNL_MAX_CPU_ISA", "AVX512_CORE_BF16")
os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")

import torch  # noqa: E402  after the ISA cap, which oneDNN reads once

HERE = pathlib.Path(__file__).resolve().parent
# Models whose largest tensor follows one of its own size in the loop, so memcalc's stand-in for the
# previous tensor (the next largest) is exact. On validation/models/mixtral-tiny.json Adafactor's step
# is 90,112 B against 73,900 measured: the embedding, largest, is stepped first, with none before it,
# as memcalc counts, but the head here follows the final norm, where memcalc counts the next largest
# before it (transformers' Trainer steps norms apart, so its head follows the last layer's matrix).
MODELS = [HERE / "gpu" / "models" / name for name in ("llama-tiny.json", "gpt2-tiny.json", "muon-wide-tiny.json")]


def rms(t):
    return t.norm(2) / (t.numel() ** 0.5)


def approx_sq_grad(row, col):
    """The factored second moment's rsqrt: the outer product of the row and column factors."""
    r_factor = (row / row.mean(dim=-1, keepdim=True)).rsqrt_().unsqueeze(-1)
    c_factor = col.unsqueeze(-2).rsqrt()
    return torch.mul(r_factor, c_factor)


class Adafactor:
    """transformers' Adafactor, its defaults, as its step orders its tensors."""

    def __init__(self, params):
        self.params, self.state = params, {}
        self.eps, self.clip, self.decay = (1e-30, 1e-3), 1.0, -0.8

    @torch.no_grad()
    def step(self):
        for p in self.params:
            grad = p.grad
            factored = grad.dim() >= 2
            state = self.state.setdefault(id(p), {})
            if not state:
                state["step"] = 0
                if factored:
                    state["exp_avg_sq_row"] = torch.zeros(grad.shape[:-1]).to(grad)
                    state["exp_avg_sq_col"] = torch.zeros(grad.shape[:-2] + grad.shape[-1:]).to(grad)
                else:
                    state["exp_avg_sq"] = torch.zeros_like(grad)
                state["RMS"] = 0
            state["step"] += 1
            state["RMS"] = rms(p)
            lr = min(1e-2, 1.0 / math.sqrt(state["step"])) * max(self.eps[1], state["RMS"])
            beta2t = 1.0 - math.pow(state["step"], self.decay)
            update = (grad**2) + self.eps[0]  # the previous tensor's update is still bound here
            if factored:
                row, col = state["exp_avg_sq_row"], state["exp_avg_sq_col"]
                row.mul_(beta2t).add_(update.mean(dim=-1), alpha=1.0 - beta2t)
                col.mul_(beta2t).add_(update.mean(dim=-2), alpha=1.0 - beta2t)
                update = approx_sq_grad(row, col)  # a new tensor while the old update is bound
                update.mul_(grad)
            else:
                v = state["exp_avg_sq"]
                v.mul_(beta2t).add_(update, alpha=1.0 - beta2t)
                update = v.rsqrt().mul_(grad)
            update.div_((rms(update) / self.clip).clamp_(min=1.0))
            update.mul_(lr)
            p.add_(-update)

    def state_tensors(self):
        return [t for s in self.state.values() for t in s.values() if torch.is_tensor(t)]


def newton_schulz(G, steps=5):
    a, b, c = (3.4445, -4.7750, 2.0315)
    X = G.bfloat16()
    if G.size(-2) > G.size(-1):
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        A = X @ X.mT
        B = b * A + c * A @ A
        X = a * X + B @ X
    if G.size(-2) > G.size(-1):
        X = X.mT
    return X


def adam_update(grad, m, v, step, betas, eps):
    """The aux Adam's update, out of place: m^ and v^ (its locals) beside sqrt(v^) + eps and the quotient."""
    m.lerp_(grad, 1 - betas[0])
    v.lerp_(grad.square(), 1 - betas[1])
    m_hat = m / (1 - betas[0] ** step)
    v_hat = v / (1 - betas[1] ** step)
    return m_hat / (v_hat.sqrt() + eps)


class MuonWithAuxAdam:
    """KellerJordan/Muon's SingleDeviceMuonWithAuxAdam: groups stepped in turn, each tensor in order."""

    def __init__(self, adam_groups, muon_params):
        self.adam_groups, self.muon_params, self.state = adam_groups, muon_params, {}

    @torch.no_grad()
    def step(self, lr=0.02, momentum=0.95, betas=(0.9, 0.95), eps=1e-10):
        for group in self.adam_groups:
            for p in group:
                state = self.state.setdefault(id(p), {})
                if not state:
                    state["exp_avg"], state["exp_avg_sq"], state["step"] = torch.zeros_like(p), torch.zeros_like(p), 0
                state["step"] += 1
                update = adam_update(p.grad, state["exp_avg"], state["exp_avg_sq"], state["step"], betas, eps)
                p.add_(update, alpha=-3e-4)
        for p in self.muon_params:
            state = self.state.setdefault(id(p), {})
            if not state:
                state["momentum_buffer"] = torch.zeros_like(p)
            buf = state["momentum_buffer"]
            buf.lerp_(p.grad, 1 - momentum)
            update = newton_schulz(p.grad.lerp_(buf, momentum))  # the previous update is still bound here
            update *= max(1, p.size(-2) / p.size(-1)) ** 0.5
            p.add_(update.reshape(p.shape), alpha=-lr)

    def state_tensors(self):
        return [t for s in self.state.values() for t in s.values() if torch.is_tensor(t)]


class Lion:
    """timm's Lion, one tensor at a time in the model's order, its default betas."""

    def __init__(self, params):
        self.params, self.state = params, {}

    @torch.no_grad()
    def step(self, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0):
        for p in self.params:
            exp_avg = self.state.setdefault(id(p), {}).setdefault("exp_avg", torch.zeros_like(p))
            p.mul_(1 - lr * weight_decay)
            update = exp_avg.mul(betas[0]).add_(p.grad, alpha=1 - betas[0]).sign_()
            p.add_(update, alpha=-lr)
            exp_avg.lerp_(p.grad, 1 - betas[1])

    def state_tensors(self):
        return [t for s in self.state.values() for t in s.values() if torch.is_tensor(t)]


# What memcalc is asked beside each recipe: Lion's loop is torch.optim's kind, which the switch chooses.
RECIPE_FLAGS = {"adafactor": [], "muon": [], "lion": ["--optimizer-impl", "for-loop"]}


def step_peak(optimizer):
    """The most the step allocates beyond what is live when it starts."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        optimizer.step()
    events = sorted((e.start_us(), i, e) for i, e in enumerate(prof.profiler.kineto_results.events())
                    if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU)
    live = most = 0
    for _, _, e in events:
        live += e.nbytes()
        most = max(most, live)
    return most


def memcalc_figures(memcalc, model, recipe):
    out = subprocess.run([memcalc, "--model-file", str(model), "--seq", "16", "--recipe", recipe, "--format", "json"]
                         + RECIPE_FLAGS[recipe], check=True, capture_output=True, text=True).stdout
    report = json.loads(out)
    step = next(s for s in report["timeline"] if s["step"] == "optimizer")
    return report, report["state"]["optimizer_state"], step["by_category"]["workspace"]


def build(report, recipe):
    """The model's trainable tensors in fp32, each with an fp32 gradient, grouped as the recipe's code groups them."""
    torch.manual_seed(0)
    layers = report["parameters"]["layers"]
    made = []  # (tensor row, parameter)
    for row in report["parameters"]["tensors"]:
        # A mixture-of-experts row (E x rows x cols) as E tensors, one module per expert (Mixtral's
        # ModuleList), as memcalc counts them.
        experts, dims = (row["dims"][0], row["dims"][1:]) if len(row["dims"]) == 3 else (1, row["dims"])
        for _ in range((layers if row["per_layer"] else 1) * experts):
            p = torch.nn.Parameter(torch.randn(dims))
            p.grad = torch.randn(dims)
            made.append((row, p))
    if recipe == "adafactor":
        return Adafactor([p for _, p in made])
    if recipe == "lion":
        return Lion([p for _, p in made])
    matrices = [p for row, p in made if row["per_layer"] and p.dim() >= 2]
    head = [p for row, p in made if row["part"] == "head" and p.dim() >= 2]
    embed = [p for row, p in made if row["part"] == "embedding" and p.dim() >= 2]
    scalars = [p for row, p in made if p.dim() < 2]
    return MuonWithAuxAdam([head, embed, scalars], matrices)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--memcalc", required=True)
    ap.add_argument("--models", nargs="+", default=[str(m) for m in MODELS])
    ap.add_argument("--check", action="store_true", help="fail unless the state is exact and the step's temporaries "
                    "within --tolerance of those measured (memcalc does not count 0-dim scalars and row-sized means)")
    ap.add_argument("--tolerance", type=float, default=0.01)
    ap.add_argument("--out")
    args = ap.parse_args()
    rows, failed = [], False
    for model in args.models:
        for recipe in RECIPE_FLAGS:
            report, predicted_state, predicted_step = memcalc_figures(args.memcalc, model, recipe)
            optimizer = build(report, recipe)
            optimizer.step()  # makes the state
            state = sum(t.numel() * t.element_size() for t in optimizer.state_tensors())
            step = step_peak(optimizer)
            row = {"model": report["model"]["name"], "recipe": recipe, "state_bytes": state,
                   "memcalc_state_bytes": predicted_state, "step_extra_bytes": step,
                   "memcalc_step_bytes": predicted_step}
            rows.append(row)
            ok = predicted_state == state and abs(predicted_step - step) <= step * args.tolerance
            failed |= not ok
            print(f"{row['model']:<26} {recipe:<10} state {state:>9,} B (memcalc {predicted_state:>9,})  "
                  f"step {step:>9,} B (memcalc {predicted_step:>9,}) {'ok' if ok else 'DIFFERS'}")
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")
    return 1 if args.check and failed else 0


if __name__ == "__main__":
    sys.exit(main())
