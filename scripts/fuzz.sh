#!/usr/bin/env bash
# Builds memcalc's libFuzzer targets with clang++, AddressSanitizer and UndefinedBehaviorSanitizer,
# and runs each for SECONDS (default 60) from a seed corpus of the shipped presets and configs.
# Prints each target's executions; exits non-zero if any input crashed (saved under crashes/).
# Usage: scripts/fuzz.sh [SECONDS]     (FUZZ_BUILD_DIR overrides where it builds, default build-fuzz)
set -euo pipefail
seconds=${1:-60}
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FUZZ_BUILD_DIR:-$root/build-fuzz}
flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
cmake -S "$root" -B "$build" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMEMCALC_FUZZ=ON \
  -DMEMCALC_BUILD_TESTS=OFF -DMEMCALC_BUILD_BENCHMARKS=OFF "-DCMAKE_CXX_FLAGS=$flags" >/dev/null
cmake --build "$build" -j2 --target fuzz_model_file fuzz_hf_config fuzz_arguments >/dev/null

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

status=0
for target in fuzz_model_file fuzz_hf_config fuzz_arguments; do
  dict=""
  [ "$target" = fuzz_arguments ] || dict="-dict=$root/fuzz/model.dict"
  mkdir -p "$build/crashes"
  log="$build/$target.log"
  if ! "$build/fuzz/$target" $dict -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 \
      -artifact_prefix="$build/crashes/$target-" "$build/corpus/$target" >"$log" 2>&1; then
    echo "$target: CRASH (see $log and $build/crashes/)"
    status=1
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  echo "$target: $runs executions in $seconds s, corpus $(ls "$build/corpus/$target" | wc -l) inputs"
done
[ "$status" = 0 ] && echo "fuzzing: no crashes"
exit "$status"
