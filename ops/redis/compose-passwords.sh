#!/bin/sh
# Fresh passwords for docker-compose.yml, made at every `up` by its `passwords`
# service: a random password for each user of an ACL file that has one (its
# `#<SHA-256>`), and a copy of that file with their SHA-256 in place of the
# shipped (example) ones, so that no example password is in use.
#
#   compose-passwords.sh USERS_ACL OUT_DIR
#
# USERS_ACL is ops/redis/users.acl: its rules are kept as they are, only the
# hashes change. OUT_DIR holds one directory per reader (docker-compose.yml
# mounts a volume of its own on each, and each container mounts only its own):
#
#   OUT_DIR/redis/users.acl          the ACL file Redis loads
#   OUT_DIR/USER/USER.password       for each USER with a directory of its own
#                                    (chief, worker, monitor)
#   OUT_DIR/redis/USER.password      for the others, the administrators
#                                    (installer: start-redis.sh; emergency)
#
# Every password is 32 random bytes as 64 hex digits, then a newline. Files are
# mode 0400; run as root, the script gives those under OUT_DIR/redis to
# REDIS_USER (default `redis`, the redis image's user) and the others to
# TASK_UID (default 10001, the user of ops/Dockerfile and
# ops/Dockerfile.exporter). No password is ever printed.
set -eu

if [ "$#" -ne 2 ]; then
  echo "usage: $0 USERS_ACL OUT_DIR" >&2
  exit 2
fi
source_acl=$1
out=$2
task_uid=${TASK_UID:-10001}
redis_user=${REDIS_USER:-redis}
if [ ! -r "$source_acl" ]; then
  echo "compose-passwords: cannot read $source_acl" >&2
  exit 2
fi
if [ ! -d "$out/redis" ]; then
  echo "compose-passwords: $out/redis is not a directory (Redis's volume)" >&2
  exit 2
fi
umask 077

users=$(sed -n 's/^user \([^ ]*\) on #[0-9a-f]\{64\} .*/\1/p' "$source_acl")
if [ -z "$users" ]; then
  echo "compose-passwords: $source_acl gives no user a password (#<SHA-256>)" >&2
  exit 2
fi
script=
for user in $users; do
  case $user in
    *[!A-Za-z0-9_-]*)
      echo "compose-passwords: $source_acl: unexpected user name '$user'" >&2
      exit 2 ;;
  esac
  password=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
  if [ "${#password}" -ne 64 ]; then
    echo "compose-passwords: could not read 32 random bytes from /dev/urandom" >&2
    exit 1
  fi
  hash=$(printf %s "$password" | sha256sum | cut -c1-64)
  if [ -d "$out/$user" ] && [ "$user" != redis ]; then
    file=$out/$user/$user.password
    owner=$task_uid
  else
    file=$out/redis/$user.password
    owner=$redis_user
  fi
  rm -f "$file"
  printf '%s\n' "$password" >"$file"
  chmod 0400 "$file"
  if [ "$(id -u)" = 0 ]; then
    chown "$owner" "$file"
  fi
  script="${script}s/^user $user on #[0-9a-f]\{64\} /user $user on #$hash /
"
done
unset password

acl=$out/redis/users.acl
rm -f "$acl.new"
sed "$script" "$source_acl" >"$acl.new"
# every hash in the new file is one made here: none of the source's is left
count=$(printf '%s\n' $users | wc -l)
hashes=$(grep -o '#[0-9a-f]\{64\}' "$acl.new" | wc -l)
if [ "$hashes" -ne "$count" ] || grep -q ' >' "$acl.new" \
  || grep -o '#[0-9a-f]\{64\}' "$source_acl" | grep -q -F -f - "$acl.new"; then
  echo "compose-passwords: $source_acl has a password the script cannot replace" \
    "(expected one '#<SHA-256>' on each 'user NAME on' line, and no '>password')" >&2
  rm -f "$acl.new"
  exit 1
fi
chmod 0400 "$acl.new"
if [ "$(id -u)" = 0 ]; then
  chown "$redis_user" "$acl.new"
fi
mv -f "$acl.new" "$acl"
echo "compose-passwords: new passwords for" $users "(the ACL file: $acl)"
