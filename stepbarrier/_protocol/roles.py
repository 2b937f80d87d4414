"""The Redis ACL rules of stepbarrier's roles, for the jobs whose names match a pattern.

``ops/redis/users.acl`` is these rules for the jobs ``*``; ``stepbarrier acl``
prints them for one team's jobs (``team-a-*``). No role may run Lua of its own:
the roles call the shipped Functions library, whose inner commands run as the
calling user, so a role also holds those commands and the key permissions they
need (each command below is there because an operation of the role runs it;
``tests/security`` runs every operation under the rules). So no rule can
withhold a write the library makes, nor bound its number of arguments
(docs/reliability-security.md#threat-model; ``tests/security/test_variadic_writes.py``).
"""

from __future__ import annotations

import hashlib
import re

from stepbarrier._protocol.keys import JobKeys, job_index
from stepbarrier.errors import ConfigurationError

JOB_ROLES = ("chief", "worker", "monitor")
"""Roles confined to the jobs of a pattern."""
ADMIN_ROLES = ("emergency", "installer")
"""Roles that touch no job: ending a runaway function, loading the library."""
ROLES = JOB_ROLES + ADMIN_ROLES
"""Every role ``acl_line`` knows."""

_JOBS_PATTERN = re.compile(r"[A-Za-z0-9._*?-]{1,64}")
_USER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_SHA256 = re.compile(r"[0-9a-f]{64}")

_RESET = "resetkeys resetchannels -@all"
# SELECT: a URL may name another database than 0 (redis-py selects it on
# connect). CLUSTER SLOTS and COMMAND: a Redis Cluster client reads the slot map
# and the command table when it starts (metadata only; refused on a server
# without cluster mode, harmless there).
_CONNECT = "+select +cluster|slots +command"
# What every job role reads through the library: FCALL_RO waiter_read (TIME,
# TYPE, STRLEN, GET, HLEN, OBJECT ENCODING, HSTRLEN, HMGET: the state, the reset
# marker and the barriers, each hash's size checked before it is read, as
# docs/protocol.md#bounds tells; never HGETALL, docs/reliability-security.md#threat-model);
# FUNCTION LIST names a missing or other library version in the error.
_READS = (
    "+fcall_ro +function|list +time +type +get +strlen +hlen +object|encoding +hstrlen +hmget "
    "+zcard"
)
# What `status` and `watch` run besides (and `publish` before it writes): ZCARD
# then ZRANGEBYSCORE (always with LIMIT) of the targets and barrier indexes,
# then HLEN, HSTRLEN and HMGET of the waiter entries they name.
_LISTING = "+zrangebyscore"
# What a worker writes and listens to, each of bounded cost (WORKER_BOUNDED).
_WORKER_OWN = (
    "+hset +expire +zcount +zadd +zrem +rpush +ltrim +subscribe +ssubscribe +hget +unlink +llen"
)
_PUBLISH = "+publish +spublish"

_COMMANDS = {
    # +fcall: begin_generation, publish_step, reset_job, may_write (the declared
    # keys need read and write). Inside them: TIME, TYPE, HGET, EXISTS, GET,
    # HSET, UNLINK, SET, EXPIRE, ZCOUNT, ZRANGEBYSCORE, ZREMRANGEBYRANK,
    # PUBLISH (SPUBLISH on a Redis Cluster: a sharded channel, in the job's
    # slot). Outside: BLPOP on the registrations (hears new waiters at once)
    # then LPOP of a batch of them, and `reset` (UNLINK of waiter entries by
    # batches, EXISTS). Named barriers (the chief is task 0): barrier_arrive
    # (TYPE, HGET, HSET, UNLINK, EXPIRE, ZCARD, ZADD, ZREMRANGEBYSCORE and
    # ZREMRANGEBYRANK to prune the barrier index, PUBLISH/SPUBLISH), then
    # SUBSCRIBE (SSUBSCRIBE) to the barrier channel; EXPIRE of a finished run's
    # barriers. A chief's user may wait too (waiter_register: RPUSH and LTRIM of
    # the registrations, as a worker's). report_progress (the chief reports its
    # own step as task 0) on the job's progress hash. job_index (TYPE, ZCARD,
    # UNLINK, TIME, ZADD, ZREMRANGEBYSCORE, ZREMRANGEBYRANK, EXPIRE) on its
    # team's job index (STEPBARRIER_JOBS_PATTERN). The range commands: see
    # docs/reliability-security.md#threat-model.
    "chief": f"{_CONNECT} +fcall {_READS} {_LISTING} +hget +exists +hset +set +expire "
    "+zremrangebyscore +publish +spublish +blpop +zadd +zremrangebyrank +subscribe +ssubscribe "
    "+unlink +zcount +lpop +rpush +ltrim",
    # Only commands whose cost is bounded by their arguments (WORKER_BOUNDED).
    # +fcall: waiter_register (EXPIRE, UNLINK, HSET, ZCOUNT, ZADD, LLEN, RPUSH,
    # LTRIM: a list is trimmed node by node, 0.3 ms for a million entries) and
    # waiter_leave (UNLINK, TYPE, ZREM), which declare only what a waiter
    # writes; the state and the reset marker it reads with waiter_read (FCALL_RO,
    # which declares them read-only). SUBSCRIBE (SSUBSCRIBE on a Redis Cluster):
    # the job's channel; a wait ends by closing its connection, never by
    # UNSUBSCRIBE. Named barriers: barrier_arrive (also HGET; its pruning of the
    # barrier index is the chief's, refused and skipped for a worker) on the
    # barrier keys only, and its announcement (below: _BARRIER_NEWS).
    # report_progress on the job's progress hash: the task's own step. `status`
    # and `watch` take the monitor user.
    "worker": f"{_CONNECT} +fcall {_READS} {_WORKER_OWN}",
    # The status reads only (no FCALL: nothing that may write); PING for health
    # checks and ZRANGE for redis-cli (docs/operations.md#through-the-redis-keys).
    # SCAN: `stepbarrier jobs` and the exporter read a pattern's job index
    # (index_read), and find the jobs of a pattern without one by their state
    # keys, with a bounded COUNT. SCAN names no key, so the key patterns do not
    # confine it: it shows the names (never the contents) of every key, other
    # teams' jobs included.
    "monitor": f"{_CONNECT} {_READS} {_LISTING} +ping +zrange +scan",
}

WORKER_BOUNDED = frozenset(
    rule.removeprefix("+") for rule in f"{_COMMANDS['worker']} {_PUBLISH}".split()
)
"""The commands a worker may run (its rules and its barrier selector), each of
bounded cost whatever the worker wrote before: O(1), O(log N) or O(its
arguments), or (LTRIM, UNLINK) freeing memory off Redis's main thread; not
small for all that (docs/reliability-security.md#threat-model).
``tests/security/test_shared_redis.py`` checks that Redis grants exactly these."""

_BARRIER_NEWS = "({publish} &{channel})"
"""A worker's ACL selector: the last arrival at a barrier announces it (PUBLISH, or
SPUBLISH on a Redis Cluster), on the job's barrier channel alone. A selector
holds its own channels, so the worker still cannot publish on the step channel:
a forged step announcement would release waiting workers."""

EMERGENCY_COMMANDS = "+function|kill +script|kill +function|stats +ping"
"""While code runs past ``busy-reply-threshold`` Redis answers BUSY to every
command but these (and SHUTDOWN NOSAVE): FUNCTION STATS names what runs,
FUNCTION KILL ends a function (SCRIPT KILL an EVAL script, for servers on the
``STEPBARRIER_USE_EVAL`` fallback) as long as it has written nothing, and PING
shows that Redis answers again. INFO and CLIENT LIST get BUSY too."""

INSTALLER_COMMANDS = (
    "+function|load +function|list +function|delete +function|stats +ping +cluster|slots +command"
)
"""``stepbarrier functions install`` (FUNCTION LOAD REPLACE), ``functions status``
and health checks (FUNCTION LIST), retiring an old version (FUNCTION DELETE),
seeing what runs (FUNCTION STATS), and PING while Redis starts; CLUSTER SLOTS and
COMMAND for ``--cluster``, whose client reads the slot map and the command table
(metadata only) to load the library on every master."""


def validate_jobs_pattern(pattern: str, variable: str = "jobs") -> str:
    """``pattern``, a job name in which ``*`` matches any characters and ``?`` one (Redis's
    glob). Brackets and backslashes are refused: job names cannot hold them, and in a key
    pattern they would mean something else. A message names ``variable`` (``"jobs"``: the
    jobs pattern)."""
    if not isinstance(pattern, str) or _JOBS_PATTERN.fullmatch(pattern) is None:
        name = "the jobs pattern" if variable == "jobs" else variable
        raise ConfigurationError(
            f"{name} must be 1 to 64 characters from letters, digits, '.', '_', "
            f"'-', '*' (any characters) and '?' (one character), got {repr(pattern)[:80]}",
            variable=variable,
        )
    return pattern


def validate_user(user: str) -> str:
    """``user``, an ACL user name; ``default`` is refused: Redis gives its rights to every
    client that has not authenticated."""
    if not isinstance(user, str) or _USER.fullmatch(user) is None:
        raise ConfigurationError(
            "the user name must be 1 to 64 characters from letters, digits, '.', '_' and "
            f"'-', starting with a letter or digit, got {user!r}",
            variable="user",
        )
    if user == "default":
        raise ConfigurationError(
            "the user 'default' is every client that has not authenticated: give the role "
            "to a user of its own, and keep 'user default off'",
            variable="user",
        )
    return user


def role_rules(role: str, jobs_pattern: str) -> str:
    """The ACL rules of a job role for the jobs whose names match ``jobs_pattern``.

    Job names hold no ``{``, ``}`` or ``:``, so a key of one job matches only
    its own patterns: the worker's writable patterns never match a state or a
    reset marker, and ``team-a-*`` never matches a key of ``team-b-1``. It
    does match ``team-a-b-1``: give teams prefixes that do not start one another.
    Returns the rules that follow ``user NAME on #<hash>`` in users.acl; raises
    ``ConfigurationError`` for an unknown role or an invalid pattern.

    Example:
        >>> role_rules("monitor", "team-a-*").split()[3]
        '%R~stepbarrier:{team-a-*}:state'
    """
    if role not in JOB_ROLES:
        raise ConfigurationError(
            f"the role must be one of {', '.join(JOB_ROLES)}, got {role!r}", variable="role"
        )
    keys = JobKeys.for_job(validate_jobs_pattern(jobs_pattern))
    barriers = (keys.barrier_index, keys.barrier("*"))  # every barrier hash
    news: list[str] = []
    if role == "chief":
        access = [f"~{key}" for key in (*keys.all_fixed(), keys.waiter_pattern, *barriers)]
        # its own pattern's job index alone: the name's '*' and '?' escaped, so that
        # 'team-?' does not match the index of 'team-*' (nor 'team-*' that of 'team-a*')
        access += [f"~{keys.progress}", f"~{_escaped(job_index(jobs_pattern))}"]
    elif role == "worker":
        # read-only: the state and the reset marker are the chief's alone
        access = [f"%R~{keys.state}", f"%R~{keys.reset}", f"%RW~{keys.waiter_pattern}"]
        access += [f"%RW~{keys.targets}", f"%RW~{keys.registrations}"]
        access += [f"%RW~{key}" for key in barriers]
        # its own progress (report_progress: TYPE, HSTRLEN, HLEN, HGET, HSET,
        # EXPIRE, UNLINK; every one of them a worker holds already)
        access.append(f"%RW~{keys.progress}")
        news = [_BARRIER_NEWS.format(publish=_PUBLISH, channel=keys.barrier_channel)]
    else:
        access = [f"%R~{key}" for key in (keys.state, keys.reset, keys.targets)]
        access += [f"%R~{key}" for key in (keys.waiter_pattern, *barriers, keys.progress)]
        access.append(f"%R~{job_index(jobs_pattern)}")
    channel = [] if role == "monitor" else [f"&{keys.channel}", f"&{keys.barrier_channel}"]
    return " ".join([_RESET, *access, *channel, _COMMANDS[role], *news])


def _escaped(key: str) -> str:
    """An ACL key pattern that matches ``key`` alone (its glob characters escaped)."""
    return key.replace("*", "\\*").replace("?", "\\?")


def emergency_rules() -> str:
    """The ACL rules of the emergency role (``EMERGENCY_COMMANDS``; no key or channel)."""
    return f"{_RESET} {EMERGENCY_COMMANDS}"


def installer_rules() -> str:
    """The ACL rules of the installer role (``INSTALLER_COMMANDS``; no key)."""
    return f"{_RESET} {INSTALLER_COMMANDS}"


def rules_for(role: str, jobs_pattern: str | None) -> str:
    """The ACL rules of any role; the admin roles ignore ``jobs_pattern``."""
    if role not in ROLES:
        raise ConfigurationError(
            f"the role must be one of {', '.join(ROLES)}, got {role!r}", variable="role"
        )
    if role in ADMIN_ROLES:
        return emergency_rules() if role == "emergency" else installer_rules()
    if jobs_pattern is None:
        raise ConfigurationError(f"the {role} role needs a jobs pattern", variable="jobs")
    return role_rules(role, jobs_pattern)


def password_hash(password: str) -> str:
    """The SHA-256 (hex) that users.acl's ``#<hash>`` takes for ``password``."""
    return hashlib.sha256(password.encode("utf-8")).hexdigest()


def acl_line(user: str, role: str, jobs_pattern: str | None, password_sha256: str) -> str:
    """One users.acl line: ``user NAME on #<sha256> <rules>``.

    ``password_sha256``: the password's SHA-256 in hex (``password_hash()``): Redis
    stores only the hash, and the line never holds the password.

    Raises:
        ConfigurationError: An invalid user, role, pattern or hash.
    """
    if not isinstance(password_sha256, str) or _SHA256.fullmatch(password_sha256) is None:
        raise ConfigurationError(
            "the password hash must be 64 lowercase hexadecimal digits (a SHA-256)",
            variable="password",
        )
    return f"user {validate_user(user)} on #{password_sha256} {rules_for(role, jobs_pattern)}"
