#!/usr/bin/python3
"""memcalc's allocator figures beside published runs that report allocated and reserved memory.

reserved.json lists the runs; only those whose configuration is complete (every setting memcalc needs
is in the source) are compared. Each such row below is the memcalc command its source describes; the
figure compared is the JSON's peak.reserved.loaded_allocated_bytes and loaded_bytes where the run
reports memory after the model is loaded (before its first step), else peak.bytes and
peak.reserved_bytes. Nothing is fitted to the published numbers.

  reserved.py [--memcalc build/memcalc]          prints the table (markdown)
  reserved.py [--memcalc build/memcalc] --check  fails where an error passes --tolerance (0.05)
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

# torchtune builds the model in bf16 (its dtype: bf16), adapters included; LoRA dropout 0.
TORCHTUNE_LORA = ["--recipe", "bf16-adam", "--train", "lora", "--lora-dtype", "bf16",
                  "--lora-dropout", "0", "--profile", "pytorch"]
COMMANDS = {
    # 3B_lora_single_device.yaml: rank 64 on q, v and output projections and the MLP.
    "torchtune-llama3.2-3b-lora-init": [
        "--model-file", "validation/published/models/llama-3.2-3b.json", "--seq", "2048",
        *TORCHTUNE_LORA, "--lora-rank", "64",
        "--lora-targets", "q_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"],
    # 7B_lora_single_device.yaml: rank 8 on q and v.
    "torchtune-llama2-7b-lora-init": [
        "--config", "tests/configs/llama-2-7b.json", "--seq", "2048", *TORCHTUNE_LORA,
        "--lora-rank", "8", "--lora-targets", "q_proj,v_proj"],
}
UNITS = {"GiB": 2**30, "GB": 10**9}


def unit_of(entry):
    return UNITS[entry["unit"].split()[0]]


def predict(memcalc, entry):
    args = COMMANDS[entry["id"]]
    out = subprocess.run([memcalc, *args, "--format", "json"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    peak = json.loads(out)["peak"]
    if entry["phase"].startswith("after model"):
        return peak["reserved"]["loaded_allocated_bytes"], peak["reserved"]["loaded_bytes"], args
    return peak["bytes"], peak["reserved_bytes"], args


def rows(memcalc):
    entries = json.loads((HERE / "reserved.json").read_text())["entries"]
    for e in entries:
        if e.get("complete") is not True:
            continue
        allocated, reserved, args = predict(memcalc, e)
        scale = unit_of(e)
        yield {"id": e["id"], "phase": e["phase"], "unit": e["unit"].split()[0],
               "published": (e["allocated_peak"], e["reserved_peak"]),
               "memcalc": (allocated / scale, reserved / scale),
               "error": (allocated / scale / e["allocated_peak"] - 1,
                         reserved / scale / e["reserved_peak"] - 1),
               "gap": (e["reserved_peak"] - e["allocated_peak"], (reserved - allocated) / scale),
               "command": "memcalc " + shlex.join(args)}


def table(found):
    lines = ["| id | phase | published allocated / reserved | memcalc allocated / reserved | error "
             "| reserved - allocated: published / memcalc | command |",
             "|---|---|---|---|---|---|---|"]
    for r in found:
        u = r["unit"]
        lines.append(
            f"| {r['id']} | {r['phase']} | {r['published'][0]:.2f} / {r['published'][1]:.2f} {u} "
            f"| {r['memcalc'][0]:.2f} / {r['memcalc'][1]:.2f} {u} "
            f"| {100 * r['error'][0]:+.1f}% / {100 * r['error'][1]:+.1f}% "
            f"| {r['gap'][0]:.2f} / {r['gap'][1]:.2f} {u} | `{r['command']}` |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memcalc", default="build/memcalc")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--tolerance", type=float, default=0.05)
    a = parser.parse_args()
    found = list(rows(str(Path(a.memcalc).resolve())))
    sys.stdout.write(table(found))
    if not found:
        sys.exit("reserved.py: no complete entry in reserved.json")
    worst = max(abs(e) for r in found for e in r["error"])
    print(f"\n{len(found)} complete runs; largest |error| {100 * worst:.1f}%")
    if a.check and worst > a.tolerance:
        sys.exit(f"reserved.py: an error passes the tolerance {a.tolerance}")


if __name__ == "__main__":
    main()
