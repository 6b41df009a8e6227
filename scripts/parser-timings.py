#!/usr/bin/env python3
"""Times the memcalc program on the large JSON inputs of issue 33, each at several sizes, so the CPU
seconds per MB show whether its readers are linear: a config.json of many keys, a model folder whose
model.safetensors.index.json has many weight_map entries, and one whose model.safetensors header is
tens of megabytes. Prints one row an input: its size, CPU seconds, seconds per MB, peak memory and
exit status, for memcalc and, with --baseline, another build beside it (killed at --timeout).

Usage: scripts/parser-timings.py [--memcalc build/memcalc] [--baseline OLD] [--timeout 60] [--quick]
"""
import argparse
import itertools
import os
import struct
import subprocess
import sys
import tempfile
import time

TINY_LLAMA = ('"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, '
              '"num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, '
              '"vocab_size": 100, "torch_dtype": "bfloat16", "max_position_embeddings": 64')


def tensor_name(i):
    """The i-th of a long list of names, as DeepSeek-V3's index writes them."""
    return f"model.layers.{i // 2048}.mlp.experts.{i % 2048}.down_proj.weight"


def write_lines(path, first, lines, last):
    """Writes a large JSON text a line at a time: this script stays small, and so does the peak
    memory a child inherits from it before exec."""
    with open(path, "w") as out:
        out.write(first)
        for i, line in enumerate(lines):
            out.write((",\n" if i else "\n") + line)
        out.write(last)
    return path


def write_config(folder, keys):
    """A config.json of a small LLaMA and `keys` keys more; returns its path."""
    os.makedirs(folder, exist_ok=True)
    lines = itertools.chain([TINY_LLAMA], (f'"k{i}": {i}' for i in range(keys)))
    return write_lines(os.path.join(folder, "config.json"), "{", lines, "}\n")


def write_index_folder(folder, entries):
    """A model folder: the small config and an index of `entries` tensors (no shards: the index
    alone)."""
    write_config(folder, 0)
    first = '{"metadata": {"total_size": %d}, "weight_map": {' % (128 * entries)
    shard = "model-00001-of-00002.safetensors"
    lines = (f'"{tensor_name(i)}": "{shard}"' for i in range(entries))
    path = write_lines(os.path.join(folder, "model.safetensors.index.json"), first, lines, "}}\n")
    return folder, os.path.getsize(path)


def write_header_folder(folder, tensors):
    """A model folder: the small config and model.safetensors with `tensors` BF16 [64] tensors laid
    end to end; the data is a hole of zeros, never written."""
    write_config(folder, 0)
    entry = '"%s":{"dtype":"BF16","shape":[64],"data_offsets":[%d,%d]}'
    lines = (entry % (tensor_name(i), 128 * i, 128 * i + 128) for i in range(tensors))
    text = write_lines(os.path.join(folder, "header.json"), "{", lines, "}")
    length = os.path.getsize(text)
    with open(os.path.join(folder, "model.safetensors"), "wb") as out, open(text, "rb") as header:
        out.write(struct.pack("<Q", length))
        while chunk := header.read(1 << 20):
            out.write(chunk)
        out.truncate(8 + length + 128 * tensors)
    os.remove(text)
    return folder, length


def run(program, path, timeout):
    """CPU seconds, peak memory (MB) and exit status ('timeout' if killed) of `program --config
    path`."""
    process = subprocess.Popen([program, "--config", path], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            process.kill()
            pid, status, usage = os.wait4(process.pid, 0)
            return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, "timeout"
        time.sleep(0.01)
    seconds = usage.ru_utime + usage.ru_stime
    return seconds, usage.ru_maxrss / 1024, str(os.waitstatus_to_exitcode(status))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--memcalc", default=os.path.join(here, "..", "build", "memcalc"))
    parser.add_argument("--baseline", help="another memcalc program to time beside it")
    parser.add_argument("--timeout", type=float, default=60, help="seconds before a run is killed")
    parser.add_argument("--quick", action="store_true", help="the smallest size of each input only")
    args = parser.parse_args()
    sizes = {"config keys": [150_000, 300_000, 600_000], "index entries": [25_000, 50_000, 100_000],
             "header tensors": [60_000, 211_250, 422_500, 845_000]}  # the last 100 MB: the limit
    programs = [("memcalc", args.memcalc)] + [("baseline", args.baseline)] * bool(args.baseline)
    columns = "".join(f" | {name:>8} CPU s   s/MB  peak MB  exit" for name, _ in programs)
    print(f"{'input':<24} {'MB':>7}{columns}")
    with tempfile.TemporaryDirectory() as scratch:
        for kind, counts in sizes.items():
            for count in counts[:1] if args.quick else counts:
                folder = os.path.join(scratch, f"{kind.split()[0]}-{count}")
                if kind == "config keys":
                    path = write_config(folder, count)
                    size = os.path.getsize(path)
                elif kind == "index entries":
                    path, size = write_index_folder(folder, count)
                else:
                    path, size = write_header_folder(folder, count)
                row = f"{count:>9,} {kind:<14} {size / 1e6:>7.1f}"
                for _, program in programs:
                    seconds, peak, status = run(program, path, args.timeout)
                    per_mb = seconds / (size / 1e6)
                    row += f" | {seconds:>14.2f} {per_mb:>6.3f} {peak:>8.0f} {status:>5}"
                print(row, flush=True)


if __name__ == "__main__":
    sys.exit(main())
