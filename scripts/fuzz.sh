#!/usr/bin/env bash
# Builds memcalc's libFuzzer targets with clang++, AddressSanitizer and UndefinedBehaviorSanitizer,
# and runs each for SECONDS (default 60) from a seed corpus: the shipped presets and configs, the
# seeds made below, and fuzz/corpus/<target>/ kept in the repository.
# Prints each target's executions and rate; exits non-zero if any input crashed (kept in crashes/).
# Usage: scripts/fuzz.sh [SECONDS]     (FUZZ_BUILD_DIR overrides where it builds, default build-fuzz;
# FUZZ_PREBUILT names a build that has the targets already, as the suite's clang++ build makes them)
# A campaign: FUZZ_RUNS=10000000 FUZZ_JOBS=2 scripts/fuzz.sh 7200 stops each target after FUZZ_RUNS
# executions or SECONDS, whichever comes first, FUZZ_JOBS targets at a time; FUZZ_TARGETS="a b"
# runs only those.
set -euo pipefail
seconds=${1:-60}
runs_limit=${FUZZ_RUNS:--1}  # libFuzzer's -runs: -1 is no limit
jobs=${FUZZ_JOBS:-1}
all_targets="fuzz_model_file fuzz_hf_config fuzz_arguments fuzz_command_line fuzz_safetensors_header
  fuzz_safetensors_index fuzz_recipe_file fuzz_profile_file fuzz_gpu_file fuzz_serve"
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FUZZ_BUILD_DIR:-$root/build-fuzz}
targets=${FUZZ_PREBUILT:-$build}/fuzz
if [ -z "${FUZZ_PREBUILT:-}" ]; then
  # -O1 with line tables: fuzzing needs the sanitizers, not -O2's code or full debug info, which more
  # than double the compile time of this build. tests/compiler_build.cmake uses the same flags.
  flags="-O1 -gline-tables-only -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
  cmake -S "$root" -B "$build" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=None -DMEMCALC_FUZZ=ON \
    -DMEMCALC_BUILD_TESTS=OFF -DMEMCALC_BUILD_BENCHMARKS=OFF "-DCMAKE_CXX_FLAGS=$flags" >/dev/null
  # shellcheck disable=SC2086  # the list, a word a target
  cmake --build "$build" -j2 --target $all_targets >/dev/null
fi
mkdir -p "$build"

seed() {  # target, then seed files
  local dir="$build/corpus/$1"
  shift
  mkdir -p "$dir"
  cp "$@" "$dir/"
}
seed fuzz_model_file "$root"/presets/*.json
seed fuzz_hf_config $(ls "$root"/tests/configs/*.json | grep -v manifest.json)
mkdir -p "$build/corpus/fuzz_arguments"
for text in 80GB 2GiB 1.5TB 512 "0.5 KiB" 1024,2048,4096 all none,full 0,1,2,3 18446744073709551615; do
  printf '%s' "$text" > "$build/corpus/fuzz_arguments/$(printf '%s' "$text" | md5sum | cut -c1-12)"
done

# Safetensors files: an 8-byte little-endian length, the JSON header, then the (zero) data it names.
mkdir -p "$build/corpus/fuzz_safetensors_header"
i=0
for header in '{"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}}' \
    '{"model.layers.0.self_attn.q_proj.weight":{"dtype":"F8_E4M3","shape":[64,64],"data_offsets":[0,4096]},"__metadata__":{"format":"pt"}}' \
    '{"model.layers.1.mlp.down_proj_blocks":{"dtype":"U8","shape":[64,4,16],"data_offsets":[0,4096]}}'; do
  /usr/bin/python3 -c 'import json, struct, sys; h = sys.argv[1].encode()
ends = [t["data_offsets"][1] for n, t in json.loads(h).items() if n != "__metadata__"]
sys.stdout.buffer.write(struct.pack("<Q", len(h)) + h + bytes(max(ends)))' \
    "$header" > "$build/corpus/fuzz_safetensors_header/seed-$i"
  i=$((i + 1))
done

# Whole command lines, one argument a line: an estimate, a sweep over the layout, fit and plan.
mkdir -p "$build/corpus/fuzz_command_line"
i=0
for line in "--preset llama-7b --seq 1024 --recompute selective" \
    "--preset mixtral-8x7b --seq 512 --dp 8 --ep 4 --zero 3 --cp 2 --format json" \
    "--preset llama-7b --seq 512 --pp 4 --vpp 2 --microbatches 8 --tp 2 --sp --format csv" \
    "--preset llama-3.1-405b --seq 64 --pp 16 --first-stage-layers 7 --last-stage-layers 7 --grad-buffer persistent" \
    "--preset gpt2 --seq 64,128 --activations architecture --attention flash --platform cpu --plot p.svg --output o.csv --format csv" \
    "--preset llama-7b --seq 64 --dp 4 --zero 2 --offload optimizer --compare deepspeed --optimizer-impl foreach" \
    "fit --preset llama-7b --device-memory 80GB --multiple-of 64 --cp 2" \
    "fit --preset llama-7b --device-memory 80GB --seq 512 --global-batch 8" \
    "plan --preset llama-7b --gpus 8 --device-memory 80GB --seq 512 --global-batch 16 --recompute full -b 1,2"; do
  printf '%s' "$line" | tr ' ' '\n' > "$build/corpus/fuzz_command_line/seed-$i"
  i=$((i + 1))
done

# The seeds kept in the repository, beside those made here.
for target in $all_targets; do
  if [ -d "$root/fuzz/corpus/$target" ]; then seed "$target" "$root/fuzz/corpus/$target"/*; fi
done

# One target's run; its summary line goes to its .summary file, its status to .failed.
fuzz_one() {
  local target=$1 dict log="$build/$1.log"
  case "$target" in
    fuzz_model_file | fuzz_hf_config) dict="-dict=$root/fuzz/model.dict" ;;
    fuzz_safetensors_header | fuzz_safetensors_index) dict="-dict=$root/fuzz/safetensors.dict" ;;
    fuzz_recipe_file | fuzz_profile_file | fuzz_gpu_file) dict="-dict=$root/fuzz/files.dict" ;;
    fuzz_command_line | fuzz_serve) dict="-dict=$root/fuzz/command_line.dict" ;;
    *) dict="" ;;
  esac
  rm -f "$build/$target.failed"
  local started=$SECONDS
  if ! "$targets/$target" ${dict:+"$dict"} -max_total_time="$seconds" -runs="$runs_limit" -timeout=20 \
      -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$build/crashes/$target-" \
      "$build/corpus/$target" >"$log" 2>&1; then
    echo "$target: CRASH (see $log and $build/crashes/)" > "$build/$target.failed"
  fi
  local took=$((SECONDS - started)) runs
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  local rate="?"
  [ "$runs" = "?" ] || rate=$((runs / (took > 0 ? took : 1)))
  echo "$target: $runs executions in $took s ($rate/s), corpus $(ls "$build/corpus/$target" | wc -l) inputs" \
    > "$build/$target.summary"
}

mkdir -p "$build/crashes"
selected=${FUZZ_TARGETS:-$all_targets}
running=0
for target in $selected; do
  fuzz_one "$target" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then wait -n || true; running=$((running - 1)); fi
done
wait
status=0
for target in $selected; do
  if [ -f "$build/$target.failed" ]; then cat "$build/$target.failed"; status=1; fi
  cat "$build/$target.summary"
done
[ "$status" = 0 ] && echo "fuzzing: no crashes"
exit "$status"
