#!/usr/bin/env bash
# Builds the libFuzzer targets in fuzz/ with clang (ASan + UBSan, own build folder, ccache) and runs
# each for a bounded time, one at a time, starting from the seed corpus in fuzz/corpus/<target>.
#   bash scripts/fuzz.sh                 # every target, 30 s each
#   PX_FUZZ_SECONDS=600 bash scripts/fuzz.sh safetensors mesh
# New inputs go to $PX_FUZZ_WORK (not the repository); a crash stops the script with the input's
# path: turn it into a regression test (tests/...) and, if it is a good seed, add it to the corpus.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${PX_FUZZ_BUILD_DIR:-build-fuzz}
WORK=${PX_FUZZ_WORK:-$BUILD/work}
SECONDS_EACH=${PX_FUZZ_SECONDS:-30}
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(safetensors checkpoint partition_spec mesh env zarr toml)

if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S fuzz -B "$BUILD" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$BUILD" -j"${PX_JOBS:-2}"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
for t in "${TARGETS[@]}"; do
  mkdir -p "$WORK/$t/corpus" "$WORK/$t/crashes"
  log="$WORK/$t/log.txt"
  # The first directory receives new inputs; the seeds are read from the repository's.
  if ! "$BUILD/fuzz_$t" -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
      -artifact_prefix="$WORK/$t/crashes/" "$WORK/$t/corpus" "fuzz/corpus/$t" >"$log" 2>&1; then
    tail -40 "$log"
    echo "fuzz: $t FOUND A CRASH: $(ls "$WORK/$t/crashes/" | head -1) in $WORK/$t/crashes" >&2
    exit 1
  fi
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
  echo "fuzz: $t: $execs executions in ${SECONDS_EACH} s, no finding"
done
