#!/usr/bin/env bash
# Coverage-guided fuzzing of the request-body path (canonicalizer vs the serde oracle) and
# of config parsing, with libFuzzer on the stable toolchain: the sanitizer-coverage flags
# cargo-fuzz passes, without its nightly-only sanitizer option.
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]   (default 60 s, every target)
# Starts from the committed seed corpus (fuzz/corpus/<target>) in a scratch copy; exits
# non-zero on any finding, leaving the crashing input in fuzz/artifacts/<target>/.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs="${1:-60}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(canon config)

export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
# An explicit --target keeps RUSTFLAGS off build scripts and proc macros, as cargo-fuzz does.
host=$(rustc -vV | sed -n 's/^host: //p')
cargo build --release --quiet --bins --target "$host"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
status=0
for t in "${targets[@]}"; do
  mkdir -p "$scratch/$t" "artifacts/$t"
  cp -r "corpus/$t/." "$scratch/$t/"
  echo "== fuzz $t for ${secs}s"
  if ! "target/$host/release/$t" "$scratch/$t" -max_total_time="$secs" -max_len=8192 \
      -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="artifacts/$t/" 2>"$scratch/$t.log"; then
    tail -40 "$scratch/$t.log"
    echo "fuzz $t: FOUND A FAILURE (input in fuzz/artifacts/$t/)"
    status=1
  else
    grep -E "^stat::number_of_executed_units|^stat::new_units_added|^stat::peak_rss_mb" "$scratch/$t.log" \
      | sed "s/^/  $t /"
  fi
done
exit $status
