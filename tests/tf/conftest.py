"""Fixtures of the TensorFlow tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from stepbarrier import StepPublisher


@pytest.fixture(autouse=True)
def paused_publishers_end_with_the_test(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A chief hook's publisher pauses at the end of a session and heartbeats on while
    the process lives (another session may follow): in this test process it
    would outlive the test's Redis server. Close every one paused in the test."""
    paused: list[StepPublisher] = []
    pause = StepPublisher.pause

    def recorded(self: StepPublisher, *, flush_timeout: float | None = None) -> bool:
        paused.append(self)
        return pause(self, flush_timeout=flush_timeout)

    monkeypatch.setattr(StepPublisher, "pause", recorded)
    yield
    for publisher in paused:
        publisher.close(done=False, timeout=1.0)
