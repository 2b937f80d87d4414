"""The task id and role from a launcher's rank: torchrun's ``RANK``, Slurm's ``SLURM_PROCID``.

docs/configuration.md#task-id-and-role is the order: ``STEPBARRIER_TASK_ID``, then
``STEPBARRIER_ROLE=chief`` (task 0), then ``TF_CONFIG``, then torchrun's ``RANK`` (only
with ``TORCHELASTIC_RUN_ID`` set), then ``SLURM_PROCID``; without ``STEPBARRIER_ROLE``
or ``TF_CONFIG`` the role follows the task id under a launcher (0 is the chief).
``BarrierConfig.task_id_source`` records where the task id came from.
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from typing import Final

import pytest

from stepbarrier import BarrierConfig, ConfigurationError
from stepbarrier._config.defaults import (
    LAUNCHER_RANKS,
    LAUNCHER_VARIABLES,
    TASK_ID_SOURCES,
)
from stepbarrier._config.environment import barrier_role_from_env, task_from_env
from stepbarrier._config.settings import ENVIRONMENT_VARIABLES

TORCH_ID: Final = "TORCHELASTIC_RUN_ID"
RANK: Final = "RANK"
PROCID: Final = "SLURM_PROCID"
TF_WORKER_1 = json.dumps(
    {
        "cluster": {"chief": ["c:1"], "worker": ["w:1", "w:2"]},
        "task": {"type": "worker", "index": 1},
    }
)
TF_PS = json.dumps(
    {"cluster": {"chief": ["c:1"], "ps": ["p:1"]}, "task": {"type": "ps", "index": 0}}
)


def config(**env: str) -> BarrierConfig:
    return BarrierConfig.from_env({"STEPBARRIER_JOB": "j", **env})


@pytest.mark.parametrize(
    ("env", "role", "task_id", "source"),
    [
        # torchrun: RANK counts when torchrun's run id is there (any value)
        ({TORCH_ID: "t-1", RANK: "0"}, "chief", 0, RANK),
        ({TORCH_ID: "t-1", RANK: "2"}, "worker", 2, RANK),
        ({TORCH_ID: "none", RANK: "1"}, "worker", 1, RANK),  # torchrun without --rdzv-id
        ({TORCH_ID: "t-1", RANK: " 3 "}, "worker", 3, RANK),
        # a RANK alone is not torchrun's: some other tool's, not a task id
        ({RANK: "2"}, None, None, None),
        # Slurm: srun sets SLURM_PROCID in each task
        ({PROCID: "0", "SLURM_JOB_ID": "81"}, "chief", 0, PROCID),
        ({PROCID: "5"}, "worker", 5, PROCID),
        # torchrun inside a Slurm job: torchrun's rank is the process's own
        ({TORCH_ID: "t-1", RANK: "1", PROCID: "0"}, "worker", 1, RANK),
        ({RANK: "1", PROCID: "4"}, "worker", 4, PROCID),
        # the explicit variables win over any launcher, and a conflict is no error
        (
            {"STEPBARRIER_TASK_ID": "3", TORCH_ID: "t-1", RANK: "1"},
            "worker",
            3,
            "STEPBARRIER_TASK_ID",
        ),
        ({"STEPBARRIER_TASK_ID": "0", PROCID: "2"}, "chief", 0, "STEPBARRIER_TASK_ID"),
        ({"STEPBARRIER_ROLE": "chief", PROCID: "2"}, "chief", 0, "STEPBARRIER_ROLE"),
        ({"STEPBARRIER_ROLE": "worker", PROCID: "0"}, "worker", 0, PROCID),
        ({"STEPBARRIER_ROLE": "worker", TORCH_ID: "t", RANK: "2"}, "worker", 2, RANK),
        # TF_CONFIG comes before the launchers
        ({"TF_CONFIG": TF_WORKER_1, PROCID: "0"}, "worker", 2, "TF_CONFIG"),
        ({"TF_CONFIG": TF_PS, TORCH_ID: "t-1", RANK: "0"}, None, None, None),
        ({}, None, None, None),
    ],
)
def test_the_first_source_that_says_gives_the_task_id_and_the_role(
    env: dict[str, str], role: str | None, task_id: int | None, source: str | None
) -> None:
    made = config(**env)
    assert (made.role, made.task_id, made.task_id_source) == (role, task_id, source)
    assert task_from_env(env)[:3] == (role, task_id, source)


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({TORCH_ID: "t-1", RANK: "abc"}, RANK),
        ({TORCH_ID: "t-1", RANK: "-1"}, RANK),
        ({TORCH_ID: "t-1", RANK: "1.0"}, RANK),
        ({PROCID: "1e3"}, PROCID),
        ({PROCID: "99999999999"}, PROCID),
        ({"STEPBARRIER_ROLE": "worker", PROCID: "x"}, PROCID),
    ],
)
def test_a_bad_rank_is_a_configuration_error_naming_the_variable(
    env: dict[str, str], variable: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        config(**env)
    assert info.value.variable == variable
    message = str(info.value)
    assert message.startswith(f"{variable} ({LAUNCHER_RANKS[variable]}) must be an integer")
    assert repr(env[variable]) in message
    with pytest.raises(ConfigurationError) as role_info:
        barrier_role_from_env(env)  # the hooks' first question says the same
    assert role_info.value.variable == variable


@pytest.mark.parametrize(
    ("env", "source"),
    [
        ({"STEPBARRIER_TASK_ID": "2", TORCH_ID: "t-1", RANK: "abc"}, "STEPBARRIER_TASK_ID"),
        ({"STEPBARRIER_ROLE": "chief", PROCID: "abc"}, "STEPBARRIER_ROLE"),
        ({"TF_CONFIG": TF_WORKER_1, PROCID: "abc"}, "TF_CONFIG"),
        ({RANK: "abc"}, None),  # not torchrun's: never read
        ({TORCH_ID: "t-1", RANK: "1", PROCID: "abc"}, RANK),  # torchrun's rank came first
    ],
)
def test_a_rank_that_is_not_needed_is_not_read(env: dict[str, str], source: str | None) -> None:
    assert config(**env).task_id_source == source  # and no ConfigurationError


def test_a_launchers_rank_gives_a_schedule_its_task_id() -> None:
    for rank in range(4):
        made = config(STEPBARRIER_SCHEDULE="log:20", TORCHELASTIC_RUN_ID="t-1", RANK=str(rank))
        assert made.resolved_wait_until_step() == int(20 * math.log(rank + 1))
    without = config(STEPBARRIER_SCHEDULE="log:20", RANK="2")  # not torchrun's
    with pytest.raises(ConfigurationError, match="torchrun or srun") as info:
        without.resolved_wait_until_step()
    assert info.value.variable == "STEPBARRIER_TASK_ID"


def test_the_hooks_role_comes_from_the_rank_under_a_launcher() -> None:
    assert barrier_role_from_env({PROCID: "0"}) == "chief"
    assert barrier_role_from_env({TORCH_ID: "t", RANK: "1"}) == "worker"
    assert barrier_role_from_env({"TF_CONFIG": TF_PS, PROCID: "0"}) is None  # a ps stays out
    with pytest.raises(ConfigurationError, match="torchrun's RANK, Slurm's SLURM_PROCID"):
        barrier_role_from_env({RANK: "0"})


def test_the_sources_and_the_variables_are_listed() -> None:
    assert TASK_ID_SOURCES[0] == "STEPBARRIER_TASK_ID" and TASK_ID_SOURCES[-2:] == (RANK, PROCID)
    assert set(LAUNCHER_RANKS) <= set(LAUNCHER_VARIABLES)  # tests and tools unset them
    assert not set(LAUNCHER_VARIABLES) & set(ENVIRONMENT_VARIABLES)


@pytest.mark.parametrize(
    ("made", "said"),
    [
        (
            {TORCH_ID: "t-1", RANK: "2"},
            "task 2, worker (from RANK, torchrun's global rank)",
        ),
        (
            {PROCID: "0"},
            "task 0, chief (from SLURM_PROCID, the rank of the Slurm task)",
        ),
        ({"STEPBARRIER_TASK_ID": "3", PROCID: "1"}, "task 3, worker (from STEPBARRIER_TASK_ID)"),
        (
            {"STEPBARRIER_ROLE": "chief"},
            "task 0, chief (STEPBARRIER_ROLE=chief: the chief is task 0)",
        ),
        ({"TF_CONFIG": TF_WORKER_1}, "task 2, worker (from TF_CONFIG)"),
        (
            {RANK: "1"},
            "no task id, no role (no STEPBARRIER_TASK_ID, no task in TF_CONFIG, no RANK under "
            "torchrun, no SLURM_PROCID)",
        ),
    ],
)
def test_describe_task_says_where_the_task_id_came_from(made: dict[str, str], said: str) -> None:
    assert config(**made).describe_task() == said


def test_a_task_id_source_given_in_code_is_checked() -> None:
    assert BarrierConfig(job="j", task_id=1).describe_task() == "task 1, no role (given in code)"
    given = BarrierConfig(job="j", role="worker", task_id=1, task_id_source=PROCID)
    assert given.task_id_source == PROCID
    with pytest.raises(ConfigurationError) as info:
        BarrierConfig(job="j", task_id=1, task_id_source="MPI_RANK")  # type: ignore[arg-type]
    assert info.value.variable == "task_id_source"
    with pytest.raises(ConfigurationError, match="task_id is None") as info:
        BarrierConfig(job="j", task_id_source=RANK)
    assert info.value.variable == "task_id_source"


def test_a_launchers_task_is_said_in_one_info_line(caplog: pytest.LogCaptureFixture) -> None:
    job = f"j-{uuid.uuid4().hex[:8]}"
    env = {"STEPBARRIER_JOB": job, "SLURM_JOB_ID": "81", PROCID: "3"}
    with caplog.at_level(logging.INFO, logger="stepbarrier.config"):
        BarrierConfig.from_env(env)
        BarrierConfig.from_env(env)  # a hook and a waiter of one process: said once
        BarrierConfig.from_env({"STEPBARRIER_JOB": job, "SLURM_JOB_ID": "81"})  # no rank
    lines = [r.getMessage() for r in caplog.records if r.name == "stepbarrier.config"]
    assert lines == [
        f"job {job}: run id slurm-81 (from SLURM_JOB_ID, the Slurm job)",
        f"job {job}: task 3, worker (from SLURM_PROCID, the rank of the Slurm task)",
        f"job {job}: run id slurm-81 (from SLURM_JOB_ID, the Slurm job)",
    ]
