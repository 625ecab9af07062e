#!/usr/bin/env bash
# Bounded coverage-guided fuzzing of every decoder (part of `npm test`):
#   crates/ffsync_core/fuzz/run-bounded.sh [SECONDS_PER_TARGET]   (default 10)
# Needs a nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`); without them it
# says so and exits 0 — the same fuzz bodies also run as a seeded mutation test in
# `cargo test` (crates/ffsync_core/src/fuzzing.rs). Long runs: bench/README.md.
set -euo pipefail
cd "$(dirname "$0")"
secs="${1:-10}"
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "fuzz: skipped (needs a nightly toolchain and cargo-fuzz); the seeded mutation run in cargo test covers the same decoders"
  exit 0
fi
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
for target in $(cargo +nightly fuzz list); do
  status=0
  cargo +nightly fuzz run "$target" -- -max_total_time="$secs" >"$log" 2>&1 || status=$?
  done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1 | awk '{print $1}' | tr -d '#')
  if [ "$status" -ne 0 ]; then
    grep -E 'ERROR|SUMMARY|panicked' "$log" | head -5
    echo "fuzz: $target FAILED (reproducer in crates/ffsync_core/fuzz/artifacts/$target)"
    exit 1
  fi
  echo "fuzz: $target ${secs}s, ${done_line:-?} executions, no crash"
done
