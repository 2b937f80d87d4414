"""A chief in its own process, driven line by line over stdin (for SIGSTOP and SIGKILL).

Commands: ``publish N``, ``flush``, ``close``, ``close-done``; each answers one
line on stdout (``ok``, or ``error ...``). The config comes from the
environment (``STEPBARRIER_*``), as a real chief's does.
"""

from __future__ import annotations

import sys

from stepbarrier import BarrierConfig, StepPublisher


def main() -> None:
    publisher = StepPublisher(BarrierConfig.from_env())
    for line in sys.stdin:
        command, *args = line.split()
        try:
            if command == "publish":
                publisher.publish(int(args[0]))
                reply = "ok"
            elif command == "flush":
                reply = "ok" if publisher.flush(10.0) else f"error {publisher.last_error}"
            elif command in ("close", "close-done"):
                publisher.close(done=command == "close-done")
                reply = "ok"
            else:
                reply = f"error unknown command {command}"
        except Exception as exc:  # the test reads it
            reply = f"error {type(exc).__name__}: {exc}"
        print(reply, flush=True)
        if command.startswith("close"):
            return


if __name__ == "__main__":
    main()
