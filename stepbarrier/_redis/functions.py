"""Our Lua code in Redis: the versioned Functions library ``stepbarrier_v<N>``, or
EVAL scripts by opt-in (``STEPBARRIER_USE_EVAL=1``); why no role runs ``EVAL``, and
who loads the library: docs/reliability-security.md#no-role-runs-code-of-its-own.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from collections.abc import Callable, Generator, Sequence
from typing import Any

from redis import exceptions as rex
from redis.cluster import RedisCluster

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._protocol import library as scripts
from stepbarrier._protocol.calls import Call, arrival_reply, split_arrival
from stepbarrier._redis.bounded import HeldConnection, HeldConnections, ensure_fresh
from stepbarrier._redis.client import RedisClient, refresh_topology, slot_client
from stepbarrier._redis.failures import is_transient
from stepbarrier.errors import RedisRefused

LIBRARY_VERSION = 4
"""Version of the Functions library; raise it whenever ``scripts.BODIES`` change
(a test compares ``LIBRARY_SHA256`` with the code)."""
LIBRARY_NAME = f"stepbarrier_v{LIBRARY_VERSION}"
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
    """Load (``replace``: upgrade in place) this version's library, on every master of a
    cluster (redis-py sends ``FUNCTION LOAD`` to all); its name. Older versions stay."""
    client.function_load(library_source(), replace=replace)
    return LIBRARY_NAME


def loaded_versions(client: RedisClient) -> list[int] | None:
    """Versions of stepbarrier libraries loaded on the server (``None``: cannot tell)."""
    try:
        return parse_versions(client.function_list(library="stepbarrier_v*"))
    except rex.RedisError:
        return None


def parse_versions(listed: Any) -> list[int]:
    """The versions in a ``FUNCTION LIST`` reply (a cluster answers per master: a
    version counts only if every master has it)."""
    per_node = list(listed.values()) if isinstance(listed, dict) else [listed]
    found = [_versions(entries) for entries in per_node]
    return sorted(set.intersection(*found)) if found else []


def _versions(entries: Any) -> set[int]:
    listed = [_version(entry) for entry in entries] if isinstance(entries, list) else []
    return {version for version in listed if version is not None}


def _version(entry: Any) -> int | None:
    if isinstance(entry, list):  # RESP2: a flat list of names and values
        entry = dict(zip(entry[0::2], entry[1::2], strict=False))
    if not isinstance(entry, dict):
        return None
    raw = entry.get(b"library_name", entry.get("library_name"))
    name = raw.decode() if isinstance(raw, bytes) else raw
    if isinstance(name, str) and name.startswith("stepbarrier_v") and name[13:].isdigit():
        return int(name[13:])
    return None


def is_missing_function(exc: BaseException) -> bool:
    """True if ``exc`` says the function (or FCALL itself) is not there."""
    text = str(exc).lower()
    return isinstance(exc, rex.ResponseError) and (
        "function not found" in text or ("unknown command" in text and "fcall" in text)
    )


class CodeCommands:
    """How stepbarrier's code is called (``FCALL``, or with ``use_eval`` an ``EVALSHA``
    of the helpers and the body), and what its replies ask for (no I/O): the part
    ``RedisCode`` and ``AsyncRedisCode`` share."""

    def __init__(self, use_eval: bool) -> None:
        self.use_eval = use_eval
        self.sources = {
            name: scripts.HELPERS + body for name, (body, _ro) in scripts.BODIES.items()
        }
        self._shas = {
            name: hashlib.sha1(text.encode()).hexdigest() for name, text in self.sources.items()
        }

    def commands(self, calls: Sequence[Call]) -> list[tuple[Any, ...]]:
        if not self.use_eval:
            return [function_command(name, keys, args) for name, keys, args in calls]
        return [
            ("EVALSHA", self._shas[name], len(keys), *keys, *args) for name, keys, args in calls
        ]

    def lacking(
        self, calls: Sequence[Call], replies: Sequence[Any]
    ) -> tuple[list[str], BaseException | None]:
        """What ``replies`` say the server lacks: the sources of scripts to load
        (``use_eval``), or the reply that says the library (or ``FCALL``) is missing."""
        if self.use_eval:
            named = zip(calls, replies, strict=True)
            names = {call[0] for call, reply in named if isinstance(reply, rex.NoScriptError)}
            return [self.sources[name] for name in sorted(names)], None
        missing = (r for r in replies if isinstance(r, Exception) and is_missing_function(r))
        return [], next(missing, None)


def raise_first(replies: Sequence[Any]) -> None:
    """Raise the first error among ``replies``, if any."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply


def needs_refresh(replies: Sequence[Any]) -> bool:
    """True if a reply says a cluster's slot map is worth reading again (``MOVED`` too)."""
    moved = (rex.ConnectionError, rex.TimeoutError, rex.AskError)
    return any(isinstance(reply, moved) for reply in replies)


def no_functions(missing: BaseException) -> bool:
    """True if ``missing`` says the server has no Functions at all (``FCALL`` unknown)."""
    return "unknown command" in str(missing).lower()


class RedisCode:
    """Runs stepbarrier's Lua code on one client, as functions or as scripts.

    Args:
        own_connection: Hold one connection of ``client``'s pool for every single
            ``call`` (not on a Cluster, nor with ``use_eval``) and send on it directly,
            for code one thread alone runs (the chief's writer): its releasing write
            goes out without redis-py's pool and client machinery in between. What
            redis-py does when a connection goes back to its pool (re-authenticating
            with a streaming credential provider, maintenance notifications) does not
            happen to it; ``close`` gives it back.

    A call given a ``timeout`` ends within it, loading missing code included, on a
    ``HeldConnection`` (``stepbarrier._redis.bounded``).
    """

    def __init__(
        self, client: RedisClient, config: BarrierConfig, *, own_connection: bool = False
    ) -> None:
        self._client = client
        self._config = config
        self._code = CodeCommands(config.use_eval)
        self._lock = threading.Lock()
        self._own = own_connection and not config.use_eval and not isinstance(client, RedisCluster)
        self._connection: Any = None  # a redis-py Connection (untyped)
        self._held = HeldConnections()  # for the calls given a timeout

    def call(
        self, name: str, keys: Sequence[Any], args: Sequence[Any], *, timeout: float | None = None
    ) -> Any:
        """Run ``scripts.BODIES[name]`` once (the caller retries), within ``timeout``
        if given; raises as ``pipeline`` (``TimeoutError`` past ``timeout``)."""
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
            ensure_fresh(connection)
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
        """Give back the ``own_connection`` one, and close the bounded calls' idle ones."""
        connection, self._connection = self._connection, None
        if connection is not None and not isinstance(self._client, RedisCluster):
            self._client.connection_pool.release(connection)
        self._held.close()

    def pipeline(self, calls: Sequence[Call], *, timeout: float | None = None) -> list[Any]:
        """Run several pieces in one round trip, in order (not as a transaction).

        Raises:
            RedisRefused: The library is missing and this user may not load it,
                or the server has no Functions.
            redis.RedisError: The first error a call raised.
        """
        replies = self.replies(calls, timeout=timeout)
        raise_first(replies)
        return replies

    def replies(self, calls: Sequence[Call], *, timeout: float | None = None) -> list[Any]:
        """Like ``pipeline``, but each call's error is returned in its reply's place (the
        round trip's own failure is raised). A call longer than its function takes (an
        arrival restoring more than ``MAX_RESTORED``) goes as several, in order, in the
        same round trip, and has one reply (``arrival_reply``)."""
        sent, parts = _as_sent(calls)
        # (calls without keys on a Cluster have no owner: its client routes them itself)
        owner = None if timeout is None else self._owner(sent)
        try:
            if owner is None:
                replies = self._run(sent)
                if self._load(sent, replies, None, 0.0):
                    replies = self._run(sent)
            else:
                assert timeout is not None
                replies = self._bounded(owner.connection_pool, sent, timeout)
        except (rex.ConnectionError, rex.TimeoutError, rex.ClusterError, OSError):
            refresh_topology(self._client)  # (a cluster's) the retry then reaches the owner
            raise
        if needs_refresh(replies):
            refresh_topology(self._client)
        return _as_called(replies, parts)

    def _run(self, calls: Sequence[Call]) -> list[Any]:
        # Every call of one job touches one slot: on a Cluster they go straight to
        # its owner in a plain pipeline. A cluster pipeline would first ask a node
        # for the keys of each FCALL (COMMAND GETKEYS, twice), two round trips per
        # call; a MOVED reply comes back as an error, and the caller's retry goes
        # to the owner of the slot map read again.
        pipe = (self._owner(calls) or self._client).pipeline(transaction=False)
        for command in self._code.commands(calls):
            pipe.execute_command(*command)
        return list(pipe.execute(raise_on_error=False))

    def _owner(self, calls: Sequence[Call]) -> Any:
        if not calls[0][1]:
            return None if isinstance(self._client, RedisCluster) else self._client
        return slot_client(self._client, calls[0][1][0])

    def _bounded(self, pool: Any, calls: Sequence[Call], timeout: float) -> list[Any]:
        """``calls``' replies within ``timeout`` seconds, on a held connection of ``pool``."""
        until = time.monotonic() + timeout
        held = self._held.take(pool)
        commands = self._code.commands(calls)
        try:
            replies = held.run(commands, timeout)
            if self._load(calls, replies, held, until):
                replies = held.run(commands, _left(until))
            if any(isinstance(r, rex.ReadOnlyError) for r in replies):
                held.disconnect()  # a replica now (a failover behind one name): reconnect
        finally:
            if held.connected:
                self._held.give(held)
        return replies

    def _load(
        self, calls: Sequence[Call], replies: list[Any], held: HeldConnection | None, until: float
    ) -> bool:
        """Load the code ``replies`` say is missing (on ``held`` within ``until``, if
        given), or explain why it cannot be; True if the calls are to run again."""
        sources, missing = self._code.lacking(calls, replies)
        for source in sources:
            if held is None:
                self._client.script_load(source)
            else:
                raise_first(held.run([("SCRIPT", "LOAD", source)], _left(until)))
        if missing is not None:
            if held is None or isinstance(self._client, RedisCluster):
                self._load_or_explain(missing)  # a cluster's client loads it on every master
            else:
                self._load_library(missing, lambda command: held.run([command], _left(until))[0])
        return bool(sources) or missing is not None

    def _load_or_explain(self, missing: BaseException) -> None:
        with self._lock:  # one thread loads it; the others then find it there
            self._load_library(missing, self._send)

    def _send(self, command: tuple[Any, ...]) -> Any:
        return self._client.execute_command(*command)  # type: ignore[no-untyped-call]

    def _load_library(self, missing: BaseException, run: Callable[[tuple[Any, ...]], Any]) -> None:
        """``load_library``, each command sent with ``run``."""
        steps = load_library(self._config, missing)
        with contextlib.suppress(StopIteration):
            command = next(steps)
            while True:
                try:
                    reply = run(command)
                except rex.RedisError as exc:
                    reply = exc
                command = steps.send(reply)


def load_library(config: BarrierConfig, missing: BaseException) -> Generator[Any, Any, None]:
    """Load the library, or explain why it cannot be (``RedisRefused``): yields the
    commands to send, and is sent each one's reply (an error reply in its place)."""
    if no_functions(missing):
        raise explain_refusal(config, missing) from missing
    loaded = yield ("FUNCTION LOAD", library_source())
    if isinstance(loaded, (rex.ConnectionError, rex.TimeoutError)) or (
        isinstance(loaded, rex.RedisError) and is_transient(loaded)
    ):
        # a Redis restarted while loading, a replica not yet synced (READONLY), BUSY,
        # LOADING: no refusal to load it; the caller retries, or says what it is
        raise loaded
    if isinstance(loaded, Exception) and "already exists" not in str(loaded):
        listed = yield ("FUNCTION LIST", "LIBRARYNAME", "stepbarrier_v*")
        raise explain_refusal(config, missing, listed) from loaded


def _as_sent(calls: Sequence[Call]) -> tuple[list[Call], list[int]]:
    """``calls`` as sent (a too long arrival split), and how many were sent for each."""
    split = [split_arrival(call) if call[0] == "barrier_arrive" else [call] for call in calls]
    return [part for parts in split for part in parts], [len(parts) for parts in split]


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


def _left(until: float) -> float:
    """Seconds left of a bounded call: the rest of its round trips (loading missing
    code, then the calls again) get that, and a little at least (Redis answered)."""
    return max(LOAD_FLOOR, until - time.monotonic())


def function_command(name: str, keys: Sequence[Any], args: Sequence[Any]) -> tuple[Any, ...]:
    """The ``FCALL`` (``FCALL_RO`` for read-only code) that runs ``name``."""
    command = "FCALL_RO" if scripts.BODIES[name][1] else "FCALL"
    return (command, function_name(name), len(keys), *keys, *args)


def explain_refusal(
    config: BarrierConfig, missing: BaseException, listed: Any = None
) -> RedisRefused:
    """Why the code cannot run: no Functions at all, or a library this user may not load
    (``missing``: the error that said so; ``listed``: the ``FUNCTION LIST`` reply of
    stepbarrier's libraries, ``None`` or an error if unknown)."""
    where = f"Redis at {config.safe_url}"
    versions = None if listed is None or isinstance(listed, Exception) else parse_versions(listed)
    if no_functions(missing):
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
    """True for Redis's refusal of a write when it is full (``maxmemory``): a waiter's
    registration, mere guidance for the chief, fails so without failing its wait."""
    return isinstance(reply, rex.OutOfMemoryError) or (
        isinstance(reply, rex.ResponseError) and str(reply).startswith("OOM")
    )
