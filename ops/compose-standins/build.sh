#!/usr/bin/env bash
# Builds LOCAL STAND-INS for the two base images of the compose files,
# python:3.11-slim and redis:7.2, on a machine that cannot pull them (no
# registry reachable): Debian bookworm from `debootstrap --variant=minbase`,
# imported as stepbarrier-standin-base:bookworm, then python.Dockerfile and
# redis.Dockerfile on top of it, tagged with the official names so that the
# project's Dockerfiles and compose files run unchanged. They are not the
# official images.
#
# Each image carries the label org.stepbarrier.compose-standin: "base" on the
# imported root file system, and a digest of this directory's recipe on the two
# stand-ins. A tag that exists with the current label is kept (the cache
# between runs on one machine); a stand-in of an older recipe is rebuilt; a tag
# without the label is a real image (pulled or built by someone else) and is
# used as it is, never replaced. Needs root (debootstrap) and a running engine.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
LABEL=org.stepbarrier.compose-standin
BASE=stepbarrier-standin-base:bookworm
MIRROR=${STANDIN_DEBIAN_MIRROR:-http://deb.debian.org/debian}
CA_BUNDLE=${STANDIN_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
recipe=$(cat "$here/python.Dockerfile" "$here/redis.Dockerfile" "$here/redis-entrypoint.sh" \
  | sha256sum | cut -c1-16)

label_of() {  # the label's value, "" without it, "missing" without the image
  docker image inspect --format "{{ index .Config.Labels \"$LABEL\" }}" "$1" 2>/dev/null \
    | sed 's/^<no value>$//' || echo missing
}

work=
cleanup() { if [ -n "$work" ]; then rm -rf "$work"; fi; }
trap cleanup EXIT

base() {
  if [ "$(label_of "$BASE")" = base ]; then
    return
  fi
  if [ "$(id -u)" != 0 ]; then
    echo "build.sh: debootstrap needs root to build $BASE" >&2
    exit 1
  fi
  work=$(mktemp -d)
  echo "stand-ins: debootstrap --variant=minbase bookworm ($MIRROR) -> $BASE"
  debootstrap --variant=minbase bookworm "$work/rootfs" "$MIRROR" >"$work/debootstrap.log" 2>&1 \
    || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
  rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"*
  tar -C "$work/rootfs" -c . | docker import --change "LABEL $LABEL=base" - "$BASE" >/dev/null
  rm -rf "$work"
  work=
}

standin() {  # standin TAG DOCKERFILE
  local tag=$1 dockerfile=$2 label
  label=$(label_of "$tag")
  if [ "$label" = "$recipe" ]; then
    echo "stand-ins: $tag is the cached local stand-in (debootstrap, recipe $recipe)"
    return
  fi
  if [ "$label" != missing ] && [ -z "$label" ]; then
    echo "stand-ins: $tag exists and is not a stand-in (no $LABEL label): using it as it is"
    return
  fi
  base
  work=$(mktemp -d)
  cp "$here/$dockerfile" "$here/redis-entrypoint.sh" "$work/"
  cp "$CA_BUNDLE" "$work/host-ca-certificates.crt"
  echo "stand-ins: building $tag as a LOCAL STAND-IN ($dockerfile on $BASE)"
  DOCKER_BUILDKIT=0 docker build --quiet --label "$LABEL=$recipe" -t "$tag" \
    -f "$work/$dockerfile" "$work" >/dev/null
  rm -rf "$work"
  work=
}

standin python:3.11-slim python.Dockerfile
standin redis:7.2 redis.Dockerfile
