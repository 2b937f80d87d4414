"""Our Lua code in Redis: a versioned Functions library, or EVAL scripts by opt-in.

No role of a shared Redis needs ``EVAL`` (which would let any holder of a
worker's password run a loop that blocks Redis for every job): the code is
loaded once as the Redis Functions library ``stepbarrier_v<LIBRARY_VERSION>``
and called with ``FCALL``/``FCALL_RO``. A new version of the code is a new
library name, so clients of two stepbarrier versions can share one Redis while
it is upgraded.

Loading it is an administrator's job (``stepbarrier functions install``). A
client that finds the library missing loads it itself when its user may
(``FUNCTION LOAD``: a private Redis, the tests, the demo), and otherwise raises
``RedisRefused`` naming the command to run. Servers without Functions (Redis
6, some managed services) work with ``STEPBARRIER_USE_EVAL=1``, at the price of
granting ``+eval``/``+evalsha`` to the roles.

Every function refuses more arguments than the library's limits allow
(``stepbarrier._protocol.library``: bounded calls); the one call the library
may make longer, an arrival that records many lost arrivals again, is sent as
several (``split_arrival``) and answered as one.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Sequence
from typing import Any

from redis import exceptions as rex
from redis.cluster import RedisCluster
from redis.commands.core import Script

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._protocol import library as scripts
from stepbarrier._protocol.barrier_library import arrival_reply, split_arrival
from stepbarrier._protocol.calls import Call
from stepbarrier._redis.bounded import HeldConnection, HeldConnections
from stepbarrier._redis.client import RedisClient, refresh_topology
from stepbarrier.errors import RedisRefused

LIBRARY_VERSION = 3
"""Version of the Functions library; raise it whenever ``scripts.BODIES`` change
(a test compares ``LIBRARY_SHA256`` with the code)."""
LIBRARY_NAME = f"stepbarrier_v{LIBRARY_VERSION}"
"""Name of the library in Redis (``FUNCTION LIST LIBRARYNAME stepbarrier``)."""
LOAD_FLOOR = 0.1
"""Seconds a bounded call's loading of missing code (and its calls' second try)
is given at least, once Redis has answered that the code is missing."""


def publish_command(config: BarrierConfig) -> str:
    """How the code announces: ``SPUBLISH`` (sharded) on a Redis Cluster, else ``PUBLISH``."""
    return "SPUBLISH" if config.redis_cluster else "PUBLISH"


def function_name(name: str) -> str:
    """The Redis function that runs ``scripts.BODIES[name]``."""
    return f"{LIBRARY_NAME}_{name}"


def library_source() -> str:
    """The library's Lua source, as ``FUNCTION LOAD`` takes it."""
    parts = [f"#!lua name={LIBRARY_NAME}", scripts.HELPERS]
    for name, (body, read_only) in scripts.BODIES.items():
        flags = "{'no-writes'}" if read_only else "{}"
        parts.append(
            f"local function {name}(KEYS, ARGV)\n{body.strip()}\nend\n"
            f"redis.register_function{{function_name='{function_name(name)}', "
            f"callback={name}, flags={flags}}}"
        )
    parts.append(
        f"redis.register_function{{function_name='{function_name('version')}', "
        f"callback=function() return {LIBRARY_VERSION} end, flags={{'no-writes'}}}}"
    )
    return "\n".join(parts) + "\n"


def library_sha256() -> str:
    """Fingerprint of the library's source."""
    return hashlib.sha256(library_source().encode()).hexdigest()


def install_functions(client: RedisClient, *, replace: bool = True) -> str:
    """Load (or with ``replace``, upgrade in place) this version's library.

    Idempotent. Older versions' libraries stay for older clients. A cluster
    client loads it on every master (redis-py sends ``FUNCTION LOAD`` to all).

    Returns:
        The library's name.
    """
    client.function_load(library_source(), replace=replace)
    return LIBRARY_NAME


def loaded_versions(client: RedisClient) -> list[int] | None:
    """Versions of stepbarrier libraries loaded on the server (``None``: cannot tell)."""
    try:
        listed: Any = client.function_list(library="stepbarrier_v*")
    except rex.RedisError:
        return None
    # a cluster answers per master: a version counts only if every master has it
    return parse_versions(listed)


def parse_versions(listed: Any) -> list[int]:
    """The versions in a ``FUNCTION LIST`` reply (a cluster's: those every master has)."""
    per_node = list(listed.values()) if isinstance(listed, dict) else [listed]
    found = [_versions(entries) for entries in per_node]
    return sorted(set.intersection(*found)) if found else []


def _versions(entries: Any) -> set[int]:
    versions = set()
    for entry in entries if isinstance(entries, list) else []:
        name = _library_name(entry)
        if name and name.startswith("stepbarrier_v") and name[13:].isdigit():
            versions.add(int(name[13:]))
    return versions


def _library_name(entry: Any) -> str | None:
    if isinstance(entry, dict):
        raw = entry.get(b"library_name", entry.get("library_name"))
    elif isinstance(entry, list):  # RESP2: a flat list of names and values
        pairs = dict(zip(entry[0::2], entry[1::2], strict=False))
        raw = pairs.get(b"library_name", pairs.get("library_name"))
    else:
        return None
    return raw.decode() if isinstance(raw, bytes) else raw if isinstance(raw, str) else None


def is_missing_function(exc: BaseException) -> bool:
    """True if ``exc`` says the function (or FCALL itself) is not there."""
    text = str(exc).lower()
    return isinstance(exc, rex.ResponseError) and (
        "function not found" in text or ("unknown command" in text and "fcall" in text)
    )


class RedisCode:
    """Runs stepbarrier's Lua code on one client, as functions or as scripts.

    Args:
        client: The redis-py client to run it on.
        config: The job's settings (``use_eval``, and the URL for messages).
        own_connection: Hold one connection of ``client``'s pool for every
            single ``call`` (not on a Redis Cluster, nor with ``use_eval``), and
            send on it directly: for code that one thread alone runs (the
            chief's writer thread), whose releasing write then goes out without
            redis-py's pool and client machinery in between. ``close`` gives
            it back. What redis-py does when a connection goes back to its
            pool (re-authenticating with a streaming credential provider,
            maintenance notifications) does not happen to it, and the client's
            ``Retry`` is not used (stepbarrier's clients make no retries).

    A call given a ``timeout`` (a wait's calls: ``call``, ``replies``,
    ``pipeline``) ends within it, against a Redis that hangs too: it runs on a
    ``HeldConnection`` whose connect and replies are bounded by it, and loading
    missing code is part of it (thread-safe; ``close`` closes the idle ones).
    """

    def __init__(
        self, client: RedisClient, config: BarrierConfig, *, own_connection: bool = False
    ) -> None:
        self._client = client
        self._config = config
        self._scripts: dict[str, Script] = {}
        self._lock = threading.Lock()
        self._own = own_connection and not config.use_eval and not isinstance(client, RedisCluster)
        self._connection: Any = None  # a redis-py Connection (untyped)
        self._held = HeldConnections()  # for the calls given a timeout
        if config.use_eval:
            for name, (body, _read_only) in scripts.BODIES.items():
                self._scripts[name] = client.register_script(scripts.HELPERS + body)

    def call(
        self, name: str, keys: Sequence[Any], args: Sequence[Any], *, timeout: float | None = None
    ) -> Any:
        """Run one piece of code (one try; the caller retries transient errors).

        Args:
            name: The code's name (``scripts.BODIES``).
            keys: Its keys.
            args: Its arguments.
            timeout: Seconds the call may take at most, connecting and loading
                the code included (``None``: the client's own timeouts).

        Raises:
            RedisRefused: As ``pipeline``.
            redis.RedisError: What the call raised (``TimeoutError`` past ``timeout``).
        """
        if (
            timeout is not None
            or self._config.use_eval
            or isinstance(self._client, RedisCluster)
            or (name == "barrier_arrive" and len(split_arrival((name, keys, args))) > 1)
        ):
            return self.pipeline([(name, keys, args)], timeout=timeout)[0]
        # One call is one plain command, not a pipeline of one: the chief's write
        # to release workers runs on this path, and a pipeline runs about twice
        # the code of redis-py between the call and the socket (bench/wake_path.py)
        command = function_command(name, keys, args)
        execute: Any = self._on_own_connection if self._own else self._client.execute_command
        try:
            return execute(*command)
        except rex.ResponseError as exc:
            if not is_missing_function(exc):
                raise
            self._load_or_explain(exc)
            return execute(*command)

    def _on_own_connection(self, *command: Any) -> Any:
        connection = self._connection
        if connection is None:
            assert not isinstance(self._client, RedisCluster)
            connection = self._connection = self._client.connection_pool.get_connection()
        try:
            _ready(connection)
            connection.send_command(*command)
            return connection.read_response()
        except rex.ReadOnlyError:
            # a replica now (a failover behind one name): the next call reconnects
            connection.disconnect()
            raise
        except rex.ResponseError:
            raise  # the reply was read whole: the connection is fine
        except BaseException:
            # a reply half read (or never) must not be taken for the next call's
            connection.disconnect()
            raise

    def close(self) -> None:
        """Give the connection held for ``own_connection`` back to the pool, and close
        the idle connections of the calls given a timeout."""
        connection, self._connection = self._connection, None
        if connection is not None and not isinstance(self._client, RedisCluster):
            self._client.connection_pool.release(connection)
        self._held.close()

    def pipeline(self, calls: Sequence[Call], *, timeout: float | None = None) -> list[Any]:
        """Run several pieces in one round trip, in order (not as a transaction).

        Args:
            calls: The calls.
            timeout: Seconds the round trip may take at most (see ``call``).

        Raises:
            RedisRefused: The library is missing and this user may not load it,
                or the server has no Functions.
            redis.RedisError: Whatever else a call raised (the first error).
        """
        replies = self.replies(calls, timeout=timeout)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    def replies(self, calls: Sequence[Call], *, timeout: float | None = None) -> list[Any]:
        """Like ``pipeline``, but each call's error is returned in its reply's place.

        A call longer than its function takes (an arrival restoring more than
        ``MAX_RESTORED`` arrivals) goes as several, in order, in the same round
        trip, and has one reply (``arrival_reply``).

        Raises:
            RedisRefused: The library is missing and this user may not load it,
                or the server has no Functions.
            redis.RedisError: The round trip itself failed (a connection error, or
                no reply within ``timeout``).
        """
        sent, parts = _as_sent(calls)
        return _as_called(self._replies(sent, timeout), parts)

    def _replies(self, calls: Sequence[Call], timeout: float | None) -> list[Any]:
        if timeout is not None:
            pool = self._pool_of(calls)
            if pool is not None:
                return self._bounded(pool, calls, timeout)
        replies = self._run(calls)
        if not self._config.use_eval and any(
            isinstance(r, Exception) and is_missing_function(r) for r in replies
        ):
            self._load_or_explain(next(r for r in replies if isinstance(r, Exception)))
            replies = self._run(calls)
        return replies

    def _run(self, calls: Sequence[Call]) -> list[Any]:
        try:
            replies = self._send(calls)
        except (rex.ConnectionError, rex.TimeoutError, rex.ClusterError, OSError):
            refresh_topology(self._client)  # the retry then reaches the current owner
            raise
        moved = (rex.ConnectionError, rex.TimeoutError, rex.AskError)  # AskError: MOVED too
        if any(isinstance(r, moved) for r in replies):
            refresh_topology(self._client)
        return replies

    # -- calls given a timeout ----------------------------------------------------------

    def _pool_of(self, calls: Sequence[Call]) -> Any:
        """The pool whose settings a bounded round trip of ``calls`` connects with: the
        client's, or on a Cluster its slot owner's (``None``: calls without keys,
        which a cluster client routes itself)."""
        if not isinstance(self._client, RedisCluster):
            return self._client.connection_pool
        if not calls[0][1]:
            return None
        owner = self._client.get_node_from_key(calls[0][1][0])  # type: ignore[no-untyped-call]
        return self._client.get_redis_connection(owner).connection_pool

    def _bounded(self, pool: Any, calls: Sequence[Call], timeout: float) -> list[Any]:
        """``replies`` within ``timeout`` seconds, on a held connection of ``pool``."""
        until = time.monotonic() + timeout
        held = self._held.take(pool)
        try:
            replies = held.run(self._commands(calls), timeout)
            if self._config.use_eval:
                named = zip(calls, replies, strict=True)
                unknown = {call[0] for call, reply in named if _no_script(reply)}
                if unknown:
                    loads = [("SCRIPT", "LOAD", self._scripts[n].script) for n in sorted(unknown)]
                    self._raise_first(held.run(loads, _left(until)))
                    replies = held.run(self._commands(calls), _left(until))
            else:
                absent = [r for r in replies if isinstance(r, Exception) and is_missing_function(r)]
                if absent:
                    self._load_bounded(held, absent[0], until)
                    replies = held.run(self._commands(calls), _left(until))
            if any(isinstance(r, rex.ReadOnlyError) for r in replies):
                held.disconnect()  # a replica now (a failover behind one name): reconnect
        except (rex.ConnectionError, rex.TimeoutError, OSError):
            refresh_topology(self._client)  # (a cluster's) the retry then reaches the owner
            raise
        finally:
            if held.connected:
                self._held.give(held)
        if any(
            isinstance(r, (rex.ConnectionError, rex.TimeoutError, rex.AskError)) for r in replies
        ):
            refresh_topology(self._client)
        return replies

    def _commands(self, calls: Sequence[Call]) -> list[tuple[Any, ...]]:
        if not self._config.use_eval:
            return [function_command(name, keys, args) for name, keys, args in calls]
        return [
            ("EVALSHA", self._scripts[name].sha, len(keys), *keys, *args)
            for name, keys, args in calls
        ]

    def _load_bounded(self, held: HeldConnection, missing: BaseException, until: float) -> None:
        """Load the library on ``held`` (within the call's time), or explain why not."""
        if "unknown command" in str(missing).lower():
            raise self._explain(missing, missing) from missing  # no Functions at all
        if isinstance(self._client, RedisCluster):
            self._load_or_explain(missing)  # on every master, with the cluster's client
            return
        (loaded,) = held.run([("FUNCTION", "LOAD", library_source())], _left(until))
        if not isinstance(loaded, Exception) or "already exists" in str(loaded):
            return  # (another client loaded it meanwhile)
        try:
            (listed,) = held.run(
                [("FUNCTION", "LIST", "LIBRARYNAME", "stepbarrier_v*")], _left(until)
            )
            versions = None if isinstance(listed, Exception) else parse_versions(listed)
        except rex.RedisError:
            versions = None
        raise explain_refusal(self._config, missing, versions) from loaded

    @staticmethod
    def _raise_first(replies: list[Any]) -> None:
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply

    # -- calls on the client's pool -----------------------------------------------------

    def _send(self, calls: Sequence[Call]) -> list[Any]:
        pipe: Any
        if isinstance(self._client, RedisCluster) and calls[0][1]:
            # Every call of one job touches one slot: send them straight to its
            # owner in a plain pipeline. A cluster pipeline would first ask a node
            # for the keys of each FCALL (COMMAND GETKEYS, twice), two round trips
            # per call; a MOVED reply comes back as an error, and the caller's
            # retry goes to the owner of the slot map read again above.
            owner = self._client.get_node_from_key(calls[0][1][0])  # type: ignore[no-untyped-call]
            pipe = self._client.get_redis_connection(owner).pipeline(transaction=False)
        else:
            pipe = self._client.pipeline(transaction=False)
        for name, keys, args in calls:
            if self._config.use_eval:
                self._scripts[name](keys=list(keys), args=list(args), client=pipe)
            else:
                pipe.execute_command(*function_command(name, keys, args))
        return list(pipe.execute(raise_on_error=False))

    def _load_or_explain(self, missing: BaseException) -> None:
        if "unknown command" in str(missing).lower():
            raise self._explain(missing, missing) from missing  # no Functions at all
        with self._lock:
            try:
                install_functions(self._client, replace=False)
                return
            except rex.ResponseError as exc:
                if "already exists" in str(exc):
                    return  # another client loaded it meanwhile
                refusal: BaseException = exc
            except rex.RedisError as exc:
                refusal = exc
        raise self._explain(missing, refusal) from refusal

    def _explain(self, missing: BaseException, refusal: BaseException) -> RedisRefused:
        versions = None
        if "unknown command" not in str(missing).lower():
            versions = loaded_versions(self._client)
        return explain_refusal(self._config, missing, versions)


def _as_sent(calls: Sequence[Call]) -> tuple[list[Call], list[int]]:
    """``calls`` as sent (an arrival restoring more than its function takes is split),
    and how many were sent for each."""
    sent: list[Call] = []
    parts: list[int] = []
    for call in calls:
        split = split_arrival(call) if call[0] == "barrier_arrive" else [call]
        sent += split
        parts.append(len(split))
    return sent, parts


def _as_called(replies: list[Any], parts: list[int]) -> list[Any]:
    """One reply per call given to ``_as_sent``, from the replies of what it sent."""
    if len(replies) == len(parts):
        return replies
    joined: list[Any] = []
    at = 0
    for count in parts:
        joined.append(replies[at] if count == 1 else arrival_reply(replies[at : at + count]))
        at += count
    return joined


def _no_script(reply: object) -> bool:
    return isinstance(reply, rex.NoScriptError)


def _left(until: float) -> float:
    """Seconds left of a bounded call: the rest of its round trips (loading missing
    code, then the calls again) get that, and a little at least (Redis answered)."""
    return max(LOAD_FLOOR, until - time.monotonic())


def _ready(connection: Any) -> None:
    """What redis-py's pool checks before it hands a connection out: one that Redis
    dropped meanwhile (a restart, its ``timeout``, a proxy's idle cut) is made
    again, so that the write after a long pause does not fail on it.

    ``connect()`` is also where a Sentinel's connection asks for the master
    (``send_command`` would reconnect to the address it had).
    """
    try:
        connection.connect()
        if connection.can_read():  # a closed socket reads as ready (EOF)
            raise rex.ConnectionError("the connection has unread data")
    except (rex.ConnectionError, rex.TimeoutError, OSError):
        connection.disconnect()
        connection.connect()


def function_command(name: str, keys: Sequence[Any], args: Sequence[Any]) -> tuple[Any, ...]:
    """The ``FCALL`` (``FCALL_RO`` for read-only code) that runs ``name``."""
    command = "FCALL_RO" if scripts.BODIES[name][1] else "FCALL"
    return (command, function_name(name), len(keys), *keys, *args)


def explain_refusal(
    config: BarrierConfig, missing: BaseException, versions: list[int] | None
) -> RedisRefused:
    """Why the code cannot run: no Functions at all, or a library this user may not load.

    Args:
        config: The job's settings (for the URL and the job).
        missing: The error that said the function (or ``FCALL``) is not there.
        versions: The stepbarrier library versions on the server (``None``: unknown).
    """
    where = f"Redis at {config.safe_url}"
    if "unknown command" in str(missing).lower():
        message = (
            f"{where} has no Redis Functions (Redis 7 or later needed). On a server "
            "without them set STEPBARRIER_USE_EVAL=1: the roles then need +eval and "
            "+evalsha, which let any holder of their passwords run Lua of their own"
        )
    else:
        found = (
            "cannot list its libraries"
            if versions is None
            else "has no stepbarrier Functions library"
            if not versions
            else "has stepbarrier Functions library version(s) " + ", ".join(map(str, versions))
        )
        message = (
            f"{where} {found}, and this stepbarrier needs version {LIBRARY_VERSION} "
            f"({LIBRARY_NAME}); this user may not load it. Run `stepbarrier functions "
            "install` as an administrator (see ops/redis/users.acl)"
        )
    return RedisRefused(message, kind="functions", job=config.job)


def is_out_of_memory(reply: object) -> bool:
    """True for Redis's refusal of a write when it is full (``maxmemory``, ``noeviction``).

    A waiter's registration is only guidance for the chief: a full Redis must
    not fail a wait whose read (which needs no memory) succeeded.
    """
    return isinstance(reply, rex.OutOfMemoryError) or (
        isinstance(reply, rex.ResponseError) and str(reply).startswith("OOM")
    )
