#!/usr/bin/env bash
# Removes every container, network and volume of the compose cluster, also after a
# half-failed run (by name, whatever docker-compose still knows).
set -uo pipefail
cd "$(dirname "$0")/.."
export COMPOSE_PROJECT_NAME=router
docker-compose --profile client --profile extra down -v -t 1 --remove-orphans >/dev/null 2>&1
for c in router-1 router-2 router-3 router-4 engine-1 engine-2 engine-3 engine-4 engine-5; do
  docker rm -f "$c" >/dev/null 2>&1
done
docker ps -aq --filter "label=com.docker.compose.project=router" | xargs -r docker rm -f >/dev/null 2>&1
docker network rm router_net >/dev/null 2>&1
for v in router_router-1-data router_router-2-data router_router-3-data router_router-4-data; do
  docker volume rm -f "$v" >/dev/null 2>&1
done
left=$(docker ps -aq --filter "label=com.docker.compose.project=router"; \
       docker network ls -q --filter "label=com.docker.compose.project=router"; \
       docker volume ls -q --filter "label=com.docker.compose.project=router")
if [ -n "$left" ]; then
  echo "left over: $left" >&2
  exit 1
fi
echo "compose cluster removed"
