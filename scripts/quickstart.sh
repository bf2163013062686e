#!/usr/bin/env bash
# Starts a three-router Raft cluster in front of four simulated engine ranks, drives a
# coding-agent workload through it with every turn sent to a random router (what DNS
# round-robin does), prints what happened, and stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION="${DURATION:-30}"
cargo build --release --bins
B=target/release
LOGS="$(mktemp -d)"
rm -rf /tmp/router-cluster-local
cleanup() { kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT

"$B/enginesim" --listen 127.0.0.1:9101 --listen 127.0.0.1:9102 --listen 127.0.0.1:9103 --listen 127.0.0.1:9104 \
  --speed 10 --capacity-tokens 150000 --prefill-tps 5000 2>"$LOGS/enginesim.log" &
for i in 1 2 3; do
  "$B/router" --config "config/cluster-local/router-$i.toml" 2>"$LOGS/router-$i.log" &
done
for i in 1 2 3; do
  for _ in $(seq 200); do
    curl -sf "http://127.0.0.1:808$i/health" 2>/dev/null | grep -q '"leader":[0-9]' && break
    sleep 0.1
  done
done
export ROUTERCTL_TOKEN=local-dev-admin-token-change-me
echo "joining two more engine servers with routerctl (through router 3; it reaches the leader):"
"$B/routerctl" --router 127.0.0.1:7083 join http://127.0.0.1:9103 --capacity-tokens 150000
"$B/routerctl" --router 127.0.0.1:7083 join http://127.0.0.1:9104 --capacity-tokens 150000
echo "routers on http://127.0.0.1:8081, :8082, :8083 (logs in $LOGS)"
"$B/routerctl" status
echo "running a ${DURATION}s agent workload (16 developers), each turn to a random router..."
"$B/routerbench" agent --url http://127.0.0.1:8081,http://127.0.0.1:8082,http://127.0.0.1:8083 \
  --developers 16 --duration "$DURATION" --time-scale 10
echo
# The last turns' records may still be on their way through Raft: wait (at most 5 s) until
# every peer has applied them, so the digests below compare one state.
for _ in $(seq 50); do
  # A failed status call or no digest yet counts as not settled (not as a script error).
  n="$("$B/routerctl" status --json | grep -o '"state_digest":"[0-9a-f]*"' | sort -u | wc -l)" || n=0
  [ "$n" = 1 ] && break
  sleep 0.1
done
"$B/routerctl" status
echo "router 1 metrics:"
curl -s http://127.0.0.1:8081/metrics | grep -E '^router_(route_decisions_total|usage_(prompt|cached)_tokens_total|index_entries|route_records_dropped_total|raft_(term|commit_index|applied_index|proposals_total|proposed_routes_total))'
