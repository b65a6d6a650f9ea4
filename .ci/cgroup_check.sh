#!/usr/bin/env bash
# The memory plan inside a real memory cgroup (v1 or v2; CI runs as root): an explicit pool
# whose plan exceeds the cgroup's limit is refused before loading, with the largest that fits;
# that one runs; `--cache-mb auto` runs. tests/memory_limit.rs checks the same against a fake
# cgroup folder; this checks that the engine finds and reads a real one.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release/moescope
limit=$((768 << 20))
if [[ $(id -u) != 0 ]]; then
  echo "cgroup check: FAILED to run: needs root to make a memory cgroup" >&2
  exit 1
fi
if [[ -d /sys/fs/cgroup/memory ]]; then
  cg=/sys/fs/cgroup/memory/moescope-ci-$$
  mkdir "$cg"
  echo $limit > "$cg/memory.limit_in_bytes"
else
  cg=/sys/fs/cgroup/moescope-ci-$$
  grep -qw memory /sys/fs/cgroup/cgroup.subtree_control || echo +memory > /sys/fs/cgroup/cgroup.subtree_control
  mkdir "$cg"
  echo $limit > "$cg/memory.max"
fi
trap 'rmdir "$cg" 2>/dev/null || true' EXIT
in_cg() { bash -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg" "$bin" "$@"; }
args=(run --prompt-ids 1,2,3 -n 4 -c 256)
set +e
out=$(in_cg "${args[@]}" --cache-mb 4000 2>&1)
rc=$?
set -e
echo "$out" | tail -1
if [[ $rc == 0 ]] || ! grep -q "exceeds the 768 MiB that the memory cgroup's limit" <<<"$out"; then
  echo "cgroup check: a 4000 MiB pool under a 768 MiB cgroup was not refused as it should be" >&2
  exit 1
fi
largest=$(grep -o "largest pool that fits is [0-9]*" <<<"$out" | grep -o "[0-9]*$")
in_cg "${args[@]}" --cache-mb "$largest" > /dev/null
in_cg "${args[@]}" --cache-mb auto 2>&1 | grep "memory: pool"
# a server's slots: refused past the limit, with the most that fit
set +e
out=$(in_cg serve --port 0 --parallel 1000 --cache-ram 0 2>&1)
rc=$?
set -e
most=$(grep -o "the most that fit: --parallel [0-9]*" <<<"$out" | grep -o "[0-9]*$")
if [[ $rc == 0 || -z "$most" ]] || ! grep -q "exceeds the 768 MiB that the memory cgroup's limit" <<<"$out"; then
  echo "cgroup check: 1000 slots under a 768 MiB cgroup were not refused with the most that fit: $out" >&2
  exit 1
fi
echo "cgroup check: ok (refused 4000 MiB, ran the named largest $largest MiB and auto; refused 1000 slots, $most fit)"
