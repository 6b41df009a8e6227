#!/usr/bin/env python3
"""Pipeline schedules run for real: the bytes each stage holds, measured, beside memcalc's --pp figures.

A LLaMA-style decoder (a model file of validation/gpu/models, built from gpu/replicate.py's Block in bf16)
is split over P ranks, one process each (torch.multiprocessing, gloo on localhost): stage 0 holds the
embedding, the last stage the final norm, the head and the fp32 loss, each stage L / P layers, or the first
and the last their own counts (--first-stage-layers, --last-stage-layers) and the others the rest evenly. Activations
go forward and gradients back with point-to-point sends; a sent activation is freed once its send is done,
as Megatron-LM's deallocate_output_tensor does, and backward then runs on the autograd graph alone.

Schedules, each rank running its list of passes in order:
  1f1b   PipeDream-Flush as Megatron-LM's forward_backward_pipelining_without_interleaving orders it:
         min(P - k - 1, M) warm-up forwards, then one forward and one backward, then the cool-down backwards.
  interleaved  Megatron-LM's interleaved 1F1B (--vpp V chunks a rank, chunk c the (c P + k)-th stage of the
         model): 2 (P - k - 1) + (V - 1) P warm-up forwards, then one forward and one backward, then the
         cool-down, each pass on the chunk and micro-batch Megatron-LM's order gives it.
  zb-h1  Qi et al. 2024's ZB-H1, in the order of the authors' DeepSpeed schedule (ZeroBubbleH1Pipeline with
         exact semantics): P - k - 1 warm-up forwards; k times a forward and an input-gradient pass B whose
         weight-gradient pass W waits; then forward, B and the oldest waiting W; then B and W; then the W
         still waiting. Stage 0 runs whole backwards. Every linear of the layers is a DeferredLinear: its
         backward computes the input's gradient alone and queues (input, output's gradient) for W; the
         norms take their weights' gradients in B. The head's linear is not deferred (memcalc counts the
         layers' W reads only).

Each rank runs one step as a warm-up (gradients exist from there on and are kept, memcalc's
--grad-buffer persistent), then one measured step: gpu/replicate.py's Meter replays the profiler's record
of every allocation and free, so the peak is the most bytes of live tensors at any point of the step,
and `before` what lived before it (weights and gradients). There is no optimizer step; memcalc's figure
compared is its peak less its persistent state (weights, gradients, master copy, optimizer state), its
peak step being a forward or backward one. `in_flight` is the most micro-batches a rank held at once
(forward run, backward or deferred W not yet), counted by the schedule as it ran.

  /usr/bin/python3 validation/pipeline_schedules.py --memcalc BUILD/memcalc \\
      --out validation/results/cpu-pipeline-schedules.json
  /usr/bin/python3 validation/pipeline_schedules.py --table validation/results/cpu-pipeline-schedules.json
  /usr/bin/python3 validation/pipeline_schedules.py --committed validation/results/cpu-pipeline-schedules.json \\
      --memcalc BUILD/memcalc --check          # memcalc now beside the committed measurements
"""
import argparse
import collections
import gc
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd import Variable
from torch.utils.checkpoint import checkpoint

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "gpu"))
from replicate import DTYPE, Block, Meter, Model, RMSNorm, cpu_name  # noqa: E402


@torch.no_grad()  # x requires grad: outside no_grad the product would join (and keep) the graph
def accumulate_weight_gradient(weight, x, g):
    """W of one linear: g^T x over every token, added to the weight's gradient."""
    grad = g.reshape(-1, g.shape[-1]).t() @ x.reshape(-1, x.shape[-1])
    if weight.grad is None:
        weight.grad = grad
    else:
        weight.grad.add_(grad)


class WeightPassQueue:
    """What deferred W passes read: per micro-batch, in B's order, each linear's weight, input and output's
    gradient. While `defer` is off (a whole backward) each W runs in B, as nn.Linear's backward does."""

    def __init__(self):
        self.defer = False
        self.open, self.waiting = [], collections.deque()
        self.most_read = 0  # the most bytes one micro-batch's W read: each storage once


    def put(self, weight, x, g):
        if self.defer:
            self.open.append((weight, x, g))
        else:
            accumulate_weight_gradient(weight, x, g)

    def close(self):
        """One micro-batch's B has ended: its reads wait for its W."""
        if self.open:
            self.waiting.append(self.open)
            self.open = []

    def run_oldest(self):
        """W of the micro-batch that has waited longest; then its reads go."""
        if self.waiting:
            reads = self.waiting.popleft()
            storages = {t.storage().data_ptr(): t.storage().nbytes() for _, x, g in reads for t in (x, g)}
            self.most_read = max(self.most_read, sum(storages.values()))
            for weight, x, g in reads:
                accumulate_weight_gradient(weight, x, g)


class DeferredLinearFunction(torch.autograd.Function):
    """y = x W^T, whose backward returns x's gradient alone and hands (x, dy) to the queue for W."""

    @staticmethod
    def forward(ctx, x, weight, queue):
        ctx.save_for_backward(x)
        # The parameter itself, not a saved tensor: under checkpoint a saved one unpacks as a detached alias,
        # whose .grad would be lost.
        ctx.weight, ctx.queue = weight, queue
        return F.linear(x, weight)

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        # Detached: x's autograd node would keep the graph above it, and the stage's input, alive until W.
        ctx.queue.put(ctx.weight, x.detach(), g)
        return g @ ctx.weight, None, None


class DeferredLinear(nn.Module):
    def __init__(self, linear, queue):
        super().__init__()
        assert linear.bias is None, "DeferredLinear: bias-free linears only"
        self.weight, self.queue = linear.weight, queue

    def forward(self, x):
        return DeferredLinearFunction.apply(x, self.weight, self.queue)


LINEARS = ("q", "k", "v", "o", "gate", "up", "down")


class Stage(nn.Module):
    """One rank's part of the model: the embedding on the first, the final norm, head and loss on the last."""

    def __init__(self, spec, layers, first, last, recompute, queue=None):
        super().__init__()
        h, V = spec["hidden"], spec["vocab"]
        self.spec, self.recompute, self.last = spec, recompute, last
        self.embed = nn.Embedding(V, h) if first else None
        self.blocks = nn.ModuleList(Block(spec, "eager", "none") for _ in range(layers))
        if queue is not None:
            for block in self.blocks:
                for name in LINEARS:
                    if getattr(block, name, None) is not None:
                        setattr(block, name, DeferredLinear(getattr(block, name), queue))
        self.norm = RMSNorm(h) if last else None
        self.head = nn.Linear(h, V, bias=False) if last else None

    def forward(self, x, ids):
        if self.embed is not None:
            x = self.embed(ids)
        s = x.shape[1]
        # Per micro-batch, as transformers' LlamaModel makes them: rotary cos and sin, the additive causal mask.
        cos, sin = Model.rotary(types.SimpleNamespace(spec=self.spec), s, x.device, DTYPE)
        mask = torch.full((s, s), float("-inf"), dtype=x.dtype).triu(1)
        for block in self.blocks:
            if self.recompute == "full":
                x = checkpoint(block, x, mask, cos, sin, None, use_reentrant=False)[0]
            else:
                x = block(x, mask, cos, sin)[0]
        if not self.last:
            return x
        logits = self.head(self.norm(x))  # freed once the loss has it: only the loss is kept
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), ids.view(-1))


def one_f_one_b(P, k, M, V=1):
    """Megatron-LM's order: (pass, chunk, micro-batch), 'B' a whole backward."""
    warm = min(P - k - 1, M)
    passes = [("F", 0, j) for j in range(warm)]
    for i in range(M - warm):
        passes += [("F", 0, warm + i), ("B", 0, i)]
    return passes + [("B", 0, j) for j in range(M - warm, M)]


def interleaved(P, k, M, V):
    """Megatron-LM's interleaved order (forward_backward_pipelining_with_interleaving): V model chunks a
    rank, chunk c the (c P + k)-th of the model; 2 (P - k - 1) + (V - 1) P warm-up forwards, then one
    forward and one backward, then the cool-down; forward i runs chunk (i // P) % V, backward i the
    chunk V - 1 - (i // P) % V, each on micro-batch (i // (P V)) P + i % P."""
    assert M % P == 0, "interleaved: micro-batches a multiple of the pipeline's size (Megatron-LM's condition)"
    total = M * V
    # As Megatron-LM's core has it now (microbatch_group_size_per_vp_stage = P). Older versions ran every
    # forward first where M = P, so that each rank held M V chunks.
    warm = min(2 * (P - k - 1) + (V - 1) * P, total)
    step = lambda i, forward: ("F" if forward else "B", (i // P) % V if forward else V - 1 - (i // P) % V,
                               (i // (P * V)) * P + i % P)
    passes = [step(i, True) for i in range(warm)]
    for i in range(total - warm):
        passes += [step(warm + i, True), step(i, False)]
    return passes + [step(i, False) for i in range(total - warm, total)]


def zb_h1(P, k, M, V=1):
    """The ZB-H1 authors' DeepSpeed order (ZeroBubbleH1Pipeline, exact semantics): 'Bi' an input-gradient
    pass whose W waits, 'W' the oldest waiting W, 'B' a whole backward (stage 0's)."""
    passes, forward, backward, weight = [], 0, 0, 0
    for _ in range(P - k - 1):  # F section
        if forward < M:
            passes.append(("F", 0, forward))
            forward += 1
    for _ in range(k):  # FB section: W deferred
        if forward < M:
            passes += [("F", 0, forward), ("Bi", 0, backward)]
            forward += 1
            backward += 1
    while forward < M:  # FBW section
        passes.append(("F", 0, forward))
        passes += [("B", 0, backward)] if k == 0 else [("Bi", 0, backward), ("W", 0, None)]
        forward, backward, weight = forward + 1, backward + 1, weight + 1
    while backward < M:  # BW section
        passes += [("B", 0, backward)] if k == 0 else [("Bi", 0, backward), ("W", 0, None)]
        backward, weight = backward + 1, weight + 1
    while weight < M:  # W section
        passes.append(("W", 0, None))
        weight += 1
    return passes


SCHEDULES = {"1f1b": one_f_one_b, "zb-h1": zb_h1, "interleaved": interleaved}


class Links:
    """Point-to-point sends in Megatron-LM's order. Gloo's send is done once the receiver has posted its
    receive. With one chunk a rank, an activation's send is waited on at once (send_forward), and the output
    freed; a gradient's goes on a thread and is waited on after the next activation is received
    (send_backward_recv_forward), or at once where no forward is left (send_backward in the cool-down). A rank
    blocks only on a receive its neighbour posts in that same order, so these schedules cannot deadlock.
    The interleaved schedule's ranks form a ring (the last stage feeds chunk c + 1 on the first): there every
    send goes on a thread, and is waited on (the output freed) at the next poll once done. Tags keep each
    chunk's activations and gradients apart."""

    def __init__(self, ring):
        self.ring = ring
        self.pending = []

    def send_activation(self, tensor, to, tag):
        if not self.ring:
            dist.send(tensor, to, tag=tag)
            free_storage(tensor)
        else:
            self.send(tensor, to, tag, lambda: free_storage(tensor))

    def send_gradient(self, tensor, to, tag, now=False):
        self.send(tensor, to, tag)
        if now and not self.ring:
            self.wait()

    def send(self, tensor, to, tag, done=None):
        finished = threading.Event()

        def wait(work):
            work.wait()
            del work  # the work's own reference goes on that thread; the last one is dropped on this one
            finished.set()

        waiter = threading.Thread(target=wait, args=(dist.isend(tensor, to, tag=tag),))
        waiter.start()
        self.pending.append((waiter, finished, tensor, done))

    def recv(self, shape, source, tag):
        t = torch.empty(shape, dtype=DTYPE)
        dist.recv(t, source, tag=tag)
        if self.ring:
            self.poll()
        else:
            self.wait()
        return t

    def poll(self):
        left = []
        for waiter, finished, tensor, done in self.pending:
            if finished.is_set():
                waiter.join()
                if done:
                    done()
            else:
                left.append((waiter, finished, tensor, done))
        self.pending = left

    def wait(self):
        for waiter, finished, tensor, done in self.pending:
            waiter.join()
            if done:
                done()
        self.pending = []


def free_storage(t):
    """Megatron-LM's deallocate_output_tensor: the sent output's data goes, its autograd node stays."""
    t.data = torch.empty((1,), dtype=t.dtype)


def run_step(chunks, passes, queue, links, rank, P, M, spec, seq, micro_batch, meter=None):
    """One step of the schedule on this rank (`chunks`: its model chunks, chunk c the (c P + rank)-th stage of
    the model). Returns the most chunk-micro-batches held at once."""
    V = len(chunks)
    shape = (micro_batch, seq, spec["hidden"])
    mark = meter.mark if meter else (lambda name: None)
    previous, following = (rank - 1) % P, (rank + 1) % P
    # Tags: 2 c for the activations chunk c receives, 2 c + 1 for its gradients.
    received_by_next = lambda c: c + (rank == P - 1)
    received_by_previous = lambda c: c - (rank == 0)

    def probe(name):  # a step with no allocation in it: its bytes are those live here
        mark(name)
        mark("send/receive")

    held, waiting_w, in_flight, most = {}, collections.deque(), set(), 0
    forwards_left = sum(kind == "F" for kind, _, _ in passes)
    for kind, c, j in passes:
        stage_id = c * P + rank
        first, last = stage_id == 0, stage_id == P * V - 1
        name = f"{kind}{'' if j is None else j}" + (f"c{c}" if V > 1 else "")
        if links.ring:
            links.poll()
        if kind == "F":
            forwards_left -= 1
            ids = torch.randint(0, spec["vocab"], (micro_batch, seq), generator=torch.Generator().manual_seed(j)) \
                if first or last else None
            x = None if first else links.recv(shape, previous, 2 * c).requires_grad_()
            mark(name)
            out = chunks[c](x, ids)
            if last:
                out = out / M
            else:
                links.send_activation(out, following, 2 * received_by_next(c))
            held[c, j] = (x, out)
            del x, out, ids
            in_flight.add((c, j))
            most = max(most, len(in_flight))
            probe("after " + name)
        elif kind in ("B", "Bi"):
            x, out = held.pop((c, j))
            g = torch.ones_like(out) if last else links.recv(shape, following, 2 * c + 1)
            mark(name)
            queue.defer = kind == "Bi"
            Variable._execution_engine.run_backward((out,), (g,), False, False, (), True, True)
            queue.close()
            if not first:
                links.send_gradient(x.grad, previous, 2 * received_by_previous(c) + 1, now=forwards_left == 0)
            del x, out, g
            if kind == "B":
                in_flight.discard((c, j))
            else:
                waiting_w.append((c, j))
            probe("after " + name)
        else:  # W
            name = f"W{waiting_w[0][1]}"
            mark(name)
            queue.run_oldest()
            in_flight.discard(waiting_w.popleft())
            probe("after " + name)
    links.wait()
    assert not held and not waiting_w and not queue.waiting
    return most


def stage_layer_counts(L, P, first, last):
    """Each rank's layers, as memcalc's --first-stage-layers and --last-stage-layers split them (Megatron-LM's
    uneven stages): the first and the last rank as given (0: an even share), the others the rest evenly.
    Interleaved, a rank's layers run as V equal chunks."""
    fixed = (first != 0) + (last != 0)
    middle = (L - first - last) // (P - fixed) if P > fixed else 0
    counts = [middle] * P
    if first:
        counts[0] = first
    if last:
        counts[-1] = last
    assert sum(counts) == L, f"{first} + {last} and {P - fixed} even stages do not make {L} layers"
    return counts


def worker(rank, P, config, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=P)
    spec, seq, b, M, V = config["spec"], config["seq"], config["micro_batch"], config["microbatches"], config["vpp"]
    layers = stage_layer_counts(spec["layers"], P, config.get("first", 0), config.get("last", 0))[rank] // V
    torch.manual_seed(rank)
    queue = WeightPassQueue()
    deferred = config["schedule"] == "zb-h1"
    chunks = [Stage(spec, layers, c * P + rank == 0, c * P + rank == P * V - 1, config["recompute"],
                    queue if deferred else None).to(DTYPE) for c in range(V)]
    passes = SCHEDULES[config["schedule"]](P, rank, M, V)
    links = Links(ring=V > 1)
    run_step(chunks, passes, queue, links, rank, P, M, spec, seq, b)  # warm-up: the gradients exist from here on
    dist.barrier()
    gc.collect()
    # Every gradient as a Python tensor, so that the Meter's count of what lives before the step finds it.
    parameters = [p for chunk in chunks for p in chunk.parameters()]
    gradients = [p.grad for p in parameters if p.grad is not None]
    assert len(gradients) == len(parameters), "a parameter without a gradient after the warm-up"
    with Meter("cpu") as meter:
        most = run_step(chunks, passes, queue, links, rank, P, M, spec, seq, b, meter)
    dist.barrier()
    del gradients
    peak, peak_step = meter.peak()
    live_after = {s["step"]: s["max_bytes"] - meter.before for s in meter.steps if s["step"].startswith("after ")}
    result = {"stage": rank, "layers": layers * V,
              "passes": " ".join(k + ("" if j is None else str(j)) + (f"c{c}" if V > 1 else "") for k, c, j in passes),
              "in_flight": most, "weight_pass_read_bytes": queue.most_read, "memory_before_step": meter.before,
              "peak_bytes": peak, "peak_step": peak_step, "peak_activation_bytes": peak - meter.before,
              "live_after": live_after}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(config, P):
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(worker, args=(P, config, free_port(), out_dir), nprocs=P, join=True)
        return [json.load(open(os.path.join(out_dir, f"rank{k}.json"))) for k in range(P)]


def memcalc_command(memcalc, model_file, config, P):
    return [memcalc, "--model-file", model_file, "--seq", str(config["seq"]), "--micro-batch", str(config["micro_batch"]),
            "--pp", str(P), "--microbatches", str(config["microbatches"]), "--schedule", config["schedule"],
            *(["--vpp", str(config["vpp"])] if config["vpp"] > 1 else []),
            *(["--first-stage-layers", str(config["first"])] if config.get("first") else []),
            *(["--last-stage-layers", str(config["last"])] if config.get("last") else []),
            "--recompute", config["recompute"], "--activations", "architecture", "--attention", "eager",
            "--platform", "cpu", "--grad-buffer", "persistent", "--logits", "freed", "--format", "json"]


def predict(memcalc, key, model_file, config, P, run):
    """memcalc's per-rank figures for one run, under `key` in each rank's row."""
    command = memcalc_command(os.path.abspath(memcalc), model_file, config, P)
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        sys.exit(f"pipeline_schedules.py: {' '.join(command)} failed: {done.stderr.strip()}")
    report = json.loads(done.stdout)
    run[key + "_command"] = " ".join(["memcalc"] + command[1:])
    for measured, predicted in zip(run["ranks"], report["ranks"]):
        activation = predicted["peak"]["bytes"] - predicted["state"]["bytes"]
        measured[key] = {"in_flight": predicted["in_flight"], "peak_bytes": predicted["peak"]["bytes"],
                         "peak_step": predicted["peak"]["step"], "state_bytes": predicted["state"]["bytes"],
                         "peak_activation_bytes": activation, "minus_measured": activation - measured["peak_activation_bytes"],
                         **({"by_category": predicted["peak"]["by_category"]} if "by_category" in predicted["peak"] else {})}


def in_flight_agrees(results):
    """Whether every rank held as many micro-batches (chunks) at once as memcalc says; the others named."""
    wrong = [f"pp {run['pp']} {run['schedule']} recompute {run['recompute']} stage {r['stage']}: "
             f"{r['in_flight']} in flight, memcalc {r['memcalc']['in_flight']}"
             for run in results["runs"] for r in run["ranks"] if r["in_flight"] != r["memcalc"]["in_flight"]]
    for line in wrong:
        print("pipeline_schedules.py: " + line, file=sys.stderr)
    return not wrong


def bytes_agree(results, percent):
    """Whether every 1F1B and interleaved rank without recomputation is within `percent` of memcalc's activation
    bytes (the cases memcalc follows closely; ZB-H1 leans high by design, recomputation's figures low: see
    validation/README.md); the others named."""
    wrong = [f"pp {run['pp']} {run['schedule']} stage {r['stage']} ({r['layers']} layers): measured "
             f"{r['peak_activation_bytes']} B, memcalc {r['memcalc']['peak_activation_bytes']} B"
             for run in results["runs"] if run["schedule"] in ("1f1b", "interleaved") and run["recompute"] == "none"
             for r in run["ranks"]
             if abs(r["memcalc"]["minus_measured"]) > percent / 100 * r["peak_activation_bytes"]]
    for line in wrong:
        print("pipeline_schedules.py: " + line, file=sys.stderr)
    return not wrong


def table(results):
    """The runs as a Markdown table: per rank, micro-batches in flight and activation bytes at the peak."""
    baseline = any("memcalc_baseline" in r for run in results["runs"] for r in run["ranks"])
    head = "| P | schedule | recompute | stage | in flight (memcalc) | measured MiB | memcalc MiB | memcalc - measured |"
    lines = [head + (" baseline MiB |" if baseline else ""), "|" + "---|" * (head.count("|") - 1 + baseline)]
    for run in results["runs"]:
        for r in run["ranks"]:
            m = r.get("memcalc", {})
            line = (f"| {run['pp']} | {run['schedule']} | {run['recompute']} | {r['stage']} | {r['in_flight']} "
                    f"({m.get('in_flight', '-')}) | {r['peak_activation_bytes'] / 2**20:.3f} | "
                    f"{m.get('peak_activation_bytes', 0) / 2**20:.3f} | {m.get('minus_measured', 0) / 2**20:+.3f} "
                    f"({100 * m.get('minus_measured', 0) / r['peak_activation_bytes']:+.1f}%) |")
            if baseline:
                line += f" {r.get('memcalc_baseline', {}).get('peak_activation_bytes', 0) / 2**20:.3f} |"
            lines.append(line)
    return "\n".join(lines)


def weight_pass_reads(spec, tokens):
    """One layer's W reads as memcalc's rule counts them: every linear's output gradient and input, bf16,
    an input once for the linears reading it (q, k and v share theirs, as gate and up do)."""
    h, a, kv, f = spec["hidden"], spec["heads"], spec.get("kv_heads", spec["heads"]), spec["ffn"]
    d = h // a
    sides = [(h, a * d), (0, kv * d), (0, kv * d), (a * d, h), (h, f), (0, f), (f, h)]
    return sum(i + o for i, o in sides) * tokens * 2


def checks_pass(a, result):
    in_flight = in_flight_agrees(result)
    return in_flight and (a.max_error is None or bytes_agree(result, a.max_error))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.path.join(HERE, "gpu", "models", "llama-pipeline.json"))
    ap.add_argument("--pp", nargs="+", type=int, default=[2, 4])
    ap.add_argument("--schedules", nargs="+", choices=tuple(SCHEDULES), default=list(SCHEDULES))
    ap.add_argument("--recompute", nargs="+", choices=("none", "full"), default=["none", "full"])
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--vpp", type=int, default=2, help="model chunks a rank under the interleaved schedule (default 2)")
    ap.add_argument("--first-stage-layers", type=int, default=0, help="layers of the first rank (0: an even share)")
    ap.add_argument("--last-stage-layers", type=int, default=0, help="layers of the last rank (0: an even share)")
    ap.add_argument("--memcalc", help="memcalc binary: its per-rank figures beside each run")
    ap.add_argument("--memcalc-baseline", metavar="MEMCALC", help="another memcalc's figures beside (memcalc_baseline)")
    ap.add_argument("--out", help="results JSON")
    ap.add_argument("--table", metavar="RESULTS", help="print a results JSON as a Markdown table, measuring nothing")
    ap.add_argument("--committed", metavar="RESULTS", help="with --memcalc: its figures beside a results JSON's "
                                                           "measurements, measuring nothing")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 where a rank's micro-batches in flight differ from memcalc's (its bytes are printed)")
    ap.add_argument("--max-error", type=float, metavar="PERCENT",
                    help="with --check: also exit 1 where a 1F1B or interleaved rank without recomputation is further "
                         "than PERCENT from memcalc's activation bytes")
    a = ap.parse_args(argv)
    if a.table:
        print(table(json.load(open(a.table))))
        return
    if a.committed:
        if not a.memcalc:
            ap.error("--committed needs --memcalc")
        result = json.load(open(a.committed))
        for run in result["runs"]:
            config = {"spec": json.load(open(os.path.join(ROOT, result["model_file"]))), "seq": run["seq"],
                      "micro_batch": run["micro_batch"], "microbatches": run["microbatches"],
                      "schedule": run["schedule"], "recompute": run["recompute"], "vpp": run.get("vpp", 1),
                      "first": run.get("first_stage_layers", 0), "last": run.get("last_stage_layers", 0)}
            predict(a.memcalc, "memcalc", result["model_file"], config, run["pp"], run)
        print(table(result))
        sys.exit(1 if a.check and not checks_pass(a, result) else 0)
    spec = json.load(open(a.model))
    model_file = os.path.relpath(os.path.abspath(a.model), ROOT)
    result = {"date": time.strftime("%Y-%m-%d"), "device_name": cpu_name(), "torch": torch.__version__,
              "model_file": model_file, "command": " ".join(["/usr/bin/python3", "validation/pipeline_schedules.py"] +
                                                            (argv if argv is not None else sys.argv[1:])),
              "runs": []}
    for P in a.pp:
        for schedule in a.schedules:
            for recompute in a.recompute:
                config = {"spec": spec, "seq": a.seq, "micro_batch": a.micro_batch, "microbatches": a.microbatches,
                          "schedule": schedule, "recompute": recompute, "vpp": a.vpp if schedule == "interleaved" else 1,
                          "first": a.first_stage_layers, "last": a.last_stage_layers}
                start = time.time()
                ranks = measure(config, P)
                run = {"pp": P, "vpp": config["vpp"], "first_stage_layers": a.first_stage_layers,
                       "last_stage_layers": a.last_stage_layers, "schedule": schedule, "recompute": recompute, "seq": a.seq, "micro_batch": a.micro_batch,
                       "microbatches": a.microbatches, "seconds": round(time.time() - start, 1),
                       "memcalc_rule_weight_pass_reads_per_layer": weight_pass_reads(spec, a.seq * a.micro_batch), "ranks": ranks}
                for key, memcalc in (("memcalc", a.memcalc), ("memcalc_baseline", a.memcalc_baseline)):
                    if memcalc:
                        predict(memcalc, key, model_file, config, P, run)
                result["runs"].append(run)
                for r in ranks:
                    m = r.get("memcalc", {})
                    print(f"pp {P} {schedule:6} recompute {recompute:4} stage {r['stage']}: in flight {r['in_flight']}"
                          f" (memcalc {m.get('in_flight', '-')}), activations {r['peak_activation_bytes'] / 2**20:8.3f} MiB"
                          f" at {r['peak_step']:10} memcalc {m.get('peak_activation_bytes', 0) / 2**20:8.3f} MiB"
                          f" at {m.get('peak_step', '-')}", flush=True)
                if a.out:
                    with open(a.out, "w") as f:
                        json.dump(result, f, indent=1)
    if a.check and not checks_pass(a, result):
        sys.exit(1)


if __name__ == "__main__":
    main()
