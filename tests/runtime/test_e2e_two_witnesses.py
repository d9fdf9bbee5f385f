"""A printed line never stops a job alone (issue 37): on the real handlers (on_log_line, the sweeper), a job that
prints a caught exception and trains on is alerted with its words, never stopped while the line its habit owes may
still come, nor while the agent's next step is not owed; without a second witness it is never stopped at all."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from corpus import real_lines
from handlers import on_log_line, sweeper
from localrun.moto_world import MINUTE, World, log_lines_event, scheduled_event
from stallwatch.aws.store import job_key
from stallwatch.core import contract, log_patterns

ENFORCE = {"stallwatch:mode": "enforce"}
SAGEMAKER = contract.SAGEMAKER_LOG_GROUP
SWEEP_S = 5 * MINUTE
STEP_MIN = 15  # the job's logging interval (no agent) or its step time (with the agent)
# A real block a job caught and trained on after (simpletransformers#763: "afterwards, the training continues"), and
# a real line the classifier reads as fatal, printed the same way (the case the issue names: a caught exception).
CAUGHT = next(b for b in real_lines.harmless_blocks() if b.name == "dataloader-del-assertion").lines
FATAL = (next(r for r in real_lines.lines(label="fatal", kind="python_exception") if log_patterns.match(r.text)).text,)
SKIPPED_BATCH = next(b for b in real_lines.harmless_blocks() if b.name == "fairseq-oom-skip-batch").lines


def _stream(job: str, host: str) -> str:
    return f"{job}/{host}-1700000000"


def _audits(rt, job: str) -> list[dict]:
    return [r["record"] for r in rt.audit.records(job_key("sagemaker", job), "audit")]


def _run(rt, world: World, context, minutes: int, lines_due: Callable[[float], None]) -> list[tuple[float, str]]:
    """The sweeper every 5 minutes for `minutes`, the job writing the lines due by then: (minutes in, status)."""
    seen = []
    for _ in range(minutes // 5):
        rt.clock.advance(SWEEP_S)
        lines_due(rt.clock())
        sweeper.handler(scheduled_event(), context)
        seen.append(((rt.clock() - world.now) / MINUTE, world.status(world.jobs[-1])))
    return seen


def _writer(world: World, job: str, hosts: list[str], at_min: list[float]) -> Callable[[float], None]:
    """Writes each progress line (`at_min`: minutes after the test's start) once its time has come."""
    pending = sorted(at_min)

    def due(now: float) -> None:
        while pending and world.now + pending[0] * MINUTE <= now:
            m = pending.pop(0)
            for host in hosts:
                world.logs(world.jobs[-1], host, [(-m, f"| epoch 003 | step {int(200 + m)} | loss 2.31")])

    return due


@pytest.mark.parametrize("block", [CAUGHT, FATAL], ids=["caught-traceback", "fatal-line"])
@pytest.mark.parametrize("on_time", [False, True], ids=["silent-after", "next-line-on-time"])
def test_a_one_host_job_without_the_agent_is_not_stopped_on_a_caught_exception_alone(
    rt, world, slack, context, block: tuple[str, ...], on_time: bool
) -> None:
    # Given a one-host SageMaker job without the agent, GPUs at 100 % throughout (no power reported), a line every
    # 15 minutes for 3 hours (the sweeper's sawtooth saw them), the last 5 minutes ago; 20 s ago it printed a caught
    # exception and trained on
    job = "bert-large-caught"
    world.create_job(job, hosts=1, tags=ENFORCE, training_since=world.now - 185 * MINUTE)
    world.host_gpu(job, "algo-1", world.every_minute(185, 100.0, end_min=-70))
    past = list(range(5, 185, STEP_MIN))
    world.logs(job, "algo-1", [(m, f"| epoch 002 | step {200 - m} | loss 2.40") for m in past])
    line_t = world.now - 20
    world.logs(job, "algo-1", [(20 / MINUTE, text) for text in block])
    world.swept(job, "algo-1", [*past, 20 / MINUTE], start_min=180)
    read_fatal = any(log_patterns.match(text) for text in block)

    # When the subscription delivers the lines, and the sweeper runs every 5 minutes for an hour, the job logging
    # its next lines on time (every 15 minutes from the last), or none
    woken = on_log_line.handler(
        log_lines_event(SAGEMAKER, _stream(job, "algo-1"), [(line_t, t) for t in block]), context
    )
    future = [m - 5 for m in range(STEP_MIN, 70, STEP_MIN)] if on_time else []
    seen = _run(rt, world, context, 65, _writer(world, job, ["algo-1"], future))

    # Then a line read as fatal is alerted at once with its words, never a stop warning
    if read_fatal:
        assert (woken["status"], woken["action"]) == ("decided", "alert")
        assert block[-1][:60] in slack.texts()[0] or block[-1][:60] in str(slack.posts[0])
    stops = [m for m, status in seen if status == "Stopping"]
    actions = [a["action"] for a in _audits(rt, job)]
    if on_time:
        # ... and a job that logs its next line on time is never warned nor stopped
        assert stops == []
        assert "warn" not in actions
    elif read_fatal:
        # ... while its next line may still come (due 10 minutes in), nothing more; once it is owed and absent (its
        # habit's margin, and as long as busy GPUs without power may be silent), the silence confirms the words
        assert stops
        assert stops[0] > STEP_MIN - 5
        stop = next(a for a in _audits(rt, job) if a["action"] == "stop")
        assert stop["diagnosis"] == "crashed_rank"
        assert any("owed" in reason for reason in stop["reasons"])


def _agent_steps(world: World, job: str, hosts: list[str], last_step_min: float) -> None:
    """The agent's windows every minute: a step every 15 minutes, the last `last_step_min` ago and on into the future
    (read only once their time has come), every host's GPUs at full power."""
    minutes = range(185, -70, -1)
    steps = {m for m in minutes if (last_step_min - m) % STEP_MIN == 0}
    done = lambda m: sum(1 for s in steps if s >= m)  # noqa: E731
    age = lambda m: (min((s for s in steps if s >= m), default=185) - m) * MINUTE  # noqa: E731
    world.agent_job(job, "Steps", [(world.now - m * MINUTE, float(m in steps)) for m in minutes])
    world.agent_job(job, "Step", [(world.now - m * MINUTE, float(done(m))) for m in minutes])
    world.agent_job(job, "LastStepAge", [(world.now - m * MINUTE, age(m)) for m in minutes])
    world.agent_job(job, "StepTime", [(world.now - m * MINUTE, STEP_MIN * MINUTE) for m in minutes if m in steps])
    for host in hosts:
        world.host_gpu(job, host, world.every_minute(185, 100.0, end_min=-70))
        world.agent_host(job, host, "GPUPowerWatts", world.every_minute(185, 640.0, end_min=-70))


@pytest.mark.parametrize("block", [SKIPPED_BATCH, CAUGHT], ids=["fairseq-skipped-batch", "caught-traceback"])
def test_every_rank_of_a_job_with_the_agent_printing_a_caught_error_is_never_stopped(
    rt, world, slack, context, block: tuple[str, ...]
) -> None:
    # Given a 4-host job with the agent and 15-minute steps, the last 5 minutes ago (the next is not owed for 10), its
    # GPUs busy at full power; 20 s ago every rank printed the same caught error (fairseq's skipped-batch OOM, or a
    # traceback read as fatal) and trained on
    job = "fairseq-moe-4host"
    hosts = [f"algo-{h}" for h in range(1, 5)]
    world.create_job(job, hosts=4, tags=ENFORCE, training_since=world.now - 185 * MINUTE)
    _agent_steps(world, job, hosts, last_step_min=5)
    world.logs(job, "algo-1", [(m, f"| epoch 002 | step {200 - m} | loss 2.40") for m in range(5, 185, STEP_MIN)])
    line_t = world.now - 20
    for host in hosts:
        world.logs(job, host, [(20 / MINUTE, text) for text in block])

    # When every rank's lines are delivered, and the sweeper runs every 5 minutes for 45 minutes as it steps on
    for host in hosts:
        on_log_line.handler(log_lines_event(SAGEMAKER, _stream(job, host), [(line_t, t) for t in block]), context)
    seen = _run(rt, world, context, 45, _writer(world, job, ["algo-1"], [10, 25, 40]))

    # Then it is never stopped nor warned: no step was owed, and its GPUs never let go or fell
    assert [status for _, status in seen if status == "Stopping"] == []
    assert "warn" not in [a["action"] for a in _audits(rt, job)]
