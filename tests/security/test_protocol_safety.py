"""Nothing unsafe in the protocol: no pickle or eval of stored data, and one job
cannot reach into another's keys."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import redis

from stepbarrier import BarrierConfig, ConfigurationError, StepPublisher, read_status
from stepbarrier._inspect.reset import reset_job
from stepbarrier._protocol.keys import JobKeys
from tests.conftest import ROOT
from tests.redis_harness import RedisServer

UNSAFE_MODULES = {"pickle", "cPickle", "dill", "marshal", "shelve", "cloudpickle"}
UNSAFE_CALLS = {"eval", "exec", "compile", "__import__"}


def package_sources() -> list[Path]:
    return sorted(Path(ROOT, "stepbarrier").glob("*.py"))


@pytest.mark.parametrize("path", package_sources(), ids=lambda p: p.name)
def test_no_module_deserialises_with_pickle_or_evaluates_code(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert not {a.name.split(".")[0] for a in node.names} & UNSAFE_MODULES, path.name
        elif isinstance(node, ast.ImportFrom):
            assert (node.module or "").split(".")[0] not in UNSAFE_MODULES, path.name
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in UNSAFE_CALLS, (
                f"{path.name}:{node.lineno} calls {node.func.id}"
            )
        elif isinstance(node, ast.Attribute) and node.attr in {"loads", "load"}:
            owner = node.value.id if isinstance(node.value, ast.Name) else ""
            assert owner in {"json", ""}, f"{path.name}:{node.lineno} uses {owner}.{node.attr}"


@pytest.mark.parametrize("job", ["a}b", "a{b", "*", "a?", "a[b]", "a b", "a:b", "a\\b", "../x"])
def test_job_names_that_could_escape_their_hash_tag_or_glob_are_refused(job: str) -> None:
    with pytest.raises(ConfigurationError):
        BarrierConfig(job=job)
    with pytest.raises(ConfigurationError):
        BarrierConfig.from_env({"STEPBARRIER_JOB": job})


def test_every_key_of_a_job_stays_inside_its_hash_tag() -> None:
    keys = JobKeys.for_job("team-a.run_1")
    for name in [*keys.all_fixed(), keys.channel, keys.waiter("3-abcd"), keys.waiter_pattern]:
        assert name.startswith("stepbarrier:{team-a.run_1}:")


def test_one_job_cannot_see_or_reset_another(
    redis_server: RedisServer, client: redis.Redis
) -> None:
    short = BarrierConfig(job="iso", redis_url=redis_server.url)
    longer = BarrierConfig(job="iso-b", redis_url=redis_server.url)
    client.hset(
        longer.keys.waiter("1-x"), mapping={"wait_until_step": "5", "since": "1", "host": "h"}
    )
    with StepPublisher(longer) as publisher:
        publisher.publish(9)
        assert publisher.flush(5.0)
        assert read_status(short).waiters == ()
        reset_job(short)
        assert client.hget(longer.keys.state, "step") == b"9"
        assert client.exists(longer.keys.waiter("1-x"))
    client.delete(longer.keys.waiter("1-x"))
