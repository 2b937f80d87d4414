"""What makes a unit test: it starts no process and opens no connection."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def no_process_and_no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def no_process(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a unit test starts no process: move it out of tests/unit")

    def no_connection(self: socket.socket, address: Any) -> Any:
        raise AssertionError(f"a unit test connects nowhere ({address!r}): use fakeredis")

    monkeypatch.setattr(subprocess.Popen, "__init__", no_process)
    monkeypatch.setattr(socket.socket, "connect", no_connection)
    monkeypatch.setattr(socket.socket, "connect_ex", no_connection)
    yield
