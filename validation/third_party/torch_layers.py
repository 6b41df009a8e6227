"""A GPT made of torch's own nn.TransformerEncoderLayer (pre-norm, GELU, causal mask), for validation.

Every layer's code is PyTorch's (torch/nn/modules/transformer.py, activation.py's MultiheadAttention,
functional.py's multi_head_attention_forward); this file only stacks them between token and learned
position embeddings and a linear head, as a user of torch would, and returns (logits, loss) as
nanoGPT's GPT does. Training takes the layers' Python path (the fused fast path needs eval mode).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class TorchLayersGPT(nn.Module):
    def __init__(self, vocab, block_size, n_layer, n_head, n_embd):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList(
            nn.TransformerEncoderLayer(n_embd, n_head, 4 * n_embd, dropout=0.0, activation="gelu",
                                       batch_first=True, norm_first=True) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        # torch's own causal mask (0 on and below the diagonal, -inf above), in the activations' dtype
        mask = nn.Transformer.generate_square_subsequent_mask(t, idx.device).to(x.dtype)
        for layer in self.h:
            x = layer(x, src_mask=mask)
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
