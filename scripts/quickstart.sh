#!/usr/bin/env bash
# Starts the router in front of four simulated engine ranks, drives a 30-second coding-agent
# workload through it, prints what happened, and stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION="${DURATION:-30}"
cargo build --release --bins
B=target/release
LOGS="$(mktemp -d)"
cleanup() { kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT

"$B/enginesim" --listen 127.0.0.1:9101 --listen 127.0.0.1:9102 --listen 127.0.0.1:9103 --listen 127.0.0.1:9104 \
  --speed 10 --capacity-tokens 150000 --prefill-tps 5000 2>"$LOGS/enginesim.log" &
"$B/router" --config config/local.toml 2>"$LOGS/router.log" &
for _ in $(seq 100); do curl -sf http://127.0.0.1:8080/health >/dev/null 2>&1 && break; sleep 0.1; done
echo "router on http://127.0.0.1:8080 (logs in $LOGS); health:"
curl -s http://127.0.0.1:8080/health; echo
echo "running a ${DURATION}s agent workload (16 developers) through it..."
"$B/routerbench" agent --url http://127.0.0.1:8080 --developers 16 --duration "$DURATION" --time-scale 10
echo
echo "router metrics:"
curl -s http://127.0.0.1:8080/metrics | grep -E '^router_(route_decisions_total|usage_(prompt|cached)_tokens_total|index_(entries|bytes)|upstream_requests_total)'
