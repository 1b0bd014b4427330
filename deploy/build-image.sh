#!/usr/bin/env bash
# Builds the static sluice binary and the FROM scratch image that
# deploy/compose.yaml runs (default tag sluice:dev, or $SLUICE_IMAGE).
set -euo pipefail
cd "$(dirname "$0")/.."
out=deploy/build
mkdir -p "$out"
CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$out/sluice" ./cmd/sluice
cp /etc/ssl/certs/ca-certificates.crt "$out/"
docker build -f deploy/Dockerfile -t "${SLUICE_IMAGE:-sluice:dev}" "$out"
