#!/usr/bin/env python3
"""What autograd keeps of Gemma 3's projector, as transformers' modeling_gemma3.py runs it.

  /usr/bin/python3 validation/gemma3_projector_saved.py

SigLIP's post-LayerNorm, then Gemma3MultiModalProjector's ops in its order: transpose, reshape and
contiguous, avg_pool2d, flatten and transpose, Gemma3RMSNorm (x.float(), pow(2).mean(), rsqrt, the
fp32 scale by 1 + weight, type_as) and the projection. Written from the module's forward (the
transformers vendored for validation predates Gemma 3), run in bf16 on CPU through torch's own
kernels. Prints each distinct storage backward keeps, beside memcalc's rows (blocks/vision_tower.hpp
projector_rows) for torch 1.13 on CPU: LayerNorm statistics in bf16 there, mean keeps x^2.
"""
import torch

images, side, pool, hidden, out = 2, 64, 4, 64, 32
patches, tokens = side * side, (side // pool) ** 2
storages = {}


def pack(t):
    storages.setdefault(t.untyped_storage().data_ptr() if hasattr(t, "untyped_storage")
                        else t.storage().data_ptr(), t.numel() * t.element_size())
    return t


x = torch.randn(images, patches, hidden, dtype=torch.bfloat16)
norm = torch.nn.LayerNorm(hidden).to(torch.bfloat16)
soft_norm = torch.zeros(hidden, requires_grad=True)
projection = torch.randn(hidden, out, dtype=torch.bfloat16, requires_grad=True)
with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
    v = norm(x)
    r = v.transpose(1, 2).reshape(images, hidden, side, side).contiguous()
    p = torch.nn.functional.avg_pool2d(r, pool, pool).flatten(2).transpose(1, 2)
    f = p.float()
    o = f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + 1e-6)
    y = torch.matmul((o * (1.0 + soft_norm.float())).type_as(p), projection)
weights = {norm.weight.data_ptr(), norm.bias.data_ptr(), projection.data_ptr()}
measured = sum(b for ptr, b in storages.items() if ptr not in weights and b > 4 * hidden)
n, t = images * patches, images * tokens
memcalc = (n * hidden * 2 + n * 2 * 2 + n * hidden * 2 +        # LayerNorm, its bf16 stats, pool
           t * hidden * 4 * 3 + t * 4 + t * hidden * 2)         # RMSNorm (x, x^2, out), 1/rms, input
print(f"torch {torch.__version__}: kept {measured} B (weights and the norm's scale aside); "
      f"memcalc's rows {memcalc} B")
