"""Following training (issue 38): ``StepWaiter.follow``, ``AsyncStepWaiter.follow`` and
``stepbarrier follow`` against a real redis-server, with the chief jumping past
several multiples at once: every multiple is seen, in order, none skipped."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stepbarrier import (
    BarrierAborted,
    BarrierConfig,
    Crossed,
    StepPublisher,
    StepWaiter,
    read_status,
)
from stepbarrier._inspect.reset import reset_job
from stepbarrier._protocol.wire import MAX_STEP
from stepbarrier._worker.follow import FollowPlan
from stepbarrier.aio import AsyncStepWaiter
from tests.conftest import subprocess_env
from tests.integration.test_cli import finish, start, wait_for_waiters

RUN = "follow-run"
FOLLOW = [sys.executable, "-m", "stepbarrier", "follow"]


@pytest.fixture
def chief_config(make_config: Callable[..., BarrierConfig]) -> BarrierConfig:
    return make_config(heartbeat=0.2, stall_timeout=30.0, run_id=RUN)


@pytest.fixture
def env(chief_config: BarrierConfig) -> dict[str, str]:
    return subprocess_env(
        STEPBARRIER_REDIS_URL=chief_config.redis_url,
        STEPBARRIER_JOB=chief_config.job,
        STEPBARRIER_RUN_ID=RUN,
    )


def jump(chief: StepPublisher, *steps: int) -> None:
    """The chief hands over each step and waits until it is stored: one jump each."""
    for step in steps:
        chief.publish(step)
        assert chief.flush(10.0)


# -- the plan, without I/O ---------------------------------------------------------


def test_the_plan_yields_each_crossed_multiple_with_the_step_seen() -> None:
    plan = FollowPlan(10, start=None)
    assert plan.target == 10
    assert plan.released(35, before=3) == [Crossed(10, 35), Crossed(20, 35), Crossed(30, 35)]
    assert plan.target == 40
    assert plan.released(40, before=40) == [Crossed(40, 40)]  # only the first wait skips


def test_the_plan_starts_above_a_step_already_reached() -> None:
    plan = FollowPlan(10, start=None)
    assert plan.released(57, before=57) == []
    assert plan.target == 60
    plan = FollowPlan(10, start=None)
    assert plan.released(63, before=57) == [Crossed(60, 63)]  # crossed while it followed


@given(
    every=st.integers(1, 50),
    start=st.none() | st.integers(0, 500),
    steps=st.lists(st.tuples(st.integers(0, 400), st.integers(0, 600) | st.none()), max_size=8),
)
def test_the_plan_crosses_exactly_the_multiples_between_its_target_and_the_step(
    every: int, start: int | None, steps: list[tuple[int, int | None]]
) -> None:
    """Whatever the steps (a step below the target, one multiple, several at once), a
    release crosses every multiple from the target (the first one above the first
    read's step, without a start) up to the step, and nothing else: what the plan's
    one-multiple shortcut returns is what the whole range gives."""
    plan = FollowPlan(every, start)
    first_wait = start is None
    for offset, before in steps:
        target = plan.target
        step = target + offset - 50  # below the target too
        if step < 0:
            continue
        lowest = target
        if first_wait and before is not None and before >= target:
            lowest = (before // every + 1) * every
        expected = [Crossed(m, step) for m in range(lowest, step + 1, every)]
        assert plan.released(step, before) == expected
        assert plan.target == (step // every + 1) * every
        first_wait = False


def test_the_plan_starts_at_the_first_multiple_at_or_above_from() -> None:
    assert FollowPlan(10, start=0).target == 10
    assert FollowPlan(10, start=20).target == 20
    assert FollowPlan(10, start=21).target == 30
    plan = FollowPlan(10, start=20)
    assert plan.released(57, before=57) == [Crossed(m, 57) for m in (20, 30, 40, 50)]


def test_the_plan_is_exhausted_past_the_largest_step() -> None:
    assert FollowPlan(7, start=MAX_STEP).exhausted  # the next multiple is above it
    plan = FollowPlan(MAX_STEP, start=None)
    assert not plan.exhausted
    assert plan.released(MAX_STEP, before=None) == [Crossed(MAX_STEP, MAX_STEP)]
    assert plan.exhausted


@pytest.mark.parametrize(
    ("every", "start", "error"),
    [(0, None, ValueError), (True, None, TypeError), (1.5, None, TypeError), (5, -1, ValueError)],
)
def test_a_bad_interval_or_start_is_refused(every: object, start: object, error: type) -> None:
    with pytest.raises(error, match=r"every|start"):
        FollowPlan(every, start)  # type: ignore[arg-type]


# -- the threaded and asyncio waiters ------------------------------------------------


def registered(config: BarrierConfig, thread: threading.Thread) -> None:
    """Until the follower's wait is in the job's registry (it has read the state), or
    the follower ended (no clock: pytest-timeout bounds the test)."""
    while not read_status(config).waiters:
        assert thread.is_alive(), "the follower ended without waiting"
        time.sleep(0.02)


def test_follow_sees_every_multiple_while_the_chief_jumps(chief_config: BarrierConfig) -> None:
    seen: list[Crossed] = []
    with StepPublisher(chief_config) as chief:
        jump(chief, 3)

        def follower() -> None:
            with StepWaiter(chief_config) as waiter:
                seen.extend(waiter.follow(every=10, timeout=30))

        thread = threading.Thread(target=follower)
        thread.start()
        registered(chief_config, thread)
        jump(chief, 35, 41)
        chief.close(done=True)
    thread.join(30)
    assert not thread.is_alive()
    assert [c.multiple for c in seen] == [10, 20, 30, 40]
    assert all(c.step >= c.multiple for c in seen)
    assert seen[-1].step == 41


def test_a_reset_ends_follow_with_the_abort(chief_config: BarrierConfig) -> None:
    errors: list[BaseException] = []
    with StepPublisher(chief_config) as chief:
        jump(chief, 3)

        def follower() -> None:
            with StepWaiter(chief_config) as waiter:
                try:
                    list(waiter.follow(every=10, timeout=30))
                except BarrierAborted as exc:
                    errors.append(exc)

        thread = threading.Thread(target=follower)
        thread.start()
        time.sleep(0.5)  # (the follower may or may not have read yet: both abort)
        reset_job(chief_config)
        thread.join(30)
    assert len(errors) == 1 and isinstance(errors[0], BarrierAborted)
    assert errors[0].reason == "reset"


def test_async_follow_sees_every_multiple_while_the_chief_jumps(
    chief_config: BarrierConfig,
) -> None:
    async def scenario() -> list[Crossed]:
        chief = StepPublisher(chief_config)
        await asyncio.to_thread(jump, chief, 12)
        async with AsyncStepWaiter(chief_config) as waiter:

            async def follow() -> list[Crossed]:
                return [c async for c in waiter.follow(every=5, timeout=30)]

            task = asyncio.create_task(follow())
            while not await asyncio.to_thread(lambda: read_status(chief_config).waiters):
                await asyncio.sleep(0.02)
            await asyncio.to_thread(jump, chief, 14, 31)
            await asyncio.to_thread(chief.close, True)
            return await asyncio.wait_for(task, 30)

    seen = asyncio.run(scenario())
    assert [c.multiple for c in seen] == [15, 20, 25, 30]
    assert {c.step for c in seen} == {31}


# -- the command ---------------------------------------------------------------------


def test_the_command_prints_every_multiple(
    env: dict[str, str], chief_config: BarrierConfig
) -> None:
    with StepPublisher(chief_config) as chief:
        jump(chief, 57)  # already past 50: following starts at 60
        process = start(env, "follow", "--every", "10", "--timeout", "60")
        wait_for_waiters(chief_config, 1, process)
        jump(chief, 60, 95)
        chief.close(done=True)
    code, out, err = finish(process)
    assert (code, out) == (0, "60\n70\n80\n90\n"), err


def test_the_command_runs_command_once_per_multiple_in_order(
    env: dict[str, str], chief_config: BarrierConfig, tmp_path: Path
) -> None:
    log = tmp_path / "steps.log"
    script = f'echo "$STEPBARRIER_STEP $STEPBARRIER_STEP_SEEN" >> {log}'
    with StepPublisher(chief_config) as chief:
        jump(chief, 1)
        process = start(env, "follow", "--every", "4", "--from", "0", "--", "sh", "-c", script)
        wait_for_waiters(chief_config, 1, process)
        jump(chief, 13)
        chief.close(done=True)
    code, _, err = finish(process)
    assert code == 0, err
    assert log.read_text().splitlines() == ["4 13", "8 13", "12 13"]


def test_a_failing_command_stops_following_with_exit_11(
    env: dict[str, str], chief_config: BarrierConfig
) -> None:
    with StepPublisher(chief_config) as chief:
        jump(chief, 20)
        result = subprocess.run(
            [
                *FOLLOW,
                "--every",
                "5",
                "--from",
                "5",
                "--",
                "sh",
                "-c",
                'test "$STEPBARRIER_STEP" -lt 15',
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 11, result.stderr
    assert "'sh' exited 1 at step 15 (the chief at 20)" in result.stderr


def test_bad_options_are_a_usage_error(env: dict[str, str]) -> None:
    result = subprocess.run(
        [*FOLLOW, "--every", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "--every" in result.stderr


def test_follow_under_proceed_ends_without_yielding_what_it_did_not_cross(
    make_config: Callable[..., BarrierConfig],
) -> None:
    """Review of issue 38: a chief that stopped at 55 (not finished); a follower under
    ``on_timeout="proceed"`` must not yield 10 .. 50 from the last step it saw."""
    config = make_config(heartbeat=0.2, stall_timeout=1.5, run_id=RUN, on_timeout="proceed")
    with StepPublisher(config) as chief:
        jump(chief, 55)
        chief.close(done=False)  # gone without finishing: no heartbeat any more
    with StepWaiter(config) as waiter:
        crossed = list(waiter.follow(every=10, timeout=30))
    assert crossed == []


def test_follow_ends_at_the_largest_step(chief_config: BarrierConfig) -> None:
    with StepWaiter(chief_config) as waiter:
        assert list(waiter.follow(every=7, start=MAX_STEP)) == []  # touches no Redis
