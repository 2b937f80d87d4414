"""The job's barriers as an operator sees them: which are open, who is missing.

Only the public record lives here; ``stepbarrier._inspect.status`` reads the index.
"""

from __future__ import annotations

from dataclasses import dataclass

STATUS_BARRIERS = 50
"""Most barriers ``status`` reads: those with the latest arrivals."""


@dataclass(frozen=True)
class BarrierInfo:
    """An open barrier: not every party has arrived yet.

    Attributes:
        name: The barrier's name.
        run_id: The run it belongs to (``None``: no run id).
        parties: How many tasks it waits for.
        arrived: How many have arrived.
        missing: The ids of the tasks that have not, sorted.
        open_for: Seconds since the first arrival, by Redis's clock.
        last_arrival_age: Seconds since the latest arrival, by Redis's clock.
    """

    name: str
    run_id: str | None
    parties: int
    arrived: int
    missing: tuple[int, ...]
    open_for: float | None
    last_arrival_age: float | None
