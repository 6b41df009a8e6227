"""What torchtune's chunked cross-entropy keeps for backward, eager and compiled: one chunk's
compute_cross_entropy, F.cross_entropy(logits.float(), labels, reduction="sum", ignore_index=-100)
as torchtune's CEWithChunkedOutputLoss writes it (torchtune compiles it alone when compile is on:
training.compile_loss), through eager autograd and through torch 1.13's AOTAutograd min-cut
partitioner (min_cut_rematerialization_partition, compiler="inductor": the partition
torch.compile's inductor asks for), in bf16 on CPU. Bytes are distinct storages handed to backward
(the labels and 0-d scalars left out; the logits chunk itself, which the caller holds, counted
apart). Needs python3-networkx. On PyTorch 2 torch.compile itself runs, with inductor:

    /usr/bin/python3 validation/compiled_loss_saved.py
    validation/torch2-chroot.sh run python3 validation/compiled_loss_saved.py   # torch 2.6
"""
import functools
import warnings

import torch
import torch.nn.functional as F
from functorch.compile import aot_function, min_cut_rematerialization_partition  # noqa: E402

MIN_CUT = functools.partial(min_cut_rematerialization_partition, compiler="inductor")


def chunk_loss(logits, labels):
    return F.cross_entropy(logits.float(), labels, reduction="sum", ignore_index=-100)


def split(tensors, logits):
    """(bytes of storages other than the logits chunk, whether the chunk itself is kept)."""
    sizes, chunk = {}, False
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.dim() == 0 or not t.is_floating_point():
            continue
        if t.storage().data_ptr() == logits.storage().data_ptr():
            chunk = True
            continue
        sizes[t.storage().data_ptr()] = t.storage().nbytes()
    return sum(sizes.values()), chunk


def eager(logits, labels):
    got = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: (got.append(t), t)[1], lambda t: t):
        loss = chunk_loss(logits, labels)
    loss.backward()
    return split(got, logits)


def compiled(logits, labels):
    report = {}

    def forward_compiler(graph, _):
        def run(*args):
            outs = graph(*args)
            report["saved"] = split(outs[1:], logits)  # one user output: the loss
            return outs
        return run

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        f = aot_function(chunk_loss, fw_compiler=forward_compiler, bw_compiler=lambda g, _: g,
                         partition_fn=MIN_CUT)
        f(logits, labels).backward()
    return report["saved"]


def inductor_compiled(logits, labels):
    """PyTorch 2: torch.compile(chunk_loss) with inductor, its forward graph's extra outputs."""
    from inductor_capture import compile_watching_forward
    report = {}

    def saved(outs):
        report["saved"] = split(outs[1:], logits)  # one user output: the loss

    compile_watching_forward(chunk_loss, saved)(logits, labels).backward()
    return report["saved"]


if int(torch.__version__.split(".")[0]) >= 2:  # torch.compile itself, not 1.13's partitioner alone
    compiled = inductor_compiled  # noqa: F811


def main():
    print(f"torch {torch.__version__}: one chunk of torchtune's chunked cross-entropy, bf16 logits")
    print(f"{'tokens x vocab':>16} {'eager kept':>14} {'compiled kept':>14} {'per logit':>10} "
          f"{'chunk kept (eager, compiled)':>30}")
    for tokens, vocab in ((512, 32000), (1024, 50304), (256, 128256)):
        torch.manual_seed(0)
        logits = torch.randn(tokens, vocab, dtype=torch.bfloat16, requires_grad=True)
        labels = torch.randint(0, vocab, (tokens,))
        (e, e_chunk), (c, c_chunk) = eager(logits, labels), compiled(logits, labels)
        print(f"{tokens:>6} x {vocab:<7} {e:>14,} {c:>14,} {c / (tokens * vocab):>10.2f} "
              f"{str((e_chunk, c_chunk)):>30}")


if __name__ == "__main__":
    main()
