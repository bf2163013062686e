#!/usr/bin/env bash
# Builds the image `router:local` from host-built release binaries, without any registry:
# the four binaries (stripped) and the shared libraries they load, staged in target/image/
# (the only path .dockerignore lets into the context) on `FROM scratch`.
#   scripts/build-image.sh            (builds the release binaries first)
#   NO_BUILD=1 scripts/build-image.sh (uses the binaries already in target/release)
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${NO_BUILD:-}" = 1 ] || cargo build --release --bins --quiet
stage=target/image
rm -rf "$stage"
mkdir -p "$stage/tmp" "$stage/data" "$stage/config" "$stage/certs" "$stage/out"
bins=(router routerctl enginesim routerbench)
for b in "${bins[@]}"; do
  strip -o "$stage/$b" "target/release/$b"
done
# The loader and every library the binaries link (glibc, libm, libgcc_s), at their paths.
for lib in $(for b in "${bins[@]}"; do ldd "target/release/$b"; done \
    | grep -oE '/[^ ]+\.so[^ ]*' | sort -u); do
  mkdir -p "$stage$(dirname "$lib")"
  cp -L "$lib" "$stage$lib"
done
# getaddrinfo reads these; Docker mounts its own /etc/resolv.conf and /etc/hosts.
mkdir -p "$stage/etc"
echo 'hosts: files dns' > "$stage/etc/nsswitch.conf"
docker build -q -f docker/Dockerfile -t router:local . >/dev/null
echo "router:local: $(docker image inspect router:local --format '{{.Size}}' | awk '{printf "%.1f MB", $1/1e6}')"
