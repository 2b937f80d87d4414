"""A chief in a process of its own, for the stateful protocol test (pause it: a zombie).

    python -m tests.reliability.stateful_chief

The process says ``{"event": "ready"}`` once it has imported stepbarrier (the
test starts it ahead of need), then reads one JSON command a line on stdin and
answers each with one JSON line on stdout carrying the command's ``id``:

- ``{"op": "start", "config": {...}, "step": S, "flush": T}``: make the
  ``StepPublisher`` (``config``: ``BarrierConfig``'s keyword arguments),
  ``publish(S)`` and ``flush(T)``; answers ``flushed``, ``active``, ``writes``;
- ``{"op": "publish", "steps": [..], "flush": T or null}``: one ``publish``
  per step (then ``flush(T)`` if asked); answers as above;
- ``{"op": "new_generation", "step": S, "flush": T}``: ``new_generation()``,
  ``publish(S)``, ``flush(T)``; answers as above;
- ``{"op": "close", "done": D, "step": L or null, "timeout": T}``:
  ``publish(L)`` if given, then ``close(done=D)``; answers ``ok``;
- ``{"op": "status"}``: answers ``active`` and ``writes``.

Between commands its training loop hands the current step over again every
``TICK`` seconds, as a real loop calls ``publish`` on every step (so the
publisher's confirmation window never passes while the "chief" is alive). Once
the publisher is no longer ``active`` (superseded, reset, refused) it writes
``{"event": "inactive"}`` once. The test stops the whole process with SIGSTOP
and lets it go on with SIGCONT: its threads, its training loop and its
connections freeze together, as a chief's do in a long GC pause or a
partition, and it comes back believing it still leads.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from typing import Any

from stepbarrier import BarrierConfig, StepPublisher

TICK = 0.05
"""Seconds between two hand-overs of the current step by the training loop."""


class ChiefProcess:
    def __init__(self) -> None:
        self.publisher: StepPublisher | None = None
        self.step: int | None = None
        self.closed = False
        self.lock = threading.Lock()  # publish() calls: the loop's and the commands'
        self.out = threading.Lock()  # one line at a time on stdout
        self.told_inactive = False
        threading.Thread(target=self._train, daemon=True).start()

    def say(self, message: dict[str, Any]) -> None:
        with self.out:
            sys.stdout.write(json.dumps(message) + "\n")
            sys.stdout.flush()

    def _train(self) -> None:
        while True:
            time.sleep(TICK)
            with self.lock:
                publisher = self.publisher
                if publisher is None or self.closed:
                    continue
                if self.step is not None:
                    publisher.publish(self.step)
                active = publisher.active
            if not active and not self.told_inactive:
                self.told_inactive = True
                self.say({"event": "inactive", "t": time.monotonic()})

    def _report(self, flushed: bool | None) -> dict[str, Any]:
        publisher = self.publisher
        assert publisher is not None
        return {
            "flushed": flushed,
            "active": publisher.active,
            "writes": publisher.writes,
            "generation": publisher.generation,
        }

    def handle(self, command: dict[str, Any]) -> dict[str, Any]:
        op = command["op"]
        if op == "start":
            with self.lock:
                config = BarrierConfig(**command["config"])
                self.publisher = StepPublisher(config, description=f"stateful:{config.run_id}")
                self.step = int(command["step"])
                self.publisher.publish(self.step)
            return self._report(self.publisher.flush(float(command["flush"])))
        publisher = self.publisher
        assert publisher is not None, "start first"
        if op == "publish":
            with self.lock:
                for step in command["steps"]:
                    self.step = int(step)
                    publisher.publish(self.step)
            timeout = command.get("flush")
            return self._report(None if timeout is None else publisher.flush(float(timeout)))
        if op == "new_generation":
            with self.lock:
                publisher.new_generation()
                self.step = int(command["step"])
                publisher.publish(self.step)
            return self._report(publisher.flush(float(command["flush"])))
        if op == "close":
            with self.lock:
                if command.get("step") is not None:
                    self.step = int(command["step"])
                    publisher.publish(self.step)
                self.closed = True
            ok = publisher.close(done=bool(command["done"]), timeout=float(command["timeout"]))
            return {"ok": ok, "active": publisher.active, "writes": publisher.writes}
        if op == "status":
            return self._report(None)
        raise ValueError(f"unknown op {op!r}")


def main() -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    chief = ChiefProcess()
    chief.say({"event": "ready"})
    for line in sys.stdin:
        if not line.strip():
            continue
        command = json.loads(line)
        try:
            reply = chief.handle(command)
        except Exception as exc:  # the test shows it and fails
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        chief.say({"id": command["id"], **reply})
    return 0


if __name__ == "__main__":
    sys.exit(main())
