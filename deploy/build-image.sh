#!/usr/bin/env bash
# Builds the images deploy/compose.yaml runs, with no registry: all are
# FROM scratch and take binaries built here.
#
#   sluice:dev       every Sluice role (static sluice binary + CA certificates)
#   sluice-nats:dev  nats-server built from the Go module this repository pins,
#                    with busybox's wget for the healthcheck (Debian's
#                    busybox-static), for machines that cannot pull the
#                    official nats image
#   sluice-jaeger:dev  with --jaeger only: Jaeger (all-in-one, in-memory
#                    storage) built from the Go module
#                    github.com/jaegertracing/jaeger at $JAEGER_VERSION, for
#                    compose's --profile tracing (its UI page is a
#                    placeholder: the UI's assets are not in the Go module;
#                    the query API at /api/ works)
#
# Tags: $SLUICE_IMAGE, $SLUICE_NATS_IMAGE and $SLUICE_JAEGER_IMAGE. Options:
# --sluice-only skips the NATS image; --jaeger builds the Jaeger image too
# (minutes the first time: it downloads and compiles the OpenTelemetry
# Collector and Jaeger; then seconds, from Go's caches).
set -euo pipefail
cd "$(dirname "$0")/.."
sluice_only=0 jaeger=0
for arg in "$@"; do
  case "$arg" in
    --sluice-only) sluice_only=1 ;;
    --jaeger) jaeger=1 ;;
    *) echo "build-image.sh: unknown option $arg (--sluice-only, --jaeger)" >&2; exit 2 ;;
  esac
done
out=deploy/build
mkdir -p "$out"
export CGO_ENABLED=0
# The version the binary reports (sluice --version, heartbeats, micro
# services, sluice_build_info): the commit, as git describes it.
release=$(git describe --tags --always --dirty 2>/dev/null || echo devel)
go build -trimpath -ldflags="-s -w -X github.com/sluice-dtr/sluice/pkg/version.Release=$release" -o "$out/sluice" ./cmd/sluice
cp /etc/ssl/certs/ca-certificates.crt "$out/"
# /data/stage is writable by every uid, so that processors and deliverers
# run as another user (deploy/compose.files.yaml) still stage there.
mkdir -p "$out/rootfs/data/stage" "$out/rootfs/tmp"
chmod 0755 "$out/rootfs/data"
chmod 1777 "$out/rootfs/data/stage" "$out/rootfs/tmp"
printf 'jaeger-src\njaeger-ctx\njaeger-get.log\n' >"$out/.dockerignore" # built with --jaeger, not for this image
docker build -q -f deploy/Dockerfile -t "${SLUICE_IMAGE:-sluice:dev}" "$out"
if [ "$jaeger" = 1 ]; then
  # A module of its own, outside this repository's go.mod (Jaeger's
  # dependencies are not Sluice's), made again when the version changes.
  version=${JAEGER_VERSION:-v1.76.0}
  src="$out/jaeger-src"
  mkdir -p "$src"
  if ! grep -qsE "github.com/jaegertracing/jaeger $version( |\$)" "$src/go.mod"; then
    rm -f "$src/go.mod" "$src/go.sum"
    if ! (cd "$src" && GOWORK=off go mod init sluice-jaeger-build &&
      GOWORK=off go get -tool "github.com/jaegertracing/jaeger/cmd/jaeger@$version") >"$out/jaeger-get.log" 2>&1; then
      cat "$out/jaeger-get.log" >&2
      exit 1
    fi
  fi
  # Its own build context: the other images' context ($out) leaves it out.
  mkdir -p "$out/jaeger-ctx"
  (cd "$src" && GOWORK=off go build -trimpath -ldflags='-s -w' -o ../jaeger-ctx/jaeger github.com/jaegertracing/jaeger/cmd/jaeger)
  docker build -q -f deploy/Dockerfile.jaeger -t "${SLUICE_JAEGER_IMAGE:-sluice-jaeger:dev}" "$out/jaeger-ctx"
fi
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
