#!/usr/bin/env bash
# Builds the images deploy/compose.yaml runs, with no registry: both are
# FROM scratch and take binaries built here.
#
#   sluice:dev       every Sluice role (static sluice binary + CA certificates)
#   sluice-nats:dev  nats-server built from the Go module this repository pins,
#                    with busybox's wget for the healthcheck (Debian's
#                    busybox-static), for machines that cannot pull the
#                    official nats image
#
# Tags: $SLUICE_IMAGE and $SLUICE_NATS_IMAGE. Run with --sluice-only to skip
# the NATS image.
set -euo pipefail
cd "$(dirname "$0")/.."
sluice_only=0
for arg in "$@"; do
  case "$arg" in
    --sluice-only) sluice_only=1 ;;
    *) echo "build-image.sh: unknown option $arg (--sluice-only)" >&2; exit 2 ;;
  esac
done
out=deploy/build
mkdir -p "$out"
export CGO_ENABLED=0
go build -trimpath -ldflags='-s -w' -o "$out/sluice" ./cmd/sluice
cp /etc/ssl/certs/ca-certificates.crt "$out/"
# /data/stage is writable by every uid, so that processors and deliverers
# run as another user (deploy/compose.files.yaml) still stage there.
mkdir -p "$out/rootfs/data/stage" "$out/rootfs/tmp"
chmod 0755 "$out/rootfs/data"
chmod 1777 "$out/rootfs/data/stage" "$out/rootfs/tmp"
docker build -q -f deploy/Dockerfile -t "${SLUICE_IMAGE:-sluice:dev}" "$out"
if [ "$sluice_only" = 1 ]; then
  exit 0
fi
busybox=$(command -v busybox || true)
if [ -z "$busybox" ] || [[ "$(ldd "$busybox" 2>&1 || true)" != *"not a dynamic"* ]]; then
  echo "build-image.sh: the NATS image needs a static busybox for its healthcheck: apt-get install busybox-static" >&2
  exit 1
fi
go build -trimpath -ldflags='-s -w' -o "$out/nats-server" github.com/nats-io/nats-server/v2
cp "$busybox" "$out/busybox"
docker build -q -f deploy/Dockerfile.nats -t "${SLUICE_NATS_IMAGE:-sluice-nats:dev}" "$out"
