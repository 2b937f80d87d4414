"""Where the run id comes from: ``STEPBARRIER_RUN_ID``, else torchrun's, else Slurm's.

docs/configuration.md#run-id is the order; ``BarrierConfig.run_id_source`` records
which variable gave the run id, and one INFO line says it when a process reads
its configuration.
"""

from __future__ import annotations

import logging
import re
import uuid
from typing import Final

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stepbarrier import BarrierConfig, ConfigurationError
from stepbarrier._config.defaults import (
    LAUNCHER_VARIABLES,
    RUN_ID_SOURCES,
)
from stepbarrier._config.environment import LAUNCHER_ID_KEPT, launcher_run_id, run_id_from_env
from stepbarrier._config.settings import ENVIRONMENT_VARIABLES
from stepbarrier._protocol.wire import RUN_ID

TORCH: Final = "TORCHELASTIC_RUN_ID"
SLURM: Final = "SLURM_JOB_ID"
RESTARTS: Final = "SLURM_RESTART_COUNT"
OURS: Final = "STEPBARRIER_RUN_ID"


def config(**env: str) -> BarrierConfig:
    return BarrierConfig.from_env({"STEPBARRIER_JOB": "j", **env})


@pytest.mark.parametrize(
    ("env", "run_id", "source"),
    [
        ({}, None, None),
        ({OURS: "run-7"}, "run-7", OURS),
        ({OURS: "run-7", TORCH: "t-1", SLURM: "81"}, "run-7", OURS),
        ({TORCH: "t-1", SLURM: "81"}, "t-1", TORCH),
        ({TORCH: "none", SLURM: "81"}, "slurm-81", SLURM),  # torchrun's "no id given"
        ({TORCH: "None"}, None, None),
        ({TORCH: "  ", SLURM: "81"}, "slurm-81", SLURM),
        ({SLURM: "81"}, "slurm-81", SLURM),
        ({SLURM: " 81 "}, "slurm-81", SLURM),
        ({SLURM: "81", RESTARTS: "0"}, "slurm-81", SLURM),
        ({SLURM: "81", RESTARTS: "2"}, "slurm-81-r2", SLURM),
        ({SLURM: "81", RESTARTS: "02"}, "slurm-81-r2", SLURM),
        ({RESTARTS: "2"}, None, None),  # a restart count alone names no run
    ],
)
def test_the_first_variable_set_gives_the_run_id(
    env: dict[str, str], run_id: str | None, source: str | None
) -> None:
    assert run_id_from_env(env) == (run_id, source)
    made = config(**env)
    assert (made.run_id, made.run_id_source) == (run_id, source)


@pytest.mark.parametrize("empty", ["", "   ", "\t"])
def test_an_empty_stepbarrier_run_id_is_no_run_id_and_keeps_the_launchers_out(
    empty: str,
) -> None:
    made = config(STEPBARRIER_RUN_ID=empty, TORCHELASTIC_RUN_ID="t-1", SLURM_JOB_ID="81")
    assert made.run_id is None
    assert made.run_id_source == OURS  # "none", said on purpose
    assert "set empty" in made.describe_run_id()


@pytest.mark.parametrize("bad", ["a b", "x" * 65, "job/7", "ü"])
def test_an_invalid_stepbarrier_run_id_is_refused_even_with_a_launchers_id(bad: str) -> None:
    with pytest.raises(ConfigurationError, match="STEPBARRIER_RUN_ID must be 1 to 64") as info:
        config(STEPBARRIER_RUN_ID=bad, SLURM_JOB_ID="81")
    assert info.value.variable == OURS


def test_a_valid_launcher_id_is_taken_as_it_is() -> None:
    uid = "3f2b8c1e-9a4d-4f0e-8b7a-0c5d2e6f1a3b"  # what torchrun --standalone makes
    assert launcher_run_id(uid) == uid
    assert config(TORCHELASTIC_RUN_ID=uid).run_id == uid


@pytest.mark.parametrize(
    ("raw", "kept"),
    [
        ("exp/7:a", "exp_7_a"),
        ("a  b", "a_b"),  # a run of refused characters is one "_"
        ("é" * 3, "_"),
        ("x" * 65, "x" * LAUNCHER_ID_KEPT),
    ],
)
def test_a_launcher_id_that_is_no_run_id_is_mapped_readably_and_deterministically(
    raw: str, kept: str
) -> None:
    mapped = launcher_run_id(raw)
    assert RUN_ID.fullmatch(mapped) is not None
    readable, _, digest = mapped.rpartition("-")
    assert readable == kept
    assert re.fullmatch(r"[0-9a-f]{16}", digest)
    assert launcher_run_id(raw) == mapped  # every process of the run maps it alike
    assert config(TORCHELASTIC_RUN_ID=raw).run_id == mapped


def test_ids_that_read_alike_stay_two_runs() -> None:
    # the readable part is the same; the hash of the whole id tells them apart
    assert launcher_run_id("exp/7:a") != launcher_run_id("exp:7/a")
    assert launcher_run_id("x" * 65) != launcher_run_id("x" * 66)


def test_a_slurm_id_or_restart_count_out_of_slurms_form_is_mapped_not_refused() -> None:
    odd = config(SLURM_JOB_ID="81 2")
    assert odd.run_id is not None and odd.run_id.startswith("slurm-81_2-")
    counted = config(SLURM_JOB_ID="81", SLURM_RESTART_COUNT="two")
    assert counted.run_id is not None and counted.run_id.startswith("slurm-81-rtwo")
    assert counted.run_id != config(SLURM_JOB_ID="81").run_id  # never merged with try 0


def test_an_undecodable_byte_of_the_environment_maps_too() -> None:
    # os.environ holds a byte that is no UTF-8 as a lone surrogate
    mapped = config(TORCHELASTIC_RUN_ID="run-\udcff").run_id
    assert mapped is not None and RUN_ID.fullmatch(mapped) is not None


@given(st.text(min_size=1, max_size=200).filter(lambda text: text.strip() != ""))
def test_any_launcher_id_gives_a_valid_run_id_the_same_every_time(raw: str) -> None:
    first = launcher_run_id(raw)
    assert RUN_ID.fullmatch(first) is not None
    assert launcher_run_id(raw) == first


@given(st.text(min_size=1, max_size=80), st.text(min_size=1, max_size=80))
def test_two_different_launcher_ids_give_two_run_ids(one: str, other: str) -> None:
    if one != other:
        assert launcher_run_id(one) != launcher_run_id(other)


def test_the_launchers_variables_are_listed_apart_from_stepbarriers() -> None:
    assert RUN_ID_SOURCES[0] == OURS and OURS in ENVIRONMENT_VARIABLES
    assert set(RUN_ID_SOURCES[1:]) <= set(LAUNCHER_VARIABLES)
    assert RESTARTS in LAUNCHER_VARIABLES
    assert not set(LAUNCHER_VARIABLES) & set(ENVIRONMENT_VARIABLES)


def test_from_env_reads_the_launchers_variables_of_the_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in (*LAUNCHER_VARIABLES, OURS):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("STEPBARRIER_JOB", "j")
    monkeypatch.setenv(SLURM, "4242")
    monkeypatch.setenv(RESTARTS, "1")
    made = BarrierConfig.from_env()
    assert (made.run_id, made.run_id_source) == ("slurm-4242-r1", SLURM)


# -- BarrierConfig built in code ----------------------------------------------------


def test_a_config_built_in_code_has_no_source_unless_given() -> None:
    assert BarrierConfig(job="j", run_id="r-1").run_id_source is None
    assert BarrierConfig(job="j", run_id="r-1").describe_run_id() == "r-1 (given in code)"
    given_source = BarrierConfig(job="j", run_id="slurm-81", run_id_source=SLURM)
    assert given_source.run_id_source == SLURM
    assert BarrierConfig(job="j", run_id_source=OURS).run_id is None  # set empty


def test_an_unknown_source_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ConfigurationError, match="TORCHELASTIC_RUN_ID") as info:
        BarrierConfig(job="j", run_id="r-1", run_id_source="KUBERNETES")  # type: ignore[arg-type]
    assert info.value.variable == "run_id_source"


def test_a_launchers_source_without_a_run_id_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="run_id is None") as info:
        BarrierConfig(job="j", run_id_source=SLURM)
    assert info.value.variable == "run_id_source"


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({OURS: "run-7"}, "run-7 (from STEPBARRIER_RUN_ID)"),
        ({TORCH: "t-1"}, "t-1 (from TORCHELASTIC_RUN_ID, torchrun's rendezvous id)"),
        ({SLURM: "81"}, "slurm-81 (from SLURM_JOB_ID, the Slurm job)"),
        ({}, "none (no STEPBARRIER_RUN_ID, TORCHELASTIC_RUN_ID or SLURM_JOB_ID is set)"),
    ],
)
def test_the_description_names_the_run_id_and_its_variable(env: dict[str, str], said: str) -> None:
    assert config(**env).describe_run_id() == said


# -- the INFO line --------------------------------------------------------------------


def run_id_lines(caplog: pytest.LogCaptureFixture, job: str) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == "stepbarrier.config" and record.getMessage().startswith(f"job {job}:")
    ]


def test_one_info_line_says_the_run_id_and_where_it_came_from(
    caplog: pytest.LogCaptureFixture,
) -> None:
    job = f"j-{uuid.uuid4().hex[:8]}"
    env = {"STEPBARRIER_JOB": job, SLURM: "81"}
    with caplog.at_level(logging.INFO, logger="stepbarrier.config"):
        BarrierConfig.from_env(env)
        BarrierConfig.from_env(env)  # a hook and a waiter of one process: one line
    assert run_id_lines(caplog, job) == [
        f"job {job}: run id slurm-81 (from SLURM_JOB_ID, the Slurm job)"
    ]
    assert all(record.levelno == logging.INFO for record in caplog.records)


def test_a_changed_run_id_is_said_again(caplog: pytest.LogCaptureFixture) -> None:
    job = f"j-{uuid.uuid4().hex[:8]}"
    with caplog.at_level(logging.INFO, logger="stepbarrier.config"):
        BarrierConfig.from_env({"STEPBARRIER_JOB": job, SLURM: "81"})
        BarrierConfig.from_env({"STEPBARRIER_JOB": job, SLURM: "81", RESTARTS: "1"})
        BarrierConfig.from_env({"STEPBARRIER_JOB": job, OURS: ""})
    lines = run_id_lines(caplog, job)
    assert [line.split(": run id ")[1].split(" ")[0] for line in lines] == [
        "slurm-81",
        "slurm-81-r1",
        "none",
    ]
    assert "STEPBARRIER_RUN_ID is set empty" in lines[-1]


def test_a_config_built_in_code_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    job = f"j-{uuid.uuid4().hex[:8]}"
    with caplog.at_level(logging.INFO, logger="stepbarrier.config"):
        BarrierConfig(job=job, run_id="r-1")
    assert run_id_lines(caplog, job) == []
