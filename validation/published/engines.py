#!/usr/bin/python3
"""memcalc's KV cache as a serving engine sizes it, beside the engines' own log lines.

engines.json lists published logs (the engine's version, model, GPU and settings, and what it
printed); those whose configuration is complete and whose model memcalc reads are compared here:
the KV cache's blocks (vLLM's "# GPU blocks", or its cache size in GiB over the block's bytes) and
each term the engine printed beside memcalc's. The command of each row is what its source
describes; nothing is fitted to the printed figures.

  engines.py [--memcalc build/memcalc]          prints the table (markdown)
  engines.py [--memcalc build/memcalc] --check  fails where the blocks' error passes --tolerance
Standard library only.
"""
import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
GIB = 2**30

LLAMA31_8B = ["--model-file", "validation/published/models/llama-3.1-8b-instruct.json"]
# vllm#10517: v0.6.4's log format, an RTX 3090, utilization 0.9, --max-model-len as given.
COMMANDS = {
    "vllm-10517-llama31-8b-20k": [*LLAMA31_8B, "--engine", "vllm", "--engine-version", "0.6",
                                  "--gpu", "rtx-3090", "--gpu-memory-utilization", "0.9",
                                  "--max-model-len", "20000"],
    "vllm-10517-llama31-8b-29k": [*LLAMA31_8B, "--engine", "vllm", "--engine-version", "0.6",
                                  "--gpu", "rtx-3090", "--gpu-memory-utilization", "0.9",
                                  "--max-model-len", "29000"],
}
# What each complete entry printed: blocks, and the terms in GiB as the engine names them.
PRINTED = {
    "vllm-10517-llama31-8b-20k": {"blocks": 1952, "weights": 14.9888, "torch_peak": 17.06,
                                  "non_torch": 0.35, "kv": 3.81},
    "vllm-10517-llama31-8b-29k": {"blocks": 1478, "weights": 14.9888, "torch_peak": 17.98,
                                  "non_torch": 0.35, "kv": 2.89},
}


def predict(memcalc, entry_id):
    args = ["serve", *COMMANDS[entry_id]]
    out = subprocess.run([memcalc, *args, "--format", "json"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    engine = json.loads(out)["engine"]
    terms = {t["name"]: t["bytes"] / GIB for t in engine["terms"]}
    return engine, terms, "memcalc " + shlex.join(args)


def rows(memcalc):
    entries = json.loads((HERE / "engines.json").read_text())["entries"]
    for e in entries:
        if e["id"] not in COMMANDS:
            continue
        engine, terms, command = predict(memcalc, e["id"])
        printed = PRINTED[e["id"]]
        yield {"id": e["id"], "engine": f"{engine['name']} {engine['version']}",
               "printed": printed, "memcalc": engine, "terms": terms,
               "error": engine["blocks"] / printed["blocks"] - 1, "command": command}


def table(found):
    lines = ["| id | engine | weights GiB | activation peak GiB | non-torch GiB | KV cache GiB "
             "| blocks | error | command |", "|---|---|---|---|---|---|---|---|---|"]
    for r in found:
        p, t = r["printed"], r["terms"]
        lines.append(
            f"| {r['id']} | {r['engine']} | {p['weights']:.2f} / {t['weights']:.2f} "
            f"| {p['torch_peak'] - p['weights']:.2f} / {t['activation_peak']:.2f} "
            f"| {p['non_torch']:.2f} / {t['non_torch']:.2f} "
            f"| {p['kv']:.2f} / {r['memcalc']['kv_cache_bytes'] / GIB:.2f} "
            f"| {p['blocks']} / {r['memcalc']['blocks']} | {100 * r['error']:+.1f}% "
            f"| `{r['command']}` |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memcalc", default="build/memcalc")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--tolerance", type=float, default=0.02)
    a = parser.parse_args()
    found = list(rows(str(Path(a.memcalc).resolve())))
    sys.stdout.write("Each cell: printed / memcalc.\n\n" + table(found))
    if not found:
        sys.exit("engines.py: no complete entry of engines.json that memcalc reads")
    worst = max(abs(r["error"]) for r in found)
    print(f"\n{len(found)} complete logs; largest |error| in blocks {100 * worst:.1f}%")
    if a.check and worst > a.tolerance:
        sys.exit(f"engines.py: an error passes the tolerance {a.tolerance}")


if __name__ == "__main__":
    main()
