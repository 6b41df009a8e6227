#!/usr/bin/env python3
"""DeepSeek-V3.2's lightning indexer, measured on CPU beside memcalc's --ops tape.

  /usr/bin/python3 validation/sparse_indexer_live.py --memcalc build/memcalc [--json FILE]
      [--model validation/models/deepseek-v32-tiny.json] [--seq 16 32 64] [--micro-batch 1 2]

The indexer runs as reference_trainer.py's SparseIndexer (transformers' DeepseekV32Indexer, under
torch.no_grad), in bf16, then DeepseekV32Attention's mask: the top-k scattered into a bool mask and
the causal mask filled where it is set. torch's profiler (profile_memory) gives every allocation
and free; the live bytes above the start are summed in time order. Two figures per shape:
  peak  the most bytes live during the indexer's forward (its q, k, their fp32 copies, the fp32
        scores at every head and their scaled and rectified copies; for b > 1 k broadcast over the
        queries, which torch.matmul copies; the index scores, the mask added (on CPU through an
        fp32 copy of it), top-k's values and int64 indices);
  held  what is live once the mask is made: the int32 indices, the bool mask, the filled mask,
        which the attention holds until it returns.
memcalc's: the largest of its indexer workspaces (ops named "(indexer, no grad)") and the tensor its
tape holds beside the core attention ("the indexer's top-k indices ..."). Exit 1 on a difference.
--committed FILE checks memcalc against the measured figures of a --json file, without torch
(results/cpu-sparse-indexer.json; ctest committed_sparse_indexer_results_agree).
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def is_mark_handle(record):
    """record_function's own 4-byte handle, made as each mark opens."""
    from op_live import describe
    return record[1] == 4 and describe(record[3])[1:] == ("zeros/empty", "[]")


def measure(spec, b, s):
    """(peak, held): bytes above the start, from the profiler's allocation events."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function
    from op_live import from_tree
    from reference_trainer import SparseIndexer

    torch.manual_seed(0)
    indexer = SparseIndexer(spec).to(torch.bfloat16)
    x = torch.randn(b, s, spec.hidden, dtype=torch.bfloat16)
    q_latent = torch.randn(b, s, spec.q_lora_rank, dtype=torch.bfloat16)
    angles = torch.randn(1, s, spec.qk_rope_head_dim)
    cos, sin = angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)
    causal = torch.full((s, s), torch.finfo(torch.bfloat16).min, dtype=torch.bfloat16).triu(1)
    mask = causal[None, None].expand(b, 1, -1, -1)  # the model's 4-D mask, as make_ctx builds it
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True) as p:
        with record_function("mark: start"):
            pass
        top = indexer(x, q_latent, cos, sin, mask[:, 0])
        with record_function("mark: indexer"):
            pass
        index_mask = top.new_ones((b, s, s), dtype=torch.bool).scatter(-1, top.long(), False)
        filled = mask.masked_fill(index_mask.unsqueeze(1), torch.finfo(torch.bfloat16).min)
        with record_function("mark: mask"):
            pass
    del filled
    live, peak, phase, held = 0, 0, None, None
    for record in from_tree(p):
        if record[0] == "mark":
            phase = record[1][len("mark: "):]
            if phase == "mask":
                held = live
            continue
        if phase is None or is_mark_handle(record):
            continue
        live += record[1]
        if phase == "start":
            peak = max(peak, live)
    return peak, held


def predicted(memcalc, model, b, s):
    """(peak, held) from memcalc's --ops tape."""
    cmd = [memcalc, "--model-file", model, "--seq", str(s), "--micro-batch", str(b),
           "--activations", "architecture", "--attention", "eager", "--platform", "cpu",
           "--ops", "--format", "json"]
    report = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    events = [e for e in report["activations"]["ops"] if e["phase"] == "forward"]
    peak = max(e["bytes"] for e in events if e["event"] == "alloc" and "(indexer" in e["op"])
    held = next(e["bytes"] for e in events
                if e["event"] == "alloc" and e["tensor"].startswith("the indexer's top-k"))
    return peak, held


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--memcalc", required=True)
    ap.add_argument("--model", default=os.path.join(HERE, "models", "deepseek-v32-tiny.json"))
    ap.add_argument("--seq", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--micro-batch", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--committed", help="a --json file's measured figures, checked without torch")
    a = ap.parse_args(argv)
    if a.committed:
        with open(a.committed) as f:
            committed = json.load(f)
        measured = {(r["micro_batch"], r["seq"]): {} for r in committed}
        for r in committed:
            measured[(r["micro_batch"], r["seq"])][r["figure"]] = r["measured"]
        shapes = [(b, s, (m["peak"], m["held"])) for (b, s), m in measured.items()]
        name = committed[0]["model"]
    else:
        from reference_trainer import load_spec
        spec = load_spec(a.model)
        shapes = [(b, s, None) for b in a.micro_batch for s in a.seq]
        name = spec.name
    rows, failed = [], 0
    print(f"{'b':>2} {'s':>4} {'':5} {'measured':>10} {'memcalc':>10} {'diff':>8}")
    for b, s, got in shapes:
        got = got or measure(spec, b, s)
        want = predicted(a.memcalc, a.model, b, s)
        for figure, m, p in zip(("peak", "held"), got, want):
            ok = m == p
            failed += not ok
            rows.append({"model": name, "micro_batch": b, "seq": s, "figure": figure,
                         "measured": m, "memcalc": p, "agree": ok})
            print(f"{b:>2} {s:>4} {figure:5} {m:>10,} {p:>10,} {p - m:>+8,}"
                  f"{'' if ok else '  MISMATCH'}")
    print(f"\n{len(rows) - failed}/{len(rows)} figures agree")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
            f.write("\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
