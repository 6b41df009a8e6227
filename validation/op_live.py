#!/usr/bin/env python3
"""One layer's live bytes op by op: torch's profiler (CPU) beside memcalc's --ops tape.

  /usr/bin/python3 validation/op_live.py [--model llama-tiny] [--seq 64] [--recompute none]
      [--layer 2] [--train lora --lora-targets all-linear ...] [--memcalc build/memcalc] [--json]
      [--check] [--tolerance BYTES] [--small BYTES] [--all] [--memcalc-json REPORT.json]
  /usr/bin/python3 validation/op_live.py --self-test          # the alignment logic alone, no torch

Measures one training step as gpu/replicate.py does (its run and Meter, one step after a warm-up,
eager attention, the steps marked as there) and reads, as gpu/peak_live.py does, the profiler's
memory events: every allocation and free during layer L's forward step ("forward L", to the next
mark) and its backward step ("backward L": from the gradient of its output arriving to that of its
input), with the op that made each (aten names, input shapes; in backward the autograd node) and
the live bytes after it, less those at the start of the step. memcalc runs with the flags
compare.py gives the same run, plus --ops: activations.ops, one layer's events (alloc, free, save,
rebuild, run) with the live bytes after each, taken here less the phase's start (forward: 0;
backward: what the layer kept).

The two sequences are aligned by size and lifetime: a longest common subsequence of the signed
byte counts (+ an allocation, - a free), each with whether it stays within the step (an allocation
the step frees again; a free of what the step made: memcalc's by tensor name), weighted by bytes,
so that the big tensors pair first. At each aligned pair both sides should hold as many bytes
more than at the step's start; the first pair where they do not is reported, with the unmatched
events since the last pair that agreed (where the difference arose). Also each phase's most bytes
above its start, measured and modelled, and where the step ends.

Caveats (printed with the output): only differences within the step are compared (the process
also holds other layers' tensors and the weights); pairs of equal size are taken for one tensor
(with s = h, say, many sizes coincide); the CPU allocates what a GPU would not (oneDNN's matmul
scratchpads, freed at once; checkpoint's RNG state; wrapped numbers); weight gradients (marked by
a hook on each parameter's AccumulateGrad) are listed but left out of the live bytes, being
gradients (--count-weight-grads counts them). Unlike peak_live.py, frees are matched to their
allocations by address, which torch 1.13's profiler gives in its event tree.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
GPU = os.path.join(HERE, "gpu")
ROOT = os.path.dirname(HERE)

SMALL = 64  # bytes: unmatched measured events this size or less are folded into one line (text)
SIGN = {"alloc": 1, "save": 1, "rebuild": 1, "free": -1}  # a phase's first event: its change

CAVEATS = [
    "Only differences within the step are compared: the measured process also holds the other "
    "layers' tensors and the weights, memcalc's backward starts from what the layer kept.",
    "Aligned by size and lifetime alone (weighted LCS of the signed byte counts, each with whether "
    "it stays within the step): a pair is taken for one tensor, which is wrong where sizes "
    "coincide (s = h, ...).",
    "Frees are matched to allocations by address (the profiler's event tree), so what a free "
    "frees is exact; the op named for an allocation is the innermost aten op around it.",
    "The CPU allocates what a GPU would not: oneDNN's matmul scratchpads (freed at once), 0-dim "
    "wrapped numbers, checkpoint's CPU RNG state (5,056 B).",
    "Weight gradients (marked by a hook on each AccumulateGrad) are listed but not counted in live "
    "(--count-weight-grads counts them).",
]


# ---------------------------------------------------------------- measured: the profiler's events

def from_tree(profiler):
    """The profiled run's records in time order, from the profiler's event tree (which torch 1.13
    gives with each allocation's address): ("mark", NAME) for the marks ("mark: STEP", "wgrad: NAME
    ADDRESS") and ("memory", BYTES, ADDRESS, CONTEXT) for each allocation (+) and free (-) on the
    CPU, CONTEXT being the ops around it, outermost first, as (name, input shapes)."""
    import torch
    out = []

    def walk(node, context):
        if node.tag == type(node.tag).Allocation:
            f = node.extra_fields
            if f.device == torch.device("cpu") and f.alloc_size:
                out.append((node.start_time_ns, len(out), ("memory", f.alloc_size, f.ptr, context)))
        elif node.name.startswith(("mark: ", "wgrad: ")):
            out.append((node.start_time_ns, len(out), ("mark", node.name)))
        else:
            shapes = tuple(tuple(x) for x in getattr(node.extra_fields, "inputs").shapes if x) \
                if hasattr(node.extra_fields, "inputs") else ()
            for child in node.children:
                walk(child, context + ((node.name, shapes),))

    for root in profiler.profiler.kineto_results.experimental_event_tree():
        walk(root, ())
    return [record for _, _, record in sorted(out, key=lambda x: x[:2])]


def describe(context):
    """(node, op, shapes) of an allocation's context: the autograd node being evaluated, the
    outermost and innermost ops below it ("linear/mm") and the first input shapes among them."""
    node = ""
    for name, _ in context:
        if name.startswith("autograd::engine::evaluate_function: "):
            node = name.split(": ", 1)[1]
    ops = [(name, shapes) for name, shapes in context
           if not name.startswith("autograd::engine") and name != node]
    if not ops:
        return node, "", ""
    short = lambda name: name[len("aten::"):] if name.startswith("aten::") else name
    op = short(ops[0][0]) + ("/" + short(ops[-1][0]) if len(ops) > 1 else "")
    shaped = next((shapes for _, shapes in ops if shapes), ())
    return node, op, str([list(x) for x in shaped]).replace(" ", "")


def measured_steps(records, wanted):
    """{step: [event dicts]} for each timeline step in `wanted`, in time order. An allocation:
    bytes > 0, node, op, shapes, and weight_gradient (the parameter) when a "wgrad: NAME ADDRESS"
    mark (made after its AccumulateGrad ran) names its address; a free: bytes < 0, its own node and
    op, and made_by, made_in, weight_gradient of the allocation at its address."""
    step, steps = None, {w: [] for w in wanted}
    live = {}  # address -> the allocation there
    for record in records:
        if record[0] == "mark":
            name = record[1]
            if name.startswith("mark: "):
                step = name[len("mark: "):]
            else:
                parameter, address = name[len("wgrad: "):].rsplit(" ", 1)
                made = live.get(int(address))
                if made is not None and made["step"] == step:
                    made["weight_gradient"] = parameter
            continue
        _, n, address, context = record
        node, op, shapes = describe(context)
        if n > 0:
            event = {"bytes": n, "node": node, "op": op, "shapes": shapes, "step": step}
            live[address] = event
        else:
            event = {"bytes": n, "node": node, "op": op, "shapes": shapes, "step": step,
                     "made": live.pop(address, None)}
            if event["made"] is not None and event["made"]["step"] == step:
                event["made"]["freed_in_step"] = True
        if step in steps:
            steps[step].append(event)
    return {w: [finish(r, w) for r in rs] for w, rs in steps.items()}


def finish(record, step):
    """An event dict for output: a free names what it freed; within_step says, of an allocation,
    that the step frees it again, of a free, that the step made what it frees."""
    out = {k: v for k, v in record.items() if k not in ("step", "made", "freed_in_step")}
    out["within_step"] = bool(record.get("freed_in_step"))
    if record["bytes"] < 0:
        made = record["made"]
        out["within_step"] = made is not None and made["step"] == step
        out["made_by"] = (f"{made['node'] + ': ' if made['node'] else ''}{made['op']} "
                          f"{made['shapes']}".strip()) if made else "?"
        out["made_in"] = (made["step"] or "before the step") if made else "before profiling"
        if made and "weight_gradient" in made:
            out["weight_gradient"] = made["weight_gradient"]
    return out


def add_live(measured, count_weight_grads=False):
    """Sets each event's live (bytes above the step's start after it; weight gradients counted
    only if asked) and counted (whether it moves live)."""
    live = 0
    for e in measured:
        e["counted"] = count_weight_grads or "weight_gradient" not in e
        if e["counted"]:
            live += e["bytes"]
        e["live"] = live
    return measured


# ---------------------------------------------------------------- memcalc's tape

def model_phase(ops, phase):
    """(start, events) of one phase of memcalc's activations.ops: each event with delta (its change
    to live: live less the previous event's; the first one's from its kind), rel (live less the
    phase's start) and within_step (an allocation the phase frees again, by tensor name and bytes;
    a free of one the phase made)."""
    events = [dict(e) for e in ops if e.get("phase") == phase]
    start, previous = 0, None
    made = {}  # (tensor, bytes) -> events that made it in this phase, not yet freed
    for e in events:
        if previous is None:
            delta = SIGN.get(e.get("event"), 0) * int(e.get("bytes", 0))
            start = int(e["live"]) - delta
        else:
            delta = int(e["live"]) - previous
        e["delta"], e["rel"] = delta, int(e["live"]) - start
        previous = int(e["live"])
        key = (e.get("tensor"), e.get("bytes"))
        e["within_step"] = False
        if e.get("event") in ("alloc", "save", "rebuild"):
            made.setdefault(key, []).append(e)
        elif e.get("event") == "free" and made.get(key):
            made[key].pop()["within_step"] = e["within_step"] = True
    return start, events


def model_tokens(events):
    """memcalc's events as alignment tokens (event index, (signed bytes, within_step), live after);
    an event that leaves live as it was (run: the op running with its temporaries) has None."""
    return [(j, (e["delta"], e["within_step"]) if e["delta"] else None, e["rel"])
            for j, e in enumerate(events)]


# ---------------------------------------------------------------- alignment

def align(a, b):
    """A longest common subsequence of two sequences of signed byte counts, or of (signed bytes,
    anything else that must be equal) (None never matches), weighted by |bytes| + 1: [(i or None,
    j or None)] covering both in order; between two pairs the unmatched of b come first, then
    those of a."""
    weight = lambda x: abs(x[0] if isinstance(x, tuple) else x) + 1
    n, m = len(a), len(b)
    score = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        row, below = score[i], score[i + 1]
        for j in range(m - 1, -1, -1):
            best = max(below[j], row[j + 1])
            if a[i] is not None and a[i] == b[j]:
                best = max(best, below[j + 1] + weight(a[i]))
            row[j] = best
    out, i, j, gap_a, gap_b = [], 0, 0, [], []
    while i < n or j < m:
        if (i < n and j < m and a[i] is not None and a[i] == b[j]
                and score[i][j] == score[i + 1][j + 1] + weight(a[i])):
            out += [(None, y) for y in gap_b] + [(x, None) for x in gap_a] + [(i, j)]
            gap_a, gap_b = [], []
            i, j = i + 1, j + 1
        elif j < m and (i == n or score[i][j] == score[i][j + 1]):
            gap_b.append(j)
            j += 1
        else:
            gap_a.append(i)
            i += 1
    return out + [(None, y) for y in gap_b] + [(x, None) for x in gap_a]


def compare_phase(measured, model_events, tolerance=0, small=SMALL):
    """Rows (measured index, memcalc token) aligned, each aligned pair's difference of live bytes
    (measured less memcalc, leaving out the unmatched measured events of `small` bytes or less:
    wrapped numbers, index scalars), the first pair that differs by more than `tolerance` with the
    unmatched events since the last pair that agreed, and the phase's maxima and ends."""
    tokens = model_tokens(model_events)
    a = [(e["bytes"], e["within_step"]) if e["counted"] else None for e in measured]
    b = [t[1] for t in tokens]
    rows, noise = [], 0
    for i, k in align(a, b):
        row = {"measured": i, "model": tokens[k][0] if k is not None else None}
        e = measured[i] if i is not None else None
        if e and k is None and e["counted"] and abs(e["bytes"]) <= small:
            noise += e["bytes"]
        if e and k is not None:
            row["diff"], row["left_out"] = e["live"] - noise - tokens[k][2], noise
        row["model_live"] = tokens[k][2] if k is not None else None
        rows.append(row)
    first, since, agreed = None, [], 0
    for r, row in enumerate(rows):
        if "diff" not in row:
            since.append(r)
            continue
        if abs(row["diff"]) > tolerance and first is None:
            first = {"row": r, "diff": row["diff"], "since_row": agreed, "unmatched_rows": since}
        if abs(row["diff"]) <= tolerance:
            agreed = r
        since = []
    m_live = [0] + [e["live"] for e in measured]
    k_live = [0] + [t[2] for t in tokens]
    m_peak = max(range(len(m_live)), key=lambda x: m_live[x])
    k_peak = max(range(len(k_live)), key=lambda x: k_live[x])
    return {
        "rows": rows, "first_disagreement": first,
        "pairs": sum("diff" in r for r in rows),
        "pairs_agreeing": sum(abs(r.get("diff", 0)) <= tolerance for r in rows if "diff" in r),
        "measured_peak": m_live[m_peak], "measured_peak_at": m_peak - 1,
        "modelled_peak": k_live[k_peak],
        "modelled_peak_at": tokens[k_peak - 1][0] if k_peak else -1,
        "measured_end": m_live[-1], "modelled_end": k_live[-1],
        "unmatched_measured": [row["measured"] for row in rows if row["model"] is None],
        "unmatched_model": sorted({row["model"] for row in rows if row["measured"] is None
                                   and row["model"] is not None}),
    }


# ---------------------------------------------------------------- output

def label_measured(e):
    node = e["node"] + ": " if e["node"] else ""
    if e["bytes"] > 0:
        text = f"{node}{e['op'] or '(no op: outside the dispatcher)'} {e['shapes']}".strip()
    else:
        text = f"free {e['made_by']}" + (f" ({e['made_in']})" if e.get("made_in") else "")
    return ("[wgrad] " if "weight_gradient" in e else "") + text


def label_model(e):
    return f"{e.get('op', '?')}: {e.get('tensor', '')}".rstrip(": ")


def cut(text, width):
    return text if len(text) <= width else text[:width - 1] + "~"


def text_phase(name, step, measured, start, model_events, result, small=SMALL, show_all=False):
    lines = [f"== {name}: measured step '{step}' beside memcalc's {name} tape (its live less "
             f"{start:,} B, where the phase starts); diff: measured less memcalc at each aligned "
             f"pair (=), unmatched measured events of <= {small} B left out"]
    lines.append(f"{'':>4} {'measured op':<48} {'bytes':>9} {'live':>9} | "
                 f"{'memcalc op: tensor':<40} {'event':<7} {'bytes':>9} {'live':>9} | {'diff':>8}")
    folded = []

    def flush():
        if folded:
            net = sum(measured[i]["bytes"] for i in folded if measured[i]["counted"])
            lines.append(f"{'':>4} ({len(folded)} small unmatched measured events, net {net:+,} B, "
                         f"live then {measured[folded[-1]]['live']:,})")
            folded.clear()

    first = result["first_disagreement"]
    for r, row in enumerate(result["rows"]):
        i, j = row["measured"], row["model"]
        if not show_all and j is None and abs(measured[i]["bytes"]) <= small:
            folded.append(i)
            continue
        flush()
        left = right = ""
        if i is not None:
            e = measured[i]
            live = f"{e['live']:>9,}" if e["counted"] else f"{'-':>9}"
            left = f"{cut(label_measured(e), 48):<48} {e['bytes']:>+9,} {live}"
        if j is not None:
            e = model_events[j]
            right = (f"{cut(label_model(e), 40):<40} {e.get('event', '?'):<7} "
                     f"{e.get('bytes', 0):>9,} {row['model_live']:>9,}")
        mark = "=" if "diff" in row else " "
        diff = f"{row['diff']:>+8,}" if "diff" in row else ""
        flag = " <- first" if first and first["row"] == r else ""
        lines.append(f"{r:>4}{mark}{left:<68} | {right:<69} | {diff}{flag}")
    flush()
    lines += summary(name, measured, model_events, result)
    return lines


def summary(name, measured, model_events, result):
    out = []
    first = result["first_disagreement"]
    if first is None:
        out.append(f"{name}: running live agrees at every one of {result['pairs']} aligned pairs")
    else:
        row = result["rows"][first["row"]]
        m, k = measured[row["measured"]], model_events[row["model"]]
        left = f", {row['left_out']:+,} of it small and left out" if row["left_out"] else ""
        out.append(f"{name}: first disagreement at row {first['row']}: measured {m['live']:,} B"
                   f"{left} after '{label_measured(m)}', memcalc {row['model_live']:,} after "
                   f"'{label_model(k)}' ({first['diff']:+,} B); last agreement at row "
                   f"{first['since_row']}")
        between = [result["rows"][r] for r in first["unmatched_rows"]]
        gone = [measured[x["measured"]] for x in between if x["measured"] is not None]
        gone = [e for e in gone if e["counted"]]
        theirs = sorted({x["model"] for x in between if x["model"] is not None})
        largest = sorted(gone, key=lambda e: -abs(e["bytes"]))[:4]
        out.append(f"  unmatched between: {len(gone)} measured (net "
                   f"{sum(e['bytes'] for e in gone):+,} B"
                   + "".join(f"; {e['bytes']:+,} {cut(label_measured(e), 60)}" for e in largest)
                   + f"), {len(theirs)} memcalc"
                   + "".join(f"; {model_events[j]['delta']:+,} "
                             f"{cut(label_model(model_events[j]), 50)}" for j in theirs[:4]) + ")")
    pk = result["measured_peak_at"]
    at = f" after '{cut(label_measured(measured[pk]), 60)}'" if pk >= 0 else ""
    kk = result["modelled_peak_at"]
    kat = f" at '{cut(label_model(model_events[kk]), 50)}'" if kk >= 0 else ""
    off = result["modelled_peak"] - result["measured_peak"]
    out.append(f"  most above the start: measured {result['measured_peak']:,} B{at}; memcalc "
               f"{result['modelled_peak']:,}{kat} ({off:+,})")
    out.append(f"  end of the step: measured {result['measured_end']:,} B, memcalc "
               f"{result['modelled_end']:,} ({result['modelled_end'] - result['measured_end']:+,})")
    um, uk = result["unmatched_measured"], result["unmatched_model"]
    wg = [e for e in measured if not e["counted"]]
    net_m = sum(measured[i]["bytes"] for i in um if measured[i]["counted"])
    net_k = sum(model_events[j]["delta"] for j in uk)
    out.append(f"  aligned {result['pairs']} pairs ({result['pairs_agreeing']} agreeing); "
               f"unmatched: {len(um)} measured events (net {net_m:+,} B), {len(uk)} memcalc "
               f"events (net {net_k:+,} B)"
               + (f"; {len(wg)} weight-gradient events ({sum(e['bytes'] for e in wg):+,} B) "
                  "not counted" if wg else ""))
    return out


def measured_only(name, step, measured):
    lines = [f"== {name}: measured step '{step}' (no memcalc tape to set beside it)",
             f"{'':>4} {'measured op':<60} {'bytes':>9} {'live':>9}"]
    for r, e in enumerate(measured):
        live = f"{e['live']:>9,}" if e["counted"] else f"{'-':>9}"
        lines.append(f"{r:>4} {cut(label_measured(e), 60):<60} {e['bytes']:>+9,} {live}")
    peak = max([0] + [e["live"] for e in measured])
    lines.append(f"{name}: most above the start {peak:,} B; end of the step "
                 f"{measured[-1]['live'] if measured else 0:,} B")
    return lines


# ---------------------------------------------------------------- running

def measure(a, spec, train):
    """replicate.py's run of one step, profiled with input shapes, each parameter's gradient marked
    ("wgrad: NAME BYTES"), and marks that allocate nothing: {step: measured events}, the run."""
    import torch
    sys.path.insert(0, GPU)
    import replicate as R

    found = {}
    original = (R.Meter.__exit__, R.Meter.mark, R.make_optimizer, torch.profiler.profile)
    enter, leave = (torch.ops.profiler._record_function_enter_new,
                    torch.ops.profiler._record_function_exit._RecordFunction)

    def note(name):  # record_function's handle is a 4-byte tensor in torch 1.13; this one is not
        leave(enter(name, None))

    def mark(meter, step):
        if meter.cuda:
            return original[1](meter, step)
        note("mark: " + step)
        meter.steps.append({"step": step})

    def make_optimizer(recipe, model, grad_buffer):
        # After each parameter's AccumulateGrad has run (a hook on the node, which the engine allows
        # for when it steals the incoming gradient), a mark with the address of p.grad.
        for name, p in model.named_parameters():
            if p.requires_grad:
                node = p.expand_as(p).grad_fn.next_functions[0][0]
                node.register_hook(lambda inputs, outputs, name=name, p=p:
                                   note(f"wgrad: {name} {p.grad.storage().data_ptr()}"))
                found.setdefault("nodes", []).append(node)  # each parameter keeps this one node
        return original[2](recipe, model, grad_buffer)

    def exit_(meter, *exc):
        original[0](meter, *exc)
        found["events"] = from_tree(meter.profiler)
        return False

    R.Meter.__exit__, R.Meter.mark, R.make_optimizer = exit_, mark, make_optimizer
    torch.profiler.profile = lambda **kw: original[3](record_shapes=True, **kw)
    try:
        run = R.run(spec, a.seq, a.recompute, "eager", "cpu", 1, microbatches=a.microbatches,
                    recipe=a.recipe, loss_kernel=a.loss, logits_life=a.logits, train=train)
    finally:
        R.Meter.__exit__, R.Meter.mark, R.make_optimizer, torch.profiler.profile = original
    steps = measured_steps(found["events"], (f"forward {a.layer}", f"backward {a.layer}"))
    return {k: add_live(v, a.count_weight_grads) for k, v in steps.items()}, run


def memcalc_report(a, run):
    """(report or None, command, why not): memcalc's JSON with --ops for the run's settings."""
    if a.memcalc_json:
        return json.load(open(a.memcalc_json)), ["(read from " + a.memcalc_json + ")"], ""
    sys.path.insert(0, GPU)
    import compare
    command = compare.predict_command(a.memcalc, run, "cpu") + ["--ops"]
    if not os.access(a.memcalc, os.X_OK):
        sys.exit(f"op_live.py: no memcalc at {a.memcalc} (--memcalc PATH)")
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        if "--ops" in done.stderr:
            return None, command, f"this memcalc has no --ops ({done.stderr.strip()})"
        sys.exit(f"op_live.py: {' '.join(command)} failed: {done.stderr.strip()}")
    report = json.loads(done.stdout)
    if "ops" not in report.get("activations", {}):
        return None, command, "this memcalc's report has no activations.ops"
    return report, command, ""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--self-test", action="store_true", help="check the alignment logic and exit")
    ap.add_argument("--model", default="llama-tiny",
                    help="gpu/models/NAME.json (default llama-tiny)")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--recompute", choices=("none", "selective", "full", "op"), default="none")
    ap.add_argument("--layer", type=int, default=2,
                    help="the layer whose steps are compared, from 1 (default 2, or the last)")
    ap.add_argument("--train", choices=("full", "frozen", "lora"), default="full")
    ap.add_argument("--frozen", default="")
    ap.add_argument("--lora-rank", type=int, default=8)
    ap.add_argument("--lora-targets", default="q_proj,v_proj")
    ap.add_argument("--lora-dropout", type=float, default=0.05)
    ap.add_argument("--lora-dtype", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--recipe", default="mixed-adam", help="as replicate.py's --recipe")
    ap.add_argument("--microbatches", type=int, default=1,
                    help="micro-batches a step; the first one's steps are compared")
    ap.add_argument("--loss", default="fp32", help="as replicate.py's --loss")
    ap.add_argument("--logits", default="held", help="as replicate.py's --logits")
    ap.add_argument("--memcalc", default=os.path.join(ROOT, "build", "memcalc"))
    ap.add_argument("--memcalc-json", metavar="FILE",
                    help="memcalc's report (with activations.ops) read from FILE instead of run")
    ap.add_argument("--tolerance", type=int, default=0,
                    help="bytes by which an aligned pair's live may differ and still agree (0)")
    ap.add_argument("--small", type=int, default=SMALL, metavar="BYTES",
                    help="unmatched measured events of at most this many bytes are left out of the "
                         f"difference and folded in the table (default {SMALL}; 0: none)")
    ap.add_argument("--count-weight-grads", action="store_true",
                    help="count weight gradients in the measured live bytes (and align them)")
    ap.add_argument("--all", action="store_true",
                    help="list every event (default: unmatched measured ones of --small bytes "
                         "folded)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the tables")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 when memcalc gives no tape or a phase disagrees (beyond "
                         "--tolerance)")
    a = ap.parse_args(argv)
    if a.self_test:
        return self_test()

    sys.path.insert(0, HERE)
    from reference_trainer import Train
    try:
        train = Train.make(a.train, a.frozen, a.lora_rank, a.lora_targets, a.lora_dropout,
                           a.lora_dtype)
    except ValueError as e:
        ap.error(str(e))
    path = os.path.join(GPU, "models", a.model + ".json")
    spec = json.load(open(path))
    spec["path"] = os.path.relpath(path, ROOT)
    a.layer = max(1, min(a.layer, spec["layers"]))
    steps, run = measure(a, spec, train)
    report, command, why_not = memcalc_report(a, run)
    setting = (f"{a.model} s={a.seq} recompute {a.recompute} {train.label()}, layer {a.layer} of "
               f"{spec['layers']}")
    out = {"setting": setting, "memcalc_command": command, "why_no_tape": why_not or None,
           "caveats": CAVEATS, "phases": {}}
    lines = [f"{setting}: torch's profiler (CPU) beside memcalc's --ops tape",
             "memcalc: " + " ".join(os.path.relpath(c, ROOT) if c.startswith(ROOT) else c
                                    for c in command)]
    if why_not:
        lines.append(f"NOT COMPARED: {why_not}; the measured steps alone follow")
    for phase in ("forward", "backward"):
        step = f"{phase} {a.layer}"
        measured = steps[step]
        entry = {"step": step, "measured": measured}
        if report is None:
            lines += measured_only(phase, step, measured)
        else:
            start, events = model_phase(report["activations"]["ops"], phase)
            result = compare_phase(measured, events, a.tolerance, a.small)
            entry.update(memcalc_start=start, memcalc=events, **result)
            lines += text_phase(phase, step, measured, start, events, result, a.small, a.all)
        out["phases"][phase] = entry
    lines.append("caveats:")
    lines += [f"- {c}" for c in CAVEATS]
    if a.json:
        print(json.dumps(out, indent=1))
    else:
        print("\n".join(lines))
    disagree = [p for p, e in out["phases"].items() if e.get("first_disagreement")]
    return 1 if a.check and (why_not or disagree) else 0


# ---------------------------------------------------------------- self-test

def self_test():
    """The alignment, the tape's live bytes, the first disagreement and the profiler replay, on
    sequences built here. Exit 1 on a failure."""
    failures = []

    def check(what, got, want):
        if got != want:
            failures.append(f"{what}: got {got!r}, want {want!r}")

    # align: pairs of equal signed bytes, in order, weighted by bytes; None and opposite signs
    # never pair.
    check("align basic", align([100, 8, -100, 50], [100, 50]),
          [(0, 0), (1, None), (2, None), (3, 1)])
    check("align sign", align([100, -100], [-100]), [(0, None), (1, 0)])
    check("align none", align([None, 5], [None, 5]), [(None, 0), (0, None), (1, 1)])
    check("align weight", align([8, 8, 1000], [1000, 8, 8]),
          [(0, None), (1, None), (2, 0), (None, 1), (None, 2)])
    check("align empty", align([], [3]), [(None, 0)])
    check("align gap order", align([1, 2, 9], [3, 9]), [(None, 0), (0, None), (1, None), (2, 1)])

    # model_phase: forward from 0; backward from what its first event says; run changes nothing.
    tape = [("forward", "norm", "save", "fp32 x", 400, 400),
            ("forward", "mm", "alloc", "scratch", 50, 450),
            ("forward", "mm", "run", "out", 200, 450),
            ("forward", "mm", "free", "scratch", 50, 400),
            ("forward", "mm", "alloc", "out", 200, 600),
            ("backward", "mm", "alloc", "grad", 200, 1200),
            ("backward", "mm", "free", "out", 200, 1000)]
    ops = [dict(zip(("phase", "op", "event", "tensor", "bytes", "live"), t)) for t in tape]
    start, fwd = model_phase(ops, "forward")
    check("forward start", start, 0)
    check("forward deltas", [e["delta"] for e in fwd], [400, 50, 0, -50, 200])
    check("tokens", model_tokens(fwd),
          [(0, (400, False), 400), (1, (50, True), 450), (2, None, 450), (3, (-50, True), 400),
           (4, (200, False), 600)])
    start, bwd = model_phase(ops, "backward")
    check("backward start", start, 1000)
    check("backward rel", [e["rel"] for e in bwd], [200, 0])
    check("backward within", [e["within_step"] for e in bwd], [False, False])
    check("align tuples", align([(8, True), (8, False)], [(8, False)]), [(0, None), (1, 0)])

    # compare_phase: agrees while the unmatched cancel, then a measured allocation memcalc lacks
    # (a small unmatched one, 8 B, is left out of the difference unless small=0).
    def ev(n, within=False, counted=True):
        return {"bytes": n, "node": "", "op": "x", "shapes": "", "counted": counted,
                "within_step": within}
    measured = add_live([ev(400), ev(8), ev(50, True), ev(-50, True), ev(96), ev(200)])
    r = compare_phase(measured, fwd)
    check("pairs", (r["pairs"], r["pairs_agreeing"]), (4, 3))
    check("rows", [(row["measured"], row["model"]) for row in r["rows"]],
          [(0, 0), (1, None), (2, 1), (None, 2), (3, 3), (4, None), (5, 4)])
    check("diffs", [row.get("diff") for row in r["rows"]], [0, None, 0, None, 0, None, 96])
    check("first", r["first_disagreement"],
          {"row": 6, "diff": 96, "since_row": 4, "unmatched_rows": [5]})
    check("peaks", (r["measured_peak"], r["modelled_peak"], r["measured_end"], r["modelled_end"]),
          (704, 600, 704, 600))
    check("unmatched", (r["unmatched_measured"], r["unmatched_model"]), ([1, 4], [2]))
    check("tolerance", compare_phase(measured, fwd, 96)["first_disagreement"], None)
    check("small 0", compare_phase(measured, fwd, 0, 0)["first_disagreement"],
          {"row": 2, "diff": 8, "since_row": 0, "unmatched_rows": [1]})
    # a weight gradient is not counted, so not aligned either
    measured = add_live([ev(400), ev(200, counted=False)])
    check("kept is not temporary", compare_phase(add_live([ev(50)]), fwd)["pairs"], 0)
    measured[1]["weight_gradient"] = "w"
    measured = add_live(measured)
    check("wgrad live", [e["live"] for e in measured], [400, 400])
    check("wgrad counted", add_live([dict(e) for e in measured], True)[1]["live"], 600)

    # measured_steps: steps by marks, frees by address, weight gradients by their marks' addresses.
    mm = (("aten::mm", ((4, 4), (4, 4))),)
    to = (("aten::to", ((4, 4),)), ("aten::empty_strided", ()))
    node = (("autograd::engine::evaluate_function: MmBackward0", ()), ("MmBackward0", ())) + mm
    records = [
        ("mark", "mark: forward 1"),
        ("memory", 32, 0xA, mm),
        ("mark", "mark: forward 2"),
        ("memory", 64, 0xB, to),
        ("memory", 32, 0xC, to[:1]),
        ("memory", -32, 0xC, ()),
        ("mark", "mark: backward 2"),
        ("memory", 32, 0xC, node),                      # the address again: a new allocation
        ("mark", "wgrad: blocks.1.q.weight 12"),        # 0xC
        ("mark", "wgrad: blocks.1.k.weight 10"),        # 0xA: made in forward 1, not tagged
        ("memory", -32, 0xC, node[:1]),
        ("memory", -64, 0xB, ()),
        ("memory", -8, 0xD, ()),                        # made before profiling
    ]
    steps = measured_steps(records, ("forward 2", "backward 2"))
    f, b = steps["forward 2"], steps["backward 2"]
    check("forward events", [(e["bytes"], e["op"], e["shapes"]) for e in f],
          [(64, "to/empty_strided", "[[4,4]]"), (32, "to", "[[4,4]]"), (-32, "", "")])
    check("free made_by", (f[2]["made_by"], f[2]["made_in"]), ("to [[4,4]]", "forward 2"))
    check("backward events", [(e["bytes"], e["node"], e["op"], e["shapes"]) for e in b],
          [(32, "MmBackward0", "mm", "[[4,4],[4,4]]"), (-32, "MmBackward0", "", ""),
           (-64, "", "", ""), (-8, "", "", "")])
    check("forward within", [e["within_step"] for e in f], [False, True, True])
    check("backward within", [e["within_step"] for e in b], [True, True, False, False])
    check("wgrad tagged", b[0].get("weight_gradient"), "blocks.1.q.weight")
    check("wgrad free", (b[1].get("weight_gradient"), b[1]["made_in"]),
          ("blocks.1.q.weight", "backward 2"))
    check("free of an earlier step", (b[2]["made_in"], b[2]["made_by"]),
          ("forward 2", "to/empty_strided [[4,4]]"))
    check("free of before", (b[3]["made_in"], b[3]["made_by"]), ("before profiling", "?"))
    check("backward live", [e["live"] for e in add_live(b)], [0, 0, -64, -72])
    check("describe", describe(node), ("MmBackward0", "mm", "[[4,4],[4,4]]"))

    for f in failures:
        print("FAIL", f)
    print(f"op_live.py self-test: {'FAILED' if failures else 'passed'} ({len(failures)} failures)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
