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
# The EXAMPLE passwords of ops/redis/example-secrets are public. The script
# refuses to start Redis (exit 2, before the server starts) when the installer's
# password file holds one, or when an ACL file the configuration names (aclfile
# in REDIS_CONF, in a file it includes, or --aclfile/--include among the
# options) gives a user one (the SHA-256 below). Make your own passwords and
# users.acl (docs/operations.md#passwords). The one exception is a demo nobody
# else can reach, asked for with
#
#   STEPBARRIER_EXAMPLE_PASSWORDS=loopback-only
#
# Then, unless the options give --bind, Redis listens on 127.0.0.1 and ::1
# only (--bind 127.0.0.1 -::1 after every other option). An explicit --bind is
# kept: docker-compose.yml gives `--bind * -::*` (its private network, whose
# port it publishes on the host's 127.0.0.1 only), and the script says that
# the server must stay unreachable from anywhere else.
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

# The SHA-256 of each EXAMPLE password (ops/redis/example-secrets/USER.password,
# without its newline), as ops/redis/users.acl holds it. A test keeps them equal.
EXAMPLE_PASSWORD_HASHES="
d9382150f5d48653c1d5564f0886cb010aad4f9b1319fc72a5345415ed9152d9 chief
50f2578df1da320180ba9a17e47757bd9d5433d0039bd0b7f7038290a10d8c98 worker
fb32c3cd7ae2ece85ae0039124d95f8c71d380beb581a8331339a076dce29f4f monitor
948bd1d691941df17491b386ec79f180e6a3e3a518b104d441a455e4412c3cda emergency
ea68b35b9754bdb2bd642eef813b983d41429bbf56540165b073a89dd561b20a installer
"
opt_in=${STEPBARRIER_EXAMPLE_PASSWORDS:-}
case $opt_in in
  ""|loopback-only) ;;
  *)
    echo "start-redis: STEPBARRIER_EXAMPLE_PASSWORDS must be 'loopback-only' or unset, got '$opt_in'" >&2
    exit 2 ;;
esac
if ! command -v sha256sum >/dev/null 2>&1; then
  echo "start-redis: sha256sum is missing: it is needed to refuse the example passwords" >&2
  exit 2
fi

# Words are never globbed from here on (a bind address may be `*`).
set -f
# the values of DIRECTIVE (aclfile, include) in the configuration FILE, one a line
directive_in() {
  [ -r "$2" ] || return 0
  sed -n "s/^[[:space:]]*$1[[:space:]][[:space:]]*\"\{0,1\}\([^\"[:space:]]*\)\"\{0,1\}[[:space:]]*\$/\1/p" "$2"
}
# the files that may give users passwords: REDIS_CONF, the files it and the
# options include, the options' --aclfile, and every aclfile they name
scanned_files() {
  {
    printf '%s\n' "$conf"
    directive_in include "$conf"
    previous=
    for word in "$@"; do
      case $previous in --aclfile|--include) printf '%s\n' "$word" ;; esac
      previous=$word
    done
  } | while read -r file; do
    printf '%s\n' "$file"
    directive_in aclfile "$file"
  done | awk '!seen[$0]++'
}

cr=$(printf '\r')
given_hash=$(printf %s "${password%"$cr"}" | sha256sum | cut -c1-64)
examples=
while read -r hash user; do
  if [ -n "$hash" ] && [ "$given_hash" = "$hash" ]; then
    examples="${examples:+$examples; }$password_file (the $user's password)"
  fi
done <<HASHES
$EXAMPLE_PASSWORD_HASHES
HASHES
for file in $(scanned_files "$@"); do
  [ -r "$file" ] || continue  # Redis reports a missing file itself
  users=
  while read -r hash user; do
    if [ -n "$hash" ] && grep -q -e "#$hash" -e ">$user-example-password" "$file"; then
      users="$users $user"
    fi
  done <<HASHES
$EXAMPLE_PASSWORD_HASHES
HASHES
  if [ -n "$users" ]; then
    examples="${examples:+$examples; }$file (users$users)"
  fi
done

loopback=
if [ -n "$examples" ]; then
  if [ "$opt_in" != loopback-only ]; then
    {
      echo "start-redis: refusing to start Redis with the EXAMPLE passwords of" \
        "ops/redis/example-secrets: they are public, and whoever reaches this Redis" \
        "could log in with them (as installer: load code that every role runs)"
      echo "start-redis: found in: $examples"
      echo "start-redis: make your own passwords and users.acl (docs/operations.md#passwords);" \
        "only for a demo that nobody else can reach, set" \
        "STEPBARRIER_EXAMPLE_PASSWORDS=loopback-only (Redis then listens on loopback only)"
    } >&2
    exit 2
  fi
  # the last --bind among the options wins over REDIS_CONF's and the others
  bind=
  in_bind=
  for word in "$@"; do
    case $word in
      --bind) in_bind=1; bind= ;;
      --*) in_bind= ;;
      *) if [ -n "$in_bind" ]; then bind="$bind $word"; fi ;;
    esac
  done
  if [ -z "$bind" ]; then
    loopback="--bind 127.0.0.1 -::1"
    echo "start-redis: STEPBARRIER_EXAMPLE_PASSWORDS=loopback-only: the EXAMPLE (public)" \
      "passwords, for a demo on this machine: Redis listens on 127.0.0.1 and ::1 only" >&2
  else
    outside=
    for address in $bind; do
      case ${address#-} in
        127.*|::1) ;;
        *) outside="$outside $address" ;;
      esac
    done
    if [ -z "$outside" ]; then
      echo "start-redis: STEPBARRIER_EXAMPLE_PASSWORDS=loopback-only: the EXAMPLE (public)" \
        "passwords, on loopback only (--bind$bind)" >&2
    else
      echo "start-redis: WARNING: STEPBARRIER_EXAMPLE_PASSWORDS=loopback-only with the" \
        "EXAMPLE (public) passwords, and --bind$bind: this is for a demo that only this" \
        "machine can reach (docker-compose.yml: a private network, its port published on" \
        "127.0.0.1 only). Never let anyone else reach this Redis." >&2
    fi
  fi
fi

# $loopback: the words of a --bind, or nothing
# shellcheck disable=SC2086
redis-server "$conf" "$@" $loopback &
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
