"""A StepWaiter keeps its subscription from one wait to the next (closed by ``close``)."""

from __future__ import annotations

import threading
import time

import redis

from stepbarrier import BarrierConfig, StepPublisher, StepWaiter


def subscribers(client: redis.Redis, channel: str) -> int:
    return int(dict(client.pubsub_numsub(channel))[channel.encode()])


def test_a_released_wait_leaves_its_subscription_to_the_next_and_close_ends_it(
    config: BarrierConfig, client: redis.Redis
) -> None:
    with StepPublisher(config) as chief:
        chief.publish(8)
        assert chief.flush(5.0)
        waiter = StepWaiter(config)
        assert waiter.wait(3, timeout=10) == 8
        assert subscribers(client, config.keys.channel) == 1  # kept, not closed on the way
        assert waiter.wait(5, timeout=10) == 8
        assert subscribers(client, config.keys.channel) == 1  # the same one, taken over
        waiter.close()
        # the server drops a closed connection's subscription as it reads the close
        deadline = time.monotonic() + 5.0
        while subscribers(client, config.keys.channel) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert subscribers(client, config.keys.channel) == 0


def test_what_arrived_between_two_waits_is_discarded_not_acted_on(
    config: BarrierConfig, client: redis.Redis
) -> None:
    with StepPublisher(config) as chief, StepWaiter(config) as waiter:
        chief.publish(8)
        assert chief.flush(5.0)
        assert waiter.wait(3, timeout=10) == 8
        # a reset announcement with no reset behind it (no marker): stale by the next wait
        client.publish(config.keys.channel, '{"reset":true}')
        time.sleep(0.1)  # it reaches the kept subscription's socket
        chief_later = threading.Timer(0.3, chief.publish, args=(20,))
        chief_later.start()
        try:
            # acted on, the old message would abort this wait at once
            assert waiter.wait(20, timeout=10) == 20
        finally:
            chief_later.cancel()
