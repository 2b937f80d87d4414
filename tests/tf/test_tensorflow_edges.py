"""Issue 33, cases 1-4, in real parameter-server jobs beside TensorFlow's own hook.

Each job runs on loopback with one OS process per task (``edge_task.py``, which
reuses ``migration_task.py``'s job): a ps, a chief with
``GlobalStepPublisherHook`` and workers in ``MonitoredTrainingSession``, some
with ``tf.compat.v1.train.GlobalStepWaiterHook`` (TensorFlow's), the others
with stepbarrier's. Workers only read the global step after their wait: the
step is the chief's alone. Every test names the row of the comparison table in
docs/tensorflow-keras.md ("Parity with TensorFlow's hook") it proves.

No assertion reads a clock: the machines are shared. Where a delay matters it
is counted in the chief's global steps, with a margin converted into steps by
the chief's own measured pace; the session ends are judged by what they were
allowed (arguments and deadlines recorded in the chief), not by how long they
took.

Two jobs serve the seven tests:

- ``hung_then_lost_redis`` (cases 1 and 2): the chief stops Redis (SIGSTOP) at
  step ``PAUSE_AT`` while both workers wait for ``HUNG_TARGET``; once both
  started, the test kills Redis, and the chief ends a session (its hook's
  ``end()`` pauses the publisher), then another at ``last_step`` (``end()``
  closes it with ``done=True``).
- ``dead_loop`` (cases 3 and 4): the chief's training loop dies at ``DIE_AT``
  in a process that lives on, its own stall timeout 600 s; a worker of ours with
  an 8 s stall timeout and TensorFlow's wait for a later step; three workers of
  ours in the situations of case 4 (a second session, a wrong password, a late
  start) and the control, a worker of a job that no chief publishes.
"""

from __future__ import annotations

import itertools
import math
import signal
from pathlib import Path
from typing import Any

import pytest

from stepbarrier._redis.outage import LOST_REDIS_WAIT
from stepbarrier._worker.waiter import SOURCE_SOCKET_TIMEOUT
from tests.conftest import subprocess_env
from tests.redis_harness import RedisServer
from tests.reliability.processes import wait_until
from tests.tf.example_processes import FINISH_TIMEOUT, ExampleProcesses
from tests.tf.test_drop_in import cluster_of, full_log, tf_config

# each job is set up by its first test: a few TensorFlow processes, about a minute
pytestmark = [pytest.mark.tensorflow, pytest.mark.timeout(600)]

TASK = str(Path(__file__).parent / "edge_task.py")
SESSION = "the session's global step"
NO_PUBLISHER_ADVICE = "add GlobalStepPublisherHook"
"""In the WARNING of issue 33 case 4 (``tf_hooks._NO_PUBLISHER_HINT``: "add
GlobalStepPublisherHook() to the chief's chief_only_hooks") and in the causes of
the no-chief warning ("add GlobalStepPublisherHook, StepPublisherCallback ...")."""

Records = dict[str, dict[str, Any]]


def start(
    job: ExampleProcesses,
    name: str,
    cluster: dict[str, list[str]],
    env: dict[str, str],
    kind: str,
    index: int,
) -> None:
    """Start one task of ``cluster`` (``edge_task.py``)."""
    job.start(name, TASK, {**env, "TF_CONFIG": tf_config(cluster, kind, index)})


def start_job(
    job: ExampleProcesses,
    cluster: dict[str, list[str]],
    chief_env: dict[str, str],
    workers: dict[str, dict[str, str]],
) -> None:
    """The ps, the chief (training once every worker is about to wait) and the workers."""
    start(job, "ps", cluster, subprocess_env(), "ps", 0)
    ready = ",".join(str(job.record_path(name)) + ".ready" for name in workers)
    start(job, "chief", cluster, {**chief_env, "WAIT_READY": ready}, "chief", 0)
    for index, (name, env) in enumerate(workers.items()):
        start(job, name, cluster, env, "worker", index)


def steps_per_second(chief: dict[str, Any], first: int, last: int) -> float:
    """The chief's pace from step ``first`` to step ``last`` (its own record)."""
    times = {step: at for step, at in chief["step_times"]}
    assert first in times and last in times, (first, last)
    return float((last - first) / max(times[last] - times[first], 1e-3))


# -- cases 1 and 2: Redis hangs in the middle of the wait, then it is lost ------------

PAUSE_AT = 180
"""The chief's step at which it stops Redis (9 s of training at its pace of 20
steps a second): long enough for two reads of the session's step at the pace
of the code before the fix, one every 5 s once a chief was seen, to fall into
the training, so that their distance shows."""
HUNG_TARGET = PAUSE_AT + 10
"""Both workers' step: half a second of training after Redis hung (before the
fix our worker noticed a hung Redis only at its next fallback read, and read
the session's step every 5 s meanwhile)."""
LAST_STEP = 1_000_000
"""The chief's ``last_step``: its second session jumps the step to it."""
LOAD_MARGIN = 1.5
"""Seconds of the chief's steps added to the designed bound, for a loaded machine."""
LATE_BY = SOURCE_SOCKET_TIMEOUT + 0.5
"""Seconds by design that our worker may start after TensorFlow's: its reads of the
session's step come every 0.5 s (``SESSION_READ_WITH_CHIEF``, TensorFlow's pace),
and a Redis call that hangs holds one back by at most ``SOURCE_SOCKET_TIMEOUT``."""


@pytest.fixture(scope="module")
def hung_then_lost_redis(tmp_path_factory: pytest.TempPathFactory) -> Records:
    workdir = tmp_path_factory.mktemp("hung-redis")
    server = RedisServer().start()  # its own: the chief stops it, the test kills it
    assert server.process is not None
    killed = workdir / "redis-killed"
    redis = {
        "STEPBARRIER_JOB": f"hung-{workdir.name}",
        "STEPBARRIER_REDIS_URL": server.url,
        "STEPBARRIER_HEARTBEAT": "0.5",
    }
    try:
        with ExampleProcesses(workdir) as job:
            chief = subprocess_env(
                **redis,
                CHIEF_LOOP="hang",
                PAUSE_AT=str(PAUSE_AT),
                REDIS_PID=str(server.process.pid),
                REDIS_KILLED=str(killed),
                LAST_STEP=str(LAST_STEP),
                STEP_SLEEP="0.05",
            )
            workers = {
                "stepbarrier": subprocess_env(**redis, WAIT_UNTIL_STEP=str(HUNG_TARGET)),
                "tensorflow": subprocess_env(
                    WORKER_HOOK="tensorflow", WAIT_UNTIL_STEP=str(HUNG_TARGET)
                ),
            }
            start_job(job, cluster_of(2), chief, workers)
            records = job.finish(*workers)
            server.kill()  # stopped, it dies of SIGKILL all the same: Redis is lost
            killed.touch()
            records.update(job.finish("chief"))
            for name in ("chief", *workers):
                records[name]["log"] = full_log(job, name)
    finally:
        if server.process is not None and server.process.poll() is None:
            server.process.send_signal(signal.SIGCONT)
        server.cleanup()
    return records


def test_redis_hung_mid_wait_our_worker_starts_with_tensorflow_s(
    hung_then_lost_redis: Records,
) -> None:
    """Row "Redis hangs in the middle of a wait (stopped: it accepts connections,
    never answers)": ours starts with TensorFlow's (issue 33, case 1)."""
    chief = hung_then_lost_redis["chief"]
    ours = hung_then_lost_redis["stepbarrier"]["sessions"][0]
    theirs = hung_then_lost_redis["tensorflow"]["sessions"][0]
    paused_at = chief["paused_redis_at"]
    assert paused_at is not None and PAUSE_AT <= paused_at < HUNG_TARGET, chief["log"]
    # ours had seen the chief on Redis before Redis hung: a read of a step below
    # the one the chief stopped Redis at, with a chief seen and Redis answering
    before = [read for read in ours["reads"] if read[0] < paused_at]
    assert any(seen and not lost for _, seen, lost in before), ours["reads"]
    # both waited, and both started at or after the step: never early
    assert ours["reads"][0][0] < HUNG_TARGET and theirs["reads"][0][0] < HUNG_TARGET
    assert ours["released_by"] == SESSION, ours
    theirs_at = theirs["reads"][-1][0]
    assert ours["released_at_step"] >= HUNG_TARGET and theirs_at >= HUNG_TARGET
    assert ours["first_step"] >= ours["released_at_step"]
    # ours started no later than TensorFlow's, give or take what its design allows
    # (one read interval and one hung call), counted in the chief's own steps
    released = max(ours["released_at_step"], theirs_at)
    pace = steps_per_second(chief, 1, released)
    allowed = math.ceil(pace * (LATE_BY + LOAD_MARGIN))
    assert ours["released_at_step"] <= theirs_at + allowed, (ours, theirs_at, pace)
    # and it read the session's step at TensorFlow's pace all along, with a chief
    # seen and Redis answering as after Redis hung: never a gap of 5 s of steps
    steps = [read[0] for read in ours["reads"]]
    gaps = [after - before for before, after in itertools.pairwise(steps)]
    assert max(gaps) <= allowed, (gaps, pace, ours["reads"])
    assert math.ceil(pace * 5.0) > allowed  # (a gap of the old 5 s pace would show)


def test_redis_lost_the_chief_s_session_ends_do_not_wait_for_it(
    hung_then_lost_redis: Records,
) -> None:
    """Row "Redis is lost (killed) while the chief trains, then its sessions end":
    each end waits at most ``LOST_REDIS_WAIT`` for it, not 10 s (issue 33, case 2)."""
    chief = hung_then_lost_redis["chief"]
    assert chief["error"] is None and chief["lost_seen"], chief["log"]
    # the first session's end() paused the publisher, asking for a 10 s flush
    # (another session may follow), with Redis known lost: it allowed itself
    # LOST_REDIS_WAIT, and gave up once it knew the step did not get through
    [pause] = chief["pause_calls"]
    assert pause["flush_timeout"] == 10.0 and pause["redis_lost"], pause
    assert pause["result"] is False, pause
    # the second session's end() reached last_step: close(done=True), 10 s asked
    [close] = chief["close_calls"]
    assert close["done"] is True and close["timeout"] == 10.0 and close["redis_lost"], close
    assert close["result"] is False, close
    # what each wait for Redis of those ends was allowed, on the publisher's clock
    flushes = [wait for wait in chief["waits"] if wait["in"] == "wait_stored"]
    stops = [wait for wait in chief["waits"] if wait["in"] == "stop"]
    assert flushes and stops, chief["waits"]
    for wait in chief["waits"]:
        assert wait["allowed"] is not None and wait["allowed"] <= LOST_REDIS_WAIT, wait
    assert all(wait.get("while_reachable") for wait in flushes), flushes
    assert [wait["done"] for wait in stops] == [True], stops
    # each end says so, once: the pause, then the close
    said = [line for line in chief["log"].splitlines() if "may not have reached Redis" in line]
    assert len(said) == 2 and all(" WARNING " in line for line in said), said


# -- cases 3 and 4: the chief's loop dies in a process that lives on -----------------

DIE_AT = 80
STALL_TARGET = 10_000
"""The step the stall workers wait for: it never comes."""
WORKER_STALL = 8
"""The stall timeout of our worker (the chief's is 600 s)."""
SECOND_SESSION_TARGET = 20
REFUSED_TARGET = 40
CONTROL_TARGET = 40
LATE_TARGET = 60
SECRET = "edges-correct-horse-battery"
WRONG = "edges-wrong-password"
SITUATIONS = ("second_session", "refused", "control", "late")


@pytest.fixture(scope="module")
def dead_loop(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    workdir = tmp_path_factory.mktemp("dead-loop")
    server = RedisServer(args=["--requirepass", SECRET]).start()  # for a wrong password
    redis = {
        "STEPBARRIER_JOB": f"dead-loop-{workdir.name}",
        "STEPBARRIER_REDIS_URL": server.url,
        "STEPBARRIER_REDIS_PASSWORD": SECRET,
        "STEPBARRIER_HEARTBEAT": "0.5",
    }
    cluster = cluster_of(6)
    try:
        with ExampleProcesses(workdir) as job:
            chief = subprocess_env(
                **redis,
                STEPBARRIER_STALL_TIMEOUT="600",
                CHIEF_LOOP="dies",
                DIE_AT=str(DIE_AT),
                STAY_ALIVE="150",  # far longer than the test needs: it kills it
                STEP_SLEEP="0.05",
            )
            stall = str(STALL_TARGET)
            workers = {
                "stall": subprocess_env(
                    **redis, STEPBARRIER_STALL_TIMEOUT=str(WORKER_STALL), WAIT_UNTIL_STEP=stall
                ),
                "tensorflow": subprocess_env(WORKER_HOOK="tensorflow", WAIT_UNTIL_STEP=stall),
                "second_session": subprocess_env(
                    **redis, WAIT_UNTIL_STEP=str(SECOND_SESSION_TARGET), SESSIONS="2"
                ),
                "refused": subprocess_env(
                    **{**redis, "STEPBARRIER_REDIS_PASSWORD": WRONG},
                    WAIT_UNTIL_STEP=str(REFUSED_TARGET),
                ),
                # Redis answers and holds no state of its job: what a chief without a
                # publisher leaves (no chief publishes under this job name)
                "control": subprocess_env(
                    **{**redis, "STEPBARRIER_JOB": f"no-publisher-{workdir.name}"},
                    WAIT_UNTIL_STEP=str(CONTROL_TARGET),
                ),
            }
            start_job(job, cluster, chief, workers)
            # the chief writes its record when its loop died: a worker joins now
            wait_until(job.record_path("chief").exists, FINISH_TIMEOUT, "the chief's loop died")
            late = subprocess_env(**redis, WAIT_UNTIL_STEP=str(LATE_TARGET))
            start(job, "late", cluster, late, "worker", len(workers))
            codes = {"stall": job.exit_code("stall")}
            # what else lived when our worker's wait ended
            alive = {name: job.processes[name].poll() is None for name in ("chief", "tensorflow")}
            tensorflow_record = job.record_path("tensorflow").exists()
            tensorflow_ready = Path(str(job.record_path("tensorflow")) + ".ready").exists()
            codes.update({name: job.exit_code(name) for name in SITUATIONS})
            records = {name: job.record(name) for name in ("chief", "stall", *SITUATIONS)}
            logs = {name: full_log(job, name) for name in ("chief", "stall", *SITUATIONS)}
    finally:
        server.cleanup()
    return {
        "codes": codes,
        "alive": alive,
        "tensorflow_record": tensorflow_record,
        "tensorflow_ready": tensorflow_ready,
        "records": records,
        "logs": logs,
    }


def test_a_dead_loop_in_a_live_chief_ends_the_wait_at_the_worker_s_stall_timeout(
    dead_loop: dict[str, Any],
) -> None:
    """Row "the chief's training loop died, its process lives on (a notebook, a
    caught error)": our worker ends with ``BarrierTimeout`` at its own stall
    timeout, 8 s, though the chief's is 600 s and its heartbeat goes on;
    TensorFlow's waits on (issue 33, case 3)."""
    chief = dead_loop["records"]["chief"]
    assert chief["error"] == f"the chief's training code failed at step {DIE_AT}", chief
    stall = dead_loop["records"]["stall"]
    assert dead_loop["codes"]["stall"] == 1, stall
    assert stall["error_type"] == "BarrierTimeout" and stall["limit"] == "stall", stall
    assert (
        "the chief's process still writes, but its training loop has handed no step over "
        f"for {WORKER_STALL} s"
    ) in stall["error"], stall
    assert stall["sessions"][0]["first_step"] is None  # it never trained
    # when it ended, the chief's process lived (and wrote: the message says so)...
    assert dead_loop["alive"]["chief"], dead_loop["logs"]["chief"]
    # ...and TensorFlow's worker, which waits for the same step, still waited, as
    # TensorFlow's hook does as long as the step does not come
    assert dead_loop["tensorflow_ready"] and not dead_loop["tensorflow_record"]
    assert dead_loop["alive"]["tensorflow"]


def no_advice(dead_loop: dict[str, Any], name: str) -> None:
    """The worker ended well, and its log never advises adding a publisher."""
    log = dead_loop["logs"][name]
    assert dead_loop["codes"][name] == 0, log
    advice = [line for line in log.splitlines() if NO_PUBLISHER_ADVICE in line]
    assert not advice, advice


def test_no_publisher_advice_for_a_worker_that_joins_after_its_step_passed(
    dead_loop: dict[str, Any],
) -> None:
    """Row "a late worker, after its step passed, the chief publishing": released at
    once, without the advice to add a publisher (issue 33, case 4)."""
    no_advice(dead_loop, "late")
    [session] = dead_loop["records"]["late"]["sessions"]
    # released by its first read of the session's step, before it asked Redis
    first, seen, lost = session["reads"][0]
    assert first >= LATE_TARGET and (seen, lost) == (False, False), session
    assert session["released_by"] == SESSION and session["released_at_step"] == first, session


def test_no_publisher_advice_for_a_worker_in_its_second_session(
    dead_loop: dict[str, Any],
) -> None:
    """Row "a worker's second session (`begin()` again), its step passed": it starts
    at once, without the advice to add a publisher (issue 33, case 4)."""
    no_advice(dead_loop, "second_session")
    first, second = dead_loop["records"]["second_session"]["sessions"]
    # the first wait was woken through Redis: the chief publishes
    assert first["released_by"] != SESSION and first["released_at_step"] >= SECOND_SESSION_TARGET
    # the second was released by its first read of the session's step
    step, seen, lost = second["reads"][0]
    assert step >= SECOND_SESSION_TARGET and (seen, lost) == (False, False), second
    assert second["released_by"] == SESSION, second


def test_no_publisher_advice_for_a_worker_that_redis_refuses(dead_loop: dict[str, Any]) -> None:
    """Row "Redis down or refusing": a worker refused by Redis (a wrong password)
    says so, waits on the session's step, and does not advise adding a publisher
    (issue 33, case 4)."""
    no_advice(dead_loop, "refused")
    log = dead_loop["logs"]["refused"]
    assert "authentication" in log and f"waiting on {SESSION} alone" in log, log
    assert WRONG not in log and SECRET not in log
    [session] = dead_loop["records"]["refused"]["sessions"]
    assert session["reads"][0][0] < REFUSED_TARGET, session  # it waited
    assert session["released_by"] == SESSION and session["released_at_step"] >= REFUSED_TARGET


def test_control_the_advice_is_given_when_redis_answers_with_no_state_of_the_job(
    dead_loop: dict[str, Any],
) -> None:
    """Row "only the workers' import changed, the chief as it was": the control of
    case 4, a worker whose job no chief publishes (Redis answers, with no state of
    the job): the WARNING with the advice is there (issue 33, case 4)."""
    log = dead_loop["logs"]["control"]
    assert dead_loop["codes"]["control"] == 0, log
    warnings = [line for line in log.splitlines() if NO_PUBLISHER_ADVICE in line]
    assert any(" WARNING " in line and "chief_only_hooks" in line for line in warnings), log
    [session] = dead_loop["records"]["control"]["sessions"]
    assert session["reads"][0][0] < CONTROL_TARGET, session  # it waited
    assert session["released_by"] == SESSION and session["released_at_step"] >= CONTROL_TARGET
