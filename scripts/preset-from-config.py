#!/usr/bin/env python3
"""Writes presets/NAME.json from a HuggingFace config.json, through memcalc's own importer.

Usage: scripts/preset-from-config.py CONFIG NAME PUBLISHED_COUNT "SOURCE" "DESCRIPTION" [--memcalc build/memcalc]
           [--set key=value ...]
The preset keeps only the keys that differ from memcalc's defaults; --set adds or overrides one
(e.g. --set max_positions=2048 for a model whose config gives none). It refuses to write a preset
whose computed count differs from PUBLISHED_COUNT.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
parser = argparse.ArgumentParser()
parser.add_argument("config")
parser.add_argument("name")
parser.add_argument("published", type=int)
parser.add_argument("source")
parser.add_argument("description")
parser.add_argument("--memcalc", default=os.path.join(root, "build", "memcalc"))
parser.add_argument("--set", action="append", default=[])
args = parser.parse_args()

run = subprocess.run([args.memcalc, "--config", args.config, "--seq", "1", "--format", "json"],
                     capture_output=True, text=True)
if run.returncode != 0:
    sys.exit(run.stderr.strip())
report = json.loads(run.stdout)
model = report["model"]
if report["parameters"]["total"] != args.published:
    sys.exit(f"{args.config}: memcalc counts {report['parameters']['total']}, not the published {args.published}")

defaults = {"kv_heads": model["heads"], "head_dim": model["hidden"] // model["heads"], "mlp": "gated",
            "norm": "rmsnorm", "bias": "none", "position": "rotary", "tied_embeddings": False, "experts": 0,
            "experts_per_token": 0, "position_rows": model["max_positions"] if model["position"] == "learned" else 0,
            "activation": "silu" if model["mlp"] == "gated" else "gelu_tanh", "norms_per_layer": 2,
            "parallel_attention": False, "embedding_norm": False, "attention_dropout": 0, "hidden_dropout": 0,
            "max_positions": 0, "softmax_fp32": True, "head_bias": False}
# Every other key's default is what memcalc gives a model file that leaves it out (program facts,
# mixer widths): read from a minimal model rather than listed here, so a new key needs no entry.
SHAPE_KEYS = {"hidden", "layers", "heads", "ffn", "vocab"}
minimal = {"name": "defaults", "hidden": 64, "layers": 1, "heads": 4, "ffn": 128, "vocab": 128}
with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
    json.dump(minimal, f)
    f.flush()
    run = subprocess.run([args.memcalc, "--model-file", f.name, "--seq", "1", "--format", "json"],
                         capture_output=True, text=True)
if run.returncode != 0:
    sys.exit(run.stderr.strip())
for key, value in json.loads(run.stdout)["model"].items():
    if key not in SHAPE_KEYS:
        defaults.setdefault(key, value)
preset = {"name": args.name, "description": args.description, "source": args.source,
          "published_parameters": args.published}
for key, value in model.items():
    if key != "name" and (key not in defaults or defaults[key] != value):
        preset[key] = value
# A layer kind names only the fields it sets (null: the model's).
for kind in preset.get("layer_kinds", []):
    for key in [k for k, v in kind.items() if v is None or (k == "has_mlp" and v is True)]:
        del kind[key]
for item in args.set:
    key, value = item.split("=", 1)
    preset[key] = json.loads(value)
order = ["name", "description", "source", "published_parameters", "hidden", "layers", "heads", "kv_heads",
         "head_dim", "ffn", "vocab", "max_positions", "position_rows", "mlp", "activation", "norm", "norms_per_layer",
         "bias", "position", "tied_embeddings", "parallel_attention", "embedding_norm", "experts",
         "experts_per_token", "attention_dropout", "hidden_dropout", "softmax_fp32", "head_bias"]
preset = {key: preset[key] for key in sorted(preset, key=lambda k: order.index(k) if k in order else len(order))}
path = os.path.join(root, "presets", args.name + ".json")
with open(path, "w", encoding="utf-8") as f:
    f.write(json.dumps(preset, indent=2) + "\n")
print(path)
