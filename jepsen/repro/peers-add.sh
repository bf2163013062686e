#!/usr/bin/env bash
# Reproduces the `peers add` bug with the suite: the router built with the catch-up gate
# taken out again (peers-add-before-fix.patch puts back what add_peer did before the fix in
# e6c9440: the learner becomes a voter at once, caught up or not), then a jepsen run whose
# every fault is `membership:add-unreachable` (router-4 is added while nothing listens at
# its address, and a peer of the initial three is killed or paused meanwhile). The
# membership checker must report INVALID here, and valid on the fixed code:
#   jepsen/repro/peers-add.sh            (before the fix: expect INVALID)
#   FIXED=1 jepsen/repro/peers-add.sh    (the code as it is: expect valid)
# The patch is applied to the working tree for the build and reverted on exit; the
# release binaries are rebuilt from the unpatched tree afterwards.
set -euo pipefail
cd "$(dirname "$0")/../.."
patch=jepsen/repro/peers-add-before-fix.patch
if [ -n "${FIXED:-}" ]; then out=target/jepsen/repro-fixed; else out=target/jepsen/repro-before-fix; fi
if [ -z "${FIXED:-}" ]; then
  git apply "$patch"
  trap 'git apply -R "$patch"; cargo build --release --bins --quiet' EXIT
fi
cargo build --release --bins --quiet
set +e
target/release/jepsen run --no-build --nemesis membership:add-unreachable --rounds 3 \
  --seed "${SEED:-5}" --fault-secs 6 --quiet-secs 3 --out "$out"
rc=$?
set -e
grep -A6 '^## membership' "$out/report.md" 2>/dev/null || true
echo "jepsen exit $rc; history and report in $out"
