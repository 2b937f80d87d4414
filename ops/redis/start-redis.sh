#!/bin/sh
# Starts redis-server and loads the stepbarrier Functions library into it as the
# `installer` user, then stays with the server until it exits.
#
#   start-redis.sh REDIS_CONF LIBRARY_LUA INSTALLER_PASSWORD_FILE [redis-server options...]
#
# Redis keeps no data here (no persistence), so the library is gone whenever
# the server restarts: loading it at every start is what lets the training
# roles live without FUNCTION LOAD. Run it on every node of a Cluster or a
# Sentinel group: a replica refuses the load (READONLY) and gets the library
# from its primary. If it cannot be loaded, the server is stopped and the
# script fails, so the container restarts visibly instead of serving clients
# that would all be refused.
#
# REDIS_PORT (default 6379) is the port the server listens on; the password is
# handed to redis-cli through REDISCLI_AUTH, never on a command line.
set -eu

if [ "$#" -lt 3 ]; then
  echo "usage: $0 REDIS_CONF LIBRARY_LUA INSTALLER_PASSWORD_FILE [redis-server options...]" >&2
  exit 2
fi
conf=$1
library=$2
password_file=$3
shift 3
port=${REDIS_PORT:-6379}
name=$(sed -n '1s/^#!lua name=\([A-Za-z0-9_]*\).*/\1/p' "$library")
if [ -z "$name" ]; then
  echo "start-redis: $library does not start with '#!lua name=...'" >&2
  exit 2
fi
# read before the server starts (a missing file must not leave it running), and
# kept out of the environment until then (the server must not inherit it)
password=$(cat "$password_file")
if [ -z "$password" ]; then
  echo "start-redis: $password_file is empty" >&2
  exit 2
fi

redis-server "$conf" "$@" &
server=$!
# the container's stop signal goes to this shell: pass it on to the server
trap 'kill -TERM "$server" 2>/dev/null || true' INT TERM

REDISCLI_AUTH=$password
export REDISCLI_AUTH
installer() {
  redis-cli -h 127.0.0.1 -p "$port" --user installer "$@"
}

stop_server() {
  kill -TERM "$server" 2>/dev/null || true
  wait "$server" || true
}

# redis-cli fails only while nobody accepts its connection; an error reply
# (a wrong password) exits 0, and then waiting longer would not help
until reply=$(installer PING 2>&1); do
  if ! kill -0 "$server" 2>/dev/null; then
    status=0
    wait "$server" || status=$?
    echo "start-redis: redis-server exited (status $status) before it answered" >&2
    exit 1
  fi
  sleep 0.1
done
if [ "$reply" != PONG ]; then
  echo "start-redis: Redis refused the installer user: $reply" >&2
  stop_server
  exit 1
fi

# redis-cli exits 0 on an error reply: the reply itself tells success (the name)
reply=$(installer -x FUNCTION LOAD REPLACE <"$library" 2>&1) || true
unset REDISCLI_AUTH password
case $reply in
  "$name")
    echo "start-redis: loaded the Functions library $name" ;;
  READONLY*)  # a replica (Sentinel, Cluster) gets the library from its primary
    echo "start-redis: a replica: $name comes from its primary" ;;
  *)
    echo "start-redis: loading $name failed: $reply" >&2
    stop_server
    exit 1 ;;
esac

status=0
wait "$server" || status=$?
# a trapped signal ends `wait` early: wait on until the server has exited
while kill -0 "$server" 2>/dev/null; do
  status=0
  wait "$server" || status=$?
done
exit "$status"
