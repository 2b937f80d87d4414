"""The demo (``make demo``) gives each of its runs its own run id, shared by its processes."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator

import pytest

from examples.demo.run import _Demo
from stepbarrier import BarrierConfig
from stepbarrier._protocol.wire import RUN_ID


def demo() -> _Demo:
    return _Demo("demo-run-id", 2, "log:10", [6, 10], 20, 0.0, [sys.executable], "auto")


@pytest.fixture
def demos() -> Iterator[list[_Demo]]:
    made = [demo(), demo()]
    try:
        yield made
    finally:
        for each in made:  # nothing was started: only the work folders to remove
            shutil.rmtree(each.workdir, ignore_errors=True)


def test_each_demo_run_has_its_own_run_id_for_every_process(
    demos: list[_Demo], monkeypatch: pytest.MonkeyPatch
) -> None:
    # a shell inside a Slurm job under torchrun: neither id is the demo's
    monkeypatch.setenv("SLURM_JOB_ID", "81")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "t-1")
    monkeypatch.setenv("STEPBARRIER_RUN_ID", "the-shells-own")
    first, second = (each._base_env() for each in demos)
    assert RUN_ID.fullmatch(first["STEPBARRIER_RUN_ID"]) is not None
    assert first["STEPBARRIER_RUN_ID"].startswith("demo-")
    assert first["STEPBARRIER_RUN_ID"] != second["STEPBARRIER_RUN_ID"]
    assert first["STEPBARRIER_RUN_ID"] == demos[0].run_id  # the same for every process
    config = BarrierConfig.from_env(first)
    assert (config.run_id, config.run_id_source) == (demos[0].run_id, "STEPBARRIER_RUN_ID")
