"""The head and torchtune's chunked loss as a program, eager and compiled: peak bytes above what
lived before, on CPU (the profiler's allocations replayed, as replicate.py's Meter does), between
the head's forward and its backward's end, with torchtune's CEWithChunkedOutputLoss written as its
source does (each chunk's cross_entropy(chunk.float()), summed, divided by the tokens), the head run
chunk by chunk (TransformerDecoder.chunked_output): eager, and on PyTorch 2 with the chunk's loss
compiled by inductor too (torchtune's training.compile_loss), beside memcalc's rule for the compiled
loss's backward (stage_inputs.hpp set_compiled_chunked_loss_work).

    validation/torch2-chroot.sh run python3 validation/chunked_loss_peak.py \
        > validation/results/cpu-chunked-loss-torch2.6.txt
"""
import argparse
import gc
import itertools
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu"))
from replicate import Meter  # noqa: E402


def compute_cross_entropy(logits, labels):
    return F.cross_entropy(logits.float(), labels, reduction="sum", ignore_index=-100)


def run(tokens, batch, hidden, vocab, chunks, compiled, head_kind):
    """head_kind: trained, frozen (an adapter run's: no weight gradient) or none (each chunk's
    logits made from a leaf of its own by a product with 1, which saves nothing: the loss alone,
    without the CPU matmul's own temporaries)."""
    torch.manual_seed(0)
    h = torch.randn(batch, tokens, hidden, dtype=torch.bfloat16, requires_grad=True)
    head = torch.nn.Linear(hidden, vocab, bias=False).to(torch.bfloat16)
    head.weight.requires_grad_(head_kind == "trained")
    leaves = [torch.randn(batch, n.numel() // hidden // batch, vocab, dtype=torch.bfloat16,
                          requires_grad=True) for n in h.detach().tensor_split(chunks, dim=1)]
    labels = torch.randint(0, vocab, (batch, tokens))
    loss_fn = compute_cross_entropy
    if compiled:
        torch._dynamo.reset()
        loss_fn = torch.compile(compute_cross_entropy, fullgraph=True)
        # compiled before measuring: inductor's own buffers are not the step's
        x = head(h[:, : tokens // chunks]).reshape(-1, vocab)
        loss_fn(x, labels[:, : tokens // chunks].reshape(-1)).backward()
        h.grad, head.weight.grad = None, None
    gc.collect()
    with Meter("cpu") as meter:
        meter.mark("loss")
        if head_kind == "none":
            logits = [leaf * 1.0 for leaf in leaves]
        else:
            logits = [head(c) for c in h.tensor_split(chunks, dim=1)]
        pieces = labels.tensor_split(chunks, dim=1)
        total = sum(loss_fn(x.reshape(-1, vocab), y.reshape(-1)) for x, y in zip(logits, pieces))
        loss = total / labels.numel()
        del logits
        meter.mark("backward")
        loss.backward()
    peaks = {s["step"]: s["max_bytes"] - meter.before for s in meter.steps}
    return peaks


def rule(tokens, batch, hidden, vocab, chunks, head_kind):
    """memcalc's rule for the compiled loss's backward (stage_inputs.hpp), with the hidden states'
    gradient (bf16) it counts apart."""
    logits = tokens * batch * vocab
    part, weight = logits // chunks, 2 * hidden * vocab if head_kind == "trained" else 0
    peak = max(2 * (logits + part), 2 * logits + weight, 2 * (logits - part) + 2 * weight)
    return peak + (2 * tokens * batch * hidden if head_kind != "none" else 0)


def main():
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    # The third: a head wider than the logits, whose weight's gradient (twice, from the second chunk
    # on: autograd adds the next into it) sets the backward's peak. Without a weight gradient the
    # chunks' loss backward sets it: the logits, and the one chunk's gradient being made (a frozen
    # head on CPU adds copies of its weight in forward and backward: oneDNN's, not the loss's).
    shapes = ((512, 2, 256, 8192, 8), (1024, 1, 128, 16384, 4), (256, 2, 2048, 8192, 8))
    ways = (False, True) if int(torch.__version__.split(".")[0]) >= 2 else (False,)
    heads = ("trained", "frozen", "none")
    for head_kind, shape, compiled in itertools.product(heads, shapes, ways):
        tokens, batch, hidden, vocab, chunks = shape
        logits = tokens * batch * vocab
        p = run(tokens, batch, hidden, vocab, chunks, compiled, head_kind)
        r = rule(tokens, batch, hidden, vocab, chunks, head_kind)
        print(f"{tokens}x{batch} V {vocab} chunks {chunks} head {head_kind:7}"
              f" {'compiled' if compiled else 'eager':8}"
              f" loss {p['loss']:>12,} ({p['loss'] / logits:.2f} B/logit)"
              f" backward {p['backward']:>12,} ({p['backward'] / logits:.2f} B/logit)"
              + (f" rule {r:>12,} ({r / p['backward'] - 1:+.1%})" if compiled else ""))


if __name__ == "__main__":
    main()
