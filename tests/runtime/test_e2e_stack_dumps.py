"""End to end on moto: a stalled job's alert names the odd rank out from the agent's stack dumps, read from the log
tail's pages or by one filtered FilterLogEvents, within the request limits and the decision's call budget; a healthy
decision reads none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from handlers import on_alarm
from localrun.moto_world import MINUTE, alarm_event
from stallwatch.aws.store import job_key
from stallwatch.core import alarms, stack_dumps
from stallwatch.core.config import EC2_LOG_GROUP
from stallwatch.core.contract import SAGEMAKER_LOG_GROUP
from tests.fixtures.request_limits import recording, slack_violations
from tests.runtime.test_e2e_ec2_clusters import JOB as EC2_JOB
from tests.runtime.test_e2e_ec2_clusters import _seed_ec2_hang
from tests.runtime.test_e2e_hardening import API_BUDGET
from tests.runtime.test_e2e_stalls import ENFORCE, seed_nccl_hang

# tests/agent/test_distributed.py's loader stall, as its two ranks wrote it: rank 1 in its loader's sleep, behind
LOADER = (Path(__file__).parents[1] / "core" / "stack_dumps" / "loader-stall.log").read_text().splitlines()
RANK_LINE = {int(line.split('"Rank":')[1].split(",")[0]): line for line in LOADER}
WHERE = "distributed_worker.py:135"


def _add_line(world, group: str, stream: str, minutes_ago: float, message: str) -> None:
    """One more line on a stream the seeding made."""
    event = {"timestamp": int((world.now - minutes_ago * MINUTE) * 1000), "message": message}
    world.clients.logs.put_log_events(logGroupName=group, logStreamName=stream, logEvents=[event])


def _stack_reads(requests) -> list[dict]:
    return [
        r.params
        for r in requests
        if r.operation == "FilterLogEvents" and r.params.get("filterPattern") == stack_dumps.FILTER_PATTERN
    ]


def _emf_lines(world, job: str, host: str, group: str, stream: str) -> None:
    """The agent's stdout line every minute up to now (its heartbeat): the host's stream never falls quiet."""
    document = {"_aws": {"Timestamp": 0, "CloudWatchMetrics": []}, "Scope": "host", "JobName": job, "Heartbeat": 1.0}
    for minutes_ago in range(38, -1, -1):
        _add_line(world, group, stream, minutes_ago, json.dumps(document))


@pytest.mark.parametrize("heartbeat", [False, True], ids=["hosts-quiet", "agent-lines-on-stdout"])
def test_a_hung_jobs_warning_names_the_rank_its_dumps_put_apart(rt, world, slack, context, heartbeat) -> None:
    # Given a 2-host job hung for 40 minutes whose ranks dumped their stacks a minute in (rank r on algo-(r+1)), its
    # hosts quiet since, or writing the agent's stdout line every minute (its default sink)
    job = "llama-8b-pretrain"
    seed_nccl_hang(world, job, ENFORCE)
    for rank, line in RANK_LINE.items():
        stream = f"{job}/algo-{rank + 1}-1700000000"
        _add_line(world, SAGEMAKER_LOG_GROUP, stream, 39, line)
        if heartbeat:
            _emf_lines(world, job, f"algo-{rank + 1}", SAGEMAKER_LOG_GROUP, stream)

    # When its progress alarm fires
    with recording() as requests:
        alarm = alarms.alarm_name(rt.config.alarm_prefix, "sagemaker", job, alarms.PROGRESS)
        result = on_alarm.handler(alarm_event(alarm), context)

    # Then the warning's Why and its Stacks section name rank 1 and its file:line: from the tail's pages when they
    # hold every line since the last step (quiet hosts), else from one read of the dumps alone
    assert (result["diagnosis"], result["action"]) == ("hang", "warn")
    reads = _stack_reads(requests)
    assert len(reads) == heartbeat
    if heartbeat:
        assert (reads[0]["logGroupName"], reads[0]["logStreamNamePrefix"]) == (SAGEMAKER_LOG_GROUP, f"{job}/")
    assert [v for r in requests for v in r.violations()] == []
    assert len(requests) <= API_BUDGET, sorted(r.operation for r in requests)
    (message,) = slack.posts
    assert slack_violations(message) == []
    blocks = str(message["blocks"])
    assert f"rank 1 on vm in {WHERE}" in blocks
    assert "*Stacks* (2 ranks dumped" in blocks
    assert "StallwatchStacks" not in blocks  # the dump lines are not shown as log lines

    # And the audit record keeps the grouping
    (audit,) = [r["record"] for r in rt.audit.records(job_key("sagemaker", job), "audit")]
    assert audit["evidence"]["stacks"]["named"] == [1]
    assert any(WHERE in reason for reason in audit["reasons"])


def test_a_job_still_stepping_reads_no_dump(rt, world, slack, context) -> None:
    # Given a job whose agent reports steps in its newest window (an alarm on a host's GPUs)
    job = "healthy-job"
    world.create_job(job, hosts=2, tags=ENFORCE)
    world.steps_until(job, last_step_min=-20)
    for host in ("algo-1", "algo-2"):
        world.host_gpu(job, host, world.every_minute(110, 97.0))
        world.progress_logs(job, host, until_min=0)

    # When it is decided
    with recording() as requests:
        on_alarm.handler(
            alarm_event(alarms.alarm_name(rt.config.alarm_prefix, "sagemaker", job, alarms.GPU_IDLE, "algo-1")), context
        )

    # Then no dump was asked for
    assert _stack_reads(requests) == []


def test_an_ec2_clusters_dumps_are_read_from_its_instances_streams(rt, world, slack, context) -> None:
    # Given a 2-node EC2 job hung 40 minutes ago, rank r's dump on node r's stream (the CloudWatch agent's), then the
    # agent's stdout line every minute
    instances = world.launch(2, {"stallwatch:job": EC2_JOB, "stallwatch:mode": "enforce"})
    _seed_ec2_hang(world, instances)
    for rank, line in RANK_LINE.items():
        _add_line(world, EC2_LOG_GROUP, instances[rank], 39, line)
        _emf_lines(world, EC2_JOB, instances[rank], EC2_LOG_GROUP, instances[rank])

    # When its progress alarm fires
    with recording() as requests:
        result = on_alarm.handler(
            alarm_event(alarms.alarm_name(rt.config.alarm_prefix, "ec2", EC2_JOB, alarms.PROGRESS)), context
        )

    # Then the warning names rank 1, read by one filtered call over the job's log group (each line's stream, an
    # instance id, names its node)
    assert result["diagnosis"] == "hang"
    (read,) = _stack_reads(requests)
    assert (read["logGroupName"], read.get("logStreamNames")) == (EC2_LOG_GROUP, None)
    assert f"rank 1 on vm in {WHERE}" in str(slack.posts[0]["blocks"])


@pytest.mark.parametrize(
    "forged",
    [
        {"Host": "vm", "Main": [{"file": "x" * 230_000, "line": 1, "func": "f"}]},  # a 230 KB dump line
        {"Host": "vm", "WorldSize": 10**12},  # set(range(WorldSize)): a MemoryError
        {"Host": "vm", "Main": [{"file": "a.py", "line": float("inf"), "func": "f"}]},  # int(inf): an OverflowError
    ],
    ids=["230KB-line", "world-of-10**12", "line-infinity"],
)
def test_a_dump_line_no_agent_writes_never_keeps_its_job_from_being_decided(rt, world, slack, context, forged) -> None:
    # Given a hung 2-host job whose rank 1 dump is over a bound (a forged or corrupted line) beside rank 0's own
    job = "llama-8b-pretrain"
    seed_nccl_hang(world, job, ENFORCE)
    record = json.loads(RANK_LINE[1]) | forged
    for rank, line in ((0, RANK_LINE[0]), (1, json.dumps(record))):
        _add_line(world, SAGEMAKER_LOG_GROUP, f"{job}/algo-{rank + 1}-1700000000", 39, line)

    # When its progress alarm fires
    with recording() as requests:
        alarm = alarms.alarm_name(rt.config.alarm_prefix, "sagemaker", job, alarms.PROGRESS)
        result = on_alarm.handler(alarm_event(alarm), context)

    # Then the job is decided and warned, within DynamoDB's item size and every other limit, and its audit kept
    assert (result["diagnosis"], result["action"]) == ("hang", "warn")
    assert [v for r in requests for v in r.violations()] == []
    (audit,) = [r["record"] for r in rt.audit.records(job_key("sagemaker", job), "audit")]
    assert len(json.dumps(audit)) < 20_000
    assert len(slack.posts) == 1
