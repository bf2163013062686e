#!/usr/bin/env bash
# Starts the docker-compose cluster: release build, image, certificates (once), three
# routers and four engines; waits until every router is healthy and a leader exists, then
# joins engine-3 and engine-4 with routerctl through the published admin port.
#   scripts/compose-up.sh            (NO_BUILD=1 to reuse target/release)
set -euo pipefail
cd "$(dirname "$0")/.."
export COMPOSE_PROJECT_NAME=router
# shellcheck disable=SC1091
source .env
started=$(date +%s%3N)
scripts/build-image.sh
certs=.data/compose/certs
if [ ! -f "$certs/router-4.pem" ]; then
  target/release/routerctl certs --dir "$certs" \
    --node router-1,10.77.0.11,localhost,127.0.0.1 \
    --node router-2,10.77.0.12,localhost,127.0.0.1 \
    --node router-3,10.77.0.13,localhost,127.0.0.1 \
    --node router-4,10.77.0.14,localhost,127.0.0.1 >/dev/null
fi
# The routers run as root in the container; the key files stay 0600 on the host.
mkdir -p .data/compose/out .data/compose/engine-logs
upat=$(date +%s%3N)
docker-compose up -d --quiet-pull 2>&1 | grep -v "^Creating\|^Starting" || true
ctl() {
  target/release/routerctl --router 127.0.0.1:17082 --ca "$certs/ca.pem" \
    --token "$ROUTER_ADMIN_TOKEN" "$@"
}
deadline=$((SECONDS + 120))
until [ "$(docker inspect -f '{{.State.Health.Status}}' router-1 router-2 router-3 2>/dev/null | sort -u)" = healthy ] \
    && ctl status --json 2>/dev/null | grep -q '"leader":[1-9]'; do
  if [ $SECONDS -ge $deadline ]; then
    echo "the cluster did not become healthy within 120 s" >&2
    docker-compose ps >&2
    docker logs --tail 30 router-1 >&2 || true
    exit 1
  fi
  sleep 0.5
done
healthy=$(date +%s%3N)
ctl join http://engine-3:9000 --capacity-tokens 400000
ctl join http://engine-4:9000 --capacity-tokens 400000
secs() { echo "$(( $1 / 1000 )).$(( $1 % 1000 / 100 ))"; }
echo "cluster up: healthy $(secs $((healthy - started))) s after start, $(secs $((healthy - upat))) s after docker-compose up"
cat <<TXT
  client HTTP:  http://127.0.0.1:18081  :18082  :18083   (inside the network: http://router:8080)
  admin gRPC:   routerctl --router 127.0.0.1:17081 --ca $certs/ca.pem --token \$ROUTER_ADMIN_TOKEN status
  traffic:      docker-compose --profile client run --rm client
  stop:         scripts/compose-down.sh
TXT
