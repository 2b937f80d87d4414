"""``BarrierRules.on_read`` of a waiting party's reads of constant cost (kind ``counted``)."""

from __future__ import annotations

from stepbarrier import BarrierConfig
from stepbarrier._barriers.wait import READ_ALL, ArriveAgain, BarrierRules


def own_fields(last_ms: int) -> list[bytes]:
    return [b"parties", b"4", b"arrived", b"3", b"epoch", b"5", b"last_ms", str(last_ms).encode()]


def chief_that_read_tasks_0_1_2() -> BarrierRules:
    """Task 0 of a 4-party barrier whose last full read found tasks 0, 1 and 2."""
    rules = BarrierRules(BarrierConfig(job="j", task_id=0), "end", "end", 4, 0, lambda: 0.0, None)
    rules.epoch, rules.reset_marker = "5", None
    full = [b"1000", None, b"hash", *own_fields(102), b"t0", b"100", b"t1", b"101", b"t2", b"102"]
    assert rules.on_read(full) is None
    return rules


def counted(last_ms: int, tasks: int) -> list[object]:
    return [b"1000", None, b"counted", *own_fields(last_ms), b"t0", b"100", b"tasks", b"%d" % tasks]


def test_a_read_of_constant_cost_that_shows_nothing_new_reads_nothing_more() -> None:
    assert chief_that_read_tasks_0_1_2().on_read(counted(102, 3)) is None


def test_a_new_count_asks_for_every_arrival() -> None:
    assert chief_that_read_tasks_0_1_2().on_read(counted(103, 4)) == READ_ALL


def test_an_arrival_that_hides_a_loss_from_the_count_still_asks_for_every_arrival() -> None:
    """Task 1 lost and task 3 arrived: three task fields, as many as the party saw;
    the arrival's new ``last_ms`` asks for the full read, which finds task 1 lost."""
    rules = chief_that_read_tasks_0_1_2()
    assert rules.on_read(counted(103, 3)) == READ_ALL
    full = [b"1000", None, b"hash", *own_fields(103), b"t0", b"100", b"t2", b"102", b"t3", b"103"]
    assert rules.on_read(full) == ArriveAgain((1,))
