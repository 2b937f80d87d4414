"""A TCP proxy between a client and Redis that can lose the reply of one command.

    proxy = ReplyDroppingProxy(redis_port).start()
    client = redis.Redis(port=proxy.port)        # every byte goes through the proxy
    proxy.drop_reply(PUBLISH_STEP)                # arm it: the next such command...
    # ...reaches Redis and is applied; its reply never reaches the client, whose
    # connection is then cut (the client sees a broken connection and retries)
    proxy.dropped.wait(timeout)                   # set once a reply was dropped

A lost reply is what a client cannot tell from a lost command: the write may or
may not have happened. The stateful fault test (test_protocol_stateful.py) puts
one of these in front of each chief, so that a chief's ``publish_step`` can be
applied by Redis while the chief never learns what Redis answered (issue 32:
"a lost reply"). The proxy does not parse RESP: it finds the armed command by
a byte pattern in what the client sends (``PUBLISH_STEP``: the function's name as
an argument, with RESP's line end, which the library's source in a ``FUNCTION
LOAD`` does not hold), which is exact for a client that waits for each reply before its next
command (a chief's writer does, on a connection of its own). Only a reply that
says the command ran is lost: an error reply (the command did not run, say the
function was not loaded yet) passes, and the next such command loses its reply.

Every client connection gets its own connection to Redis, and two threads pump
bytes; when either side closes, both are closed (a Redis killed or a ``CLIENT
KILL`` cuts the client too, as it would without the proxy).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass, field

CHUNK = 65536

PUBLISH_STEP = b"publish_step\r\n"
"""What a stepbarrier chief's write sends: the ``publish_step`` function's name as an
argument of ``FCALL`` (a pattern for ``drop_reply``)."""


@dataclass(eq=False)
class _Link:
    """One client connection and its connection to Redis."""

    client: socket.socket
    upstream: socket.socket
    dropping: bytes | None = None  # the pattern whose command's reply comes next
    tail: bytes = b""  # the client's last bytes, for a pattern split across two reads
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class ReplyDroppingProxy:
    """Forwards ``127.0.0.1:port`` to Redis at ``upstream_port``; loses replies on demand.

    Args:
        upstream_port: Redis's port on loopback (it may restart on it: each new
            client connection connects anew).
        host: Redis's host.
    """

    def __init__(self, upstream_port: int, host: str = "127.0.0.1") -> None:
        self.upstream = (host, upstream_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._armed: list[bytes] = []  # patterns whose next command loses its reply
        self._links: set[_Link] = set()
        self._stopped = False
        self.dropped = threading.Event()
        """Set once a reply was dropped (``clear`` it to wait for the next one)."""
        self.drops = 0
        """How many replies were dropped."""
        self.dropped_replies: list[bytes] = []
        """The first bytes of each dropped reply (what Redis answered, unseen)."""
        self._thread = threading.Thread(
            target=self._accept, name=f"reply-dropping-proxy-{self.port}", daemon=True
        )

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> ReplyDroppingProxy:
        self._thread.start()
        return self

    def drop_reply(self, pattern: bytes) -> None:
        """Lose the reply of the next command whose bytes contain ``pattern``, once."""
        with self._lock:
            self._armed.append(pattern)

    def disarm(self) -> bool:
        """Forget the drops armed and not done yet; True if there was one."""
        with self._lock:
            armed, self._armed = bool(self._armed), []
        return armed

    @property
    def armed(self) -> bool:
        with self._lock:
            return bool(self._armed)

    def stop(self) -> None:
        """Stop accepting, and close every connection."""
        self._stopped = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            links = list(self._links)
        for link in links:
            link.close()
        self._thread.join(5)

    # -- the threads ------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()  # Redis is down: the client sees a refused connection
                continue
            upstream.settimeout(None)
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(client, upstream)
            with self._lock:
                self._links.add(link)
            for pump in (self._from_client, self._from_redis):
                threading.Thread(target=pump, args=(link,), daemon=True).start()

    def _from_client(self, link: _Link) -> None:
        try:
            while True:
                data = link.client.recv(CHUNK)
                if not data:
                    break
                self._arm_if_matched(link, data)
                link.upstream.sendall(data)
        except OSError:
            pass
        finally:
            self._forget(link)

    def _arm_if_matched(self, link: _Link, data: bytes) -> None:
        seen = link.tail + data
        with self._lock:
            for pattern in self._armed:
                if pattern in seen:
                    self._armed.remove(pattern)
                    # set before the command goes on: its reply cannot come sooner
                    link.dropping = pattern
                    link.tail = b""
                    return
            longest = max((len(p) for p in self._armed), default=1)
        link.tail = seen[-(longest - 1) :] if longest > 1 else b""

    def _from_redis(self, link: _Link) -> None:
        try:
            while True:
                data = link.upstream.recv(CHUNK)
                if not data:
                    break
                pattern, link.dropping = link.dropping, None
                if pattern is not None and not data.startswith(b"-"):
                    # Redis answered, so it ran the command; the client never hears of
                    # it, and its connection breaks as a lost network path would
                    with self._lock:
                        self.drops += 1
                        self.dropped_replies.append(data[:200])
                    self.dropped.set()
                    break
                if pattern is not None:
                    # an error: the command did not run (say, the function is not
                    # loaded yet): it passes, and the next such command loses its reply
                    with self._lock:
                        self._armed.insert(0, pattern)
                link.client.sendall(data)
        except OSError:
            pass
        finally:
            self._forget(link)

    def _forget(self, link: _Link) -> None:
        link.close()
        with self._lock:
            self._links.discard(link)
