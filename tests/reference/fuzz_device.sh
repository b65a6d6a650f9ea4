#!/usr/bin/env bash
# Long libFuzzer runs of every moescope::fuzzing target side by side on the lent many-core
# machine (issue 26): `jobs` processes per target for `secs` seconds each, every target's
# corpus starting from the replay's seeds and the saved corpus. What comes back in $OUT: a
# summary (executions, coverage, corpus size, crashes per target), the libFuzzer logs, and any
# input that crashed, hung or ran out of memory (TARGET-crash-*, -timeout-*, -oom-*).
#
# Carry (built here, the device has no Rust toolchain):
#   cd fuzz && cargo +nightly fuzz build -O -s none --no-trace-compares --disable-branch-folding false any
#   mkdir -p .dev/fuzz && strip -o .dev/fuzz/any fuzz/target/x86_64-unknown-linux-gnu/release/any
#   xz -6 .dev/fuzz/any
#   cargo run --release -p moescope-replay -- --write-seeds .dev/fuzz/seeds
# then: run `bash tests/reference/fuzz_device.sh 480 3` with carry [".dev/fuzz"] (move the
# fixtures, traces/, assets/ and the demo's weights out of the tree for the call: 64 MiB at most).
# TARGETS="gguf package" picks targets.
set -uo pipefail
secs=${1:-480}
jobs=${2:-3}
out=${OUT:-/tmp/fuzz-out}
bin=$(pwd)/.dev/fuzz/any
# carried xz-compressed (31 MB stripped, 14 MB compressed: the tree and what is carried fit 64 MiB)
if [ ! -x "$bin" ] && [ -f "$bin.xz" ]; then xz -dk "$bin.xz" && chmod +x "$bin"; fi
work=/tmp/moescope-fuzz
mkdir -p "$out"
targets=${TARGETS:-gguf package checkpoint chat_template request}
# libFuzzer's default -max_len is 1 MiB: the GGUF, package and checkpoint seeds (up to 2.4 MB)
# were cut short, and the gguf target stalled at cov 515 on truncated files
max_len=${MAX_LEN:-4194304}
for t in $targets; do
  mkdir -p "$work/$t/corpus" "$work/$t/tmp"
  cp -r ".dev/fuzz/seeds/$t/." "$work/$t/corpus/" 2>/dev/null || true
  cp -r "fuzz/corpus/$t/." "$work/$t/corpus/" 2>/dev/null || true
  (
    cd "$work/$t" &&
      MOESCOPE_FUZZ_TARGET=$t TMPDIR="$work/$t/tmp" "$bin" corpus -max_total_time="$secs" -jobs="$jobs" \
        -workers="$jobs" -max_len="$max_len" -rss_limit_mb=3072 -timeout=20 -print_final_stats=1 \
        -artifact_prefix="$out/$t-" >/dev/null 2>&1
  ) &
done
wait
{
  echo "target executions cov(max) ft(max) corpus_files crashes"
  for t in $targets; do
    execs=$(cat "$work/$t"/fuzz-*.log 2>/dev/null | awk '/stat::number_of_executed_units/ {s += $2} END {print s + 0}')
    cov=$(cat "$work/$t"/fuzz-*.log 2>/dev/null | grep -o 'cov: [0-9]*' | awk '{if ($2 > m) m = $2} END {print m + 0}')
    ft=$(cat "$work/$t"/fuzz-*.log 2>/dev/null | grep -o 'ft: [0-9]*' | awk '{if ($2 > m) m = $2} END {print m + 0}')
    files=$(find "$work/$t/corpus" -type f | wc -l)
    crashes=$(find "$out" -name "$t-*" -type f | wc -l)
    echo "$t $execs $cov $ft $files $crashes"
  done
} | tee "$out/summary.txt"
# the corpora's small inputs (the GGUF and package seeds are MBs each; 16 MiB come back at most)
(cd "$work" && find $targets -path '*/corpus/*' -type f -size -8k | tar -czf "$out/corpora.tar.gz" -T -) || true
if [ "$(stat -c %s "$out/corpora.tar.gz" 2>/dev/null || echo 0)" -gt 15000000 ]; then rm -f "$out/corpora.tar.gz"; fi
# each job's last lines (its final stats)
for t in $targets; do
  for f in "$work/$t"/fuzz-*.log; do echo "== $f"; grep -E 'DONE|stat::|ERROR|SUMMARY' "$f"; done >"$out/$t-stats.txt" 2>/dev/null
done
ls -la "$out"
