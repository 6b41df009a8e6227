#!/usr/bin/env bash
# The GPU half of the replication, as one command for a machine with an NVIDIA GPU and CUDA PyTorch
# (python3). Writes gpu.json (written after every run, so a cut-short run keeps what it measured),
# the log and nvidia-smi's description of the card to $OUT (default validation/results). Then, on
# any machine with memcalc built:
#   /usr/bin/python3 validation/gpu/compare.py validation/results/gpu.json validation/results/gpu-accumulation.json \
#       --steps --plot validation/results/gpu.svg
set -euo pipefail
OUT=${OUT:-validation/results}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/nvidia-smi.csv" 2>&1 || true
PYTHONUNBUFFERED=1 python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())'
# First, seconds long: matrix products at the published layouts' shapes, each a share of the dense bf16
# peak (989.4 TFLOP/s on the H100 SXM and the H200), for hardware.hpp's gemm_efficiency.
PYTHONUNBUFFERED=1 python3 "$(dirname "$0")/gemm_rates.py" --device cuda --peak 989.4e12 \
  --out "$OUT/gemm-rates.json" 2>&1 | tee "$OUT/gemm-rates.log"
PYTHONUNBUFFERED=1 python3 "$(dirname "$0")/replicate.py" --device cuda --out "$OUT/gpu.json" 2>&1 | tee "$OUT/replicate.log"
# Then accumulated and kept gradients (two micro-batches; gradients zeroed and kept), on one model and length.
PYTHONUNBUFFERED=1 python3 "$(dirname "$0")/replicate.py" --device cuda --models llama-1b --seqs 2048 --microbatches 2 \
  --grad-buffer lazy persistent --out "$OUT/gpu-accumulation.json" 2>&1 | tee "$OUT/replicate-accumulation.log"
