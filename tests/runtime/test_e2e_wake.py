"""A fatal line wakes the engine: on_log_line, given a subscription's delivery, decides on the line's job through the
same engine and claim as on_alarm (moto, a clock the test moves; the handler's waits move it)."""

from __future__ import annotations

import base64
import gzip
import json
import tracemalloc

import pytest

from handlers import on_alarm, on_log_line
from localrun import moto_ec2
from localrun.moto_world import MINUTE, World, alarm_event, log_lines_event
from stallwatch.aws.events import InvalidEventError
from stallwatch.aws.job_states import StoredState
from stallwatch.aws.source import AwsSignalSource
from stallwatch.aws.store import job_key
from stallwatch.core import alarms, contract, wake
from stallwatch.core.config import EC2_LOG_GROUP, StallwatchConfig
from tests.fixtures.request_limits import recording

ENFORCE = {"stallwatch:mode": "enforce"}
SAGEMAKER = contract.SAGEMAKER_LOG_GROUP
CRASH = "RuntimeError: CUDA error: an illegal memory access was encountered"
WATCHDOG = (
    "[rank{rank}]:[E ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=5121, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600031 "
    "milliseconds before timing out."
)
# AWS's sample of a CloudWatch Logs delivery to Lambda (Lambda developer guide, "Using Lambda with CloudWatch Logs"):
# two "[ERROR] ..." events of testLogGroup/testLogStream.
AWS_SAMPLE = {
    "awslogs": {
        "data": (
            "H4sIAAAAAAAAAHWPwQqCQBCGX0Xm7EFtK+smZBEUgXoLCdMhFtKV3akI8d0bLYmibvPPN3wz00CJxmQnTO41whwWQRIctmEcB6sQ"
            "bFC3CjW3XW8kxpOpP+OC22d1Wml1qZkQGtoMsScxaczKN3plG8zlaHIta5KqWsozoTYw3/djzwhpLwivWFGHGpAFe7DL68JlBUk+"
            "l7KSN7tCOEJ4M3/qOI49vMHj+zCKdlFqLaU2ZHV2a4Ct/an0/ivdX8oYc1UVX860fQDQiMdxRQEAAA=="
        )
    }
}
# CloudWatch Logs checking a destination (CloudWatch Logs user guide, subscription examples).
CONTROL_MESSAGE = {
    "messageType": "CONTROL_MESSAGE",
    "owner": "CloudwatchLogs",
    "logGroup": "",
    "logStream": "",
    "subscriptionFilters": [],
    "logEvents": [
        {
            "id": "",
            "timestamp": 1432826855000,
            "message": "CWL CONTROL MESSAGE: Checking health of destination Kinesis stream.",
        }
    ],
}


def _stream(job: str, host: str) -> str:
    return f"{job}/{host}-1700000000"


def _audits(rt, job: str, platform: str = "sagemaker") -> list[dict]:
    return [r["record"] for r in rt.audit.records(job_key(platform, job), "audit")]


def _table_items(rt) -> list[dict]:
    return rt.clients.dynamodb.scan(TableName=rt.store.table)["Items"]


def seed_crash(world: World, job: str, minutes_ago: float, tags: dict[str, str] | None = None) -> None:
    """A job without the agent: algo-2's rank died `minutes_ago` on an illegal memory access (its GPUs idle since),
    algo-1 spins at 100 % in the collective, and its log went quiet then too."""
    world.create_job(job, hosts=2, tags=tags if tags is not None else ENFORCE)
    world.host_gpu(job, "algo-1", world.every_minute(110, 100.0))
    world.host_gpu(job, "algo-2", world.every_minute(110, lambda m: 100.0 if m > minutes_ago else 0.0))
    world.progress_logs(job, "algo-1", until_min=minutes_ago)
    lines = [(minutes_ago, "Traceback (most recent call last):"), (minutes_ago, CRASH)]
    world.progress_logs(job, "algo-2", until_min=minutes_ago + 1, extra=lines)


def test_a_fatal_line_decides_its_job_at_once_with_no_alarm(rt, world, slack, context) -> None:
    # Given a rank that died 10 minutes ago (the engine's evidence is conclusive), and no alarm has fired
    job = "gpt-neox-20b"
    seed_crash(world, job, minutes_ago=10)
    line_t = world.now - 10 * MINUTE

    # When the subscription delivers its fatal lines
    event = log_lines_event(SAGEMAKER, _stream(job, "algo-2"), [(line_t, "Traceback (most recent call last):")])
    with recording() as requests:
        result = on_log_line.handler(event, context)
    assert [v for r in requests for v in r.violations()] == []

    # Then the job is decided by the wake-up: the crashed rank warned, its audit naming the stream
    assert (result["status"], result["diagnosis"], result["action"]) == ("decided", "crashed_rank", "warn")
    warned, stopped = _audits(rt, job)
    assert warned["trigger"] == f"log:{_stream(job, 'algo-2')}"
    assert "*algo-2*" in str(slack.posts[0]["blocks"])
    # And the same invocation waited out the 2-minute grace it named, and stopped the job then
    assert (stopped["trigger"], stopped["action"], stopped["at"] - warned["at"]) == ("recheck", "stop", 2 * MINUTE)
    [stop] = result["details"]["rechecks"]
    assert stop["stopped"] is True
    assert world.status(job) == "Stopping"


def test_a_line_just_written_is_decided_when_a_read_returns_it(rt, world, context) -> None:
    # Given a job whose rank wrote its traceback a second ago
    job = "llama-13b"
    seed_crash(world, job, minutes_ago=0, tags={})
    now = world.now

    # When it is delivered at once
    on_log_line.handler(log_lines_event(SAGEMAKER, _stream(job, "algo-2"), [(now - 1, CRASH)]), context)

    # Then the decision began when a read returns the line, within 15 s of it, and the claim holds from then
    audit = _audits(rt, job)[0]
    assert audit["trigger"].startswith("log:")
    assert audit["at"] == wake.seen_from(now - 1)
    assert now - 1 + wake.LINE_READABLE_S <= audit["at"] <= now - 1 + 15


def test_every_hosts_watchdog_lines_make_one_decision(rt, world, context, counted, monkeypatch) -> None:
    # Given 4 hosts hung in a collective whose NCCL watchdogs fire within a second of each other
    job = "llama-70b"
    world.create_job(job, hosts=4, tags=ENFORCE)
    for h in range(1, 5):
        world.host_gpu(job, f"algo-{h}", world.every_minute(110, 100.0))
        world.progress_logs(job, f"algo-{h}", until_min=11)
    # the burst just past a wake-up grid line, so all of it falls in one grid cell whatever the clock's start (a burst
    # across a grid line wakes two decisions, one a cell)
    line_t = wake.seen_from(world.now - 3) - wake.WAKE_GRID_S - wake.LINE_READABLE_S + 0.1

    # When each host's stream is delivered in its own invocation, the last ones while the first decides, each in a
    # container of its own (none has seen the job running)
    monkeypatch.setattr(rt, "found_running", lambda *_: False)
    results, calls = [], []
    for h in range(1, 5):
        event = log_lines_event(SAGEMAKER, _stream(job, f"algo-{h}"), [(line_t + h * 0.3, WATCHDOG.format(rank=8 * h))])
        with recording() as requests:
            results.append(on_log_line.handler(event, context))
        calls.append([r.operation for r in requests])

    # Then one decision was made: the other deliveries were coalesced into it, each at the cost of one GetItem
    assert [r["status"] for r in results] == ["decided", "coalesced", "coalesced", "coalesced"]
    assert counted[contract.COALESCED_LINES] == 3
    assert calls[1:] == [["GetItem"]] * 3
    assert [a["trigger"] for a in _audits(rt, job)].count(f"log:{_stream(job, 'algo-1')}") == 1


def test_a_claim_taken_before_the_line_does_not_swallow_it(rt, world, context) -> None:
    # Given an alarm decided the job a moment before its rank's fatal line was written (its claim holds for 2 min)
    job = "mixtral-8x7b"
    seed_crash(world, job, minutes_ago=0, tags={})
    on_alarm.handler(alarm_event(alarms.alarm_name(rt.config.alarm_prefix, "sagemaker", job, alarms.PROGRESS)), context)
    rt.clock.advance(20)

    # When the line written after it is delivered
    line_t = rt.clock() - 2
    result = on_log_line.handler(log_lines_event(SAGEMAKER, _stream(job, "algo-2"), [(line_t, CRASH)]), context)

    # Then it is decided again, from a read that returns the line
    assert result["status"] == "decided"
    first, second = _audits(rt, job)[:2]
    assert first["trigger"] != second["trigger"]
    assert second["trigger"].startswith("log:")
    assert second["at"] >= line_t + wake.LINE_READABLE_S


def test_a_decision_that_began_before_the_line_and_commits_first_is_decided_again(
    rt, world, context, monkeypatch
) -> None:
    # Given a job whose other decision (begun before the line) commits while the line's decision reads the signals
    job = "qwen-72b"
    seed_crash(world, job, minutes_ago=0, tags={})
    key = job_key("sagemaker", job)
    read_signals = AwsSignalSource.job_signals

    def concurrently(source, name, now, *args, **kwargs):
        earlier = rt.states.load(key)
        rt.states.commit(key, earlier, StoredState(earlier.state, earlier.version), {"trigger": "sweeper"}, now - 30)
        monkeypatch.setattr(AwsSignalSource, "job_signals", read_signals)
        return read_signals(source, name, now, *args, **kwargs)

    monkeypatch.setattr(AwsSignalSource, "job_signals", concurrently)

    # When the line is delivered
    result = on_log_line.handler(log_lines_event(SAGEMAKER, _stream(job, "algo-2"), [(world.now - 1, CRASH)]), context)

    # Then its decision lost the first commit, decided again on the state the other wrote, and was committed
    assert result["status"] == "decided"
    assert [a["trigger"] for a in _audits(rt, job)][:2] == ["sweeper", f"log:{_stream(job, 'algo-2')}"]


def test_a_line_an_earlier_decision_saw_is_coalesced(rt, world, context) -> None:
    # Given an alarm decided the job 30 s after its fatal line
    job = "falcon-40b"
    seed_crash(world, job, minutes_ago=1, tags={})
    on_alarm.handler(alarm_event(alarms.alarm_name(rt.config.alarm_prefix, "sagemaker", job, alarms.PROGRESS)), context)

    # When the line (a minute old) is delivered late
    line_t = world.now - MINUTE
    result = on_log_line.handler(log_lines_event(SAGEMAKER, _stream(job, "algo-2"), [(line_t, CRASH)]), context)

    # Then nothing more is decided
    assert result["status"] == "coalesced"
    assert len(_audits(rt, job)) == 1


def test_the_rechecks_due_within_the_wait_are_decided_in_the_same_invocation(rt, world, slack, context) -> None:
    # Given every host's NCCL watchdog fired 10 s ago after a hang, the job silent since, past the line its habit
    # (a line every 5 minutes, in the sweeper's sawtooth) owed: confirmed a minute after them
    job = "llama-70b-wd"
    world.create_job(job, hosts=2, tags=ENFORCE)
    for h in (1, 2):
        world.host_gpu(job, f"algo-{h}", world.every_minute(110, 100.0))
        world.progress_logs(job, f"algo-{h}", until_min=11)
        world.swept(job, f"algo-{h}", [*range(110, 14, -5), 10 / MINUTE])  # and the watchdog's lines, 10 s ago
    line_t = world.now - 10
    for h in (1, 2):
        world.clients.logs.put_log_events(
            logGroupName=SAGEMAKER,
            logStreamName=_stream(job, f"algo-{h}"),
            logEvents=[{"timestamp": int(line_t * 1000), "message": WATCHDOG.format(rank=8 * h)}],
        )

    # When the first host's lines are delivered
    event = log_lines_event(SAGEMAKER, _stream(job, "algo-1"), [(line_t, WATCHDOG.format(rank=8))])
    result = on_log_line.handler(event, context)

    # Then the lines alone are alerted at once; the invocation waited for the rechecks its decisions asked for: the
    # hang warned when the lines were a minute old (their second witness: no line where the habit owed one), stopped
    # 2 minutes later (the grace of conclusive evidence)
    assert (result["diagnosis"], result["action"]) == ("hang", "alert")
    warned, stopped = result["details"]["rechecks"]
    assert (warned["diagnosis"], warned["action"], stopped["action"], stopped["stopped"]) == (
        "hang",
        "warn",
        "stop",
        True,
    )
    decided = _audits(rt, job)
    assert [a["trigger"] for a in decided] == [f"log:{_stream(job, 'algo-1')}", "recheck", "recheck"]
    assert decided[1]["at"] == pytest.approx(line_t + 60, abs=1)
    assert decided[2]["at"] - decided[1]["at"] == 2 * MINUTE
    assert "no stop" in slack.texts()[0]
    assert "will be stopped" in slack.texts()[1]
    assert world.status(job) == "Stopping"


def test_an_ec2_instances_line_wakes_its_jobs_decision(rt, world, context) -> None:
    # Given a 2-node EC2 job whose node 2's rank died 10 minutes ago, its GPUs idle since; node 1 spins
    nodes = world.launch(2, {"stallwatch:job": "ec2-llm", **ENFORCE})
    moto_ec2.set_instance_times(nodes, launched=world.now - 120 * MINUTE)
    world.ec2_gpu(nodes[0], world.every_minute(110, 100.0))
    world.ec2_gpu(nodes[1], world.every_minute(110, lambda m: 100.0 if m > 10 else 0.0), memory_mib=0.0)
    world.ec2_logs(nodes[1], [(m, f"step {110 - m} loss 2.3") for m in range(110, 10, -5)] + [(10, CRASH)])

    # When the line of node 2's stream is delivered
    line_t = world.now - 10 * MINUTE
    result = on_log_line.handler(log_lines_event(EC2_LOG_GROUP, nodes[1], [(line_t, CRASH)]), context)

    # Then the job its tags name is decided: its crashed rank warned
    assert (result["job"], result["status"], result["diagnosis"]) == ("ec2-llm", "decided", "crashed_rank")
    assert _audits(rt, "ec2-llm", "ec2")[0]["trigger"] == f"log:{nodes[1]}"


@pytest.mark.parametrize(
    ("group", "stream", "reason"),
    [
        (SAGEMAKER, _stream("no-such-job", "algo-1"), "not_found"),
        (SAGEMAKER, "no-such-job/not-a-host", "ignored"),
        ("/aws/lambda/other", _stream("no-such-job", "algo-1"), "ignored"),
        (EC2_LOG_GROUP, "i-0123456789abcdef0", "ignored"),
    ],
    ids=["unknown-job", "not-a-sagemaker-stream", "another-group", "unknown-instance"],
)
def test_a_line_of_no_known_job_writes_nothing(rt, context, group: str, stream: str, reason: str) -> None:
    result = on_log_line.handler(log_lines_event(group, stream, [(rt.clock() - 30, CRASH)]), context)
    assert result["status"] == reason
    assert _table_items(rt) == []


def test_a_line_of_a_platform_not_watched_wakes_nothing(rt, world, context) -> None:
    # Given an EC2 job whose node's rank died, in a deployment that does not watch EC2
    nodes = world.launch(1, {"stallwatch:job": "ec2-llm", **ENFORCE})
    rt.config = StallwatchConfig.model_validate({"platforms": {"ec2": {"monitor": False}}})
    # When its fatal line is delivered from the EC2 group, Then nothing is read of it, decided or written
    result = on_log_line.handler(log_lines_event(EC2_LOG_GROUP, nodes[0], [(rt.clock() - 30, CRASH)]), context)
    assert result["status"] == "ignored"
    assert _table_items(rt) == []


def test_an_ended_job_is_not_decided(rt, world, context) -> None:
    # Given a job that has ended
    job = "ended-job"
    seed_crash(world, job, minutes_ago=10)
    from localrun import moto_sagemaker

    moto_sagemaker.set_training_job_status(job, "Failed", "Failed", at=world.now - 60)
    # When its last fatal line is delivered, Then nothing is decided or written
    result = on_log_line.handler(
        log_lines_event(SAGEMAKER, _stream(job, "algo-2"), [(world.now - 600, CRASH)]), context
    )
    assert result["status"] == "ended"
    assert _table_items(rt) == []


def test_awss_sample_payload_and_a_control_message_change_nothing(rt, context) -> None:
    # Given AWS's documented sample delivery (an unknown group's "[ERROR]" lines) and a CONTROL_MESSAGE
    control = {"awslogs": {"data": base64.b64encode(gzip.compress(json.dumps(CONTROL_MESSAGE).encode())).decode()}}
    # When each is delivered, Then each is parsed, ignored, and nothing is written
    sample = on_log_line.handler(AWS_SAMPLE, context)
    assert (sample["status"], sample["details"]["reason"]) == (
        "ignored",
        "no fatal line nor stall record among 2 events",
    )
    assert on_log_line.handler(control, context)["details"]["reason"].startswith("CONTROL_MESSAGE")
    assert _table_items(rt) == []


def test_lines_that_are_not_fatal_wake_nothing(rt, world, context) -> None:
    job = "quiet-job"
    seed_crash(world, job, minutes_ago=10)
    benign = [(world.now - 5, "exit code 0"), (world.now - 4, "step 120 loss 2.31")]
    result = on_log_line.handler(log_lines_event(SAGEMAKER, _stream(job, "algo-1"), benign), context)
    assert result["status"] == "ignored"
    assert _audits(rt, job) == []


def _delivery(data: dict) -> dict:
    return {"awslogs": {"data": base64.b64encode(gzip.compress(json.dumps(data).encode(), 9)).decode()}}


def test_a_payload_that_inflates_past_its_bound_is_cut_there_and_counted(rt, world, context, counted) -> None:
    # Given a delivery of 64 KB that inflates to 48 MB (one stream's 48 events of 1 MB of "A"): Powertools' model
    # inflated it whole, and its JSON, 144 MB at its peak
    job = "bomb-job"
    seed_crash(world, job, minutes_ago=10)
    events = [(world.now - 60, "A" * (1 << 20))] * 48
    event = json.loads(json.dumps(log_lines_event(SAGEMAKER, _stream(job, "algo-1"), events)))
    assert len(event["awslogs"]["data"]) < 100_000

    # When it is delivered
    tracemalloc.start()
    result = on_log_line.handler(event, context)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()

    # Then at most 1 MB was inflated, its whole events read (none: the first is longer), the rest counted as dropped
    assert peak < 16 << 20  # 16 MB
    assert (result["status"], result["details"]["reason"]) == (
        "ignored",
        "no fatal line nor stall record among 0 events",
    )
    assert counted[contract.SUBSCRIPTION_BYTES_DROPPED] > 0
    assert _audits(rt, job) == []


def test_a_fatal_line_before_the_bound_still_wakes_its_job(rt, world, context, counted) -> None:
    # Given a rank that died 10 minutes ago, its fatal line first in a delivery that runs past the bound
    job = "long-delivery"
    seed_crash(world, job, minutes_ago=10)
    line_t = world.now - 10 * MINUTE
    lines = [(line_t, CRASH), *[(line_t, "x" * 200_000)] * 8]
    event = log_lines_event(SAGEMAKER, _stream(job, "algo-2"), lines)

    # When it is delivered
    result = on_log_line.handler(event, context)

    # Then the events read whole before the bound wake the job's decision, and the rest is counted as dropped
    assert (result["status"], result["diagnosis"]) == ("decided", "crashed_rank")
    assert counted[contract.SUBSCRIPTION_BYTES_DROPPED] > 0


@pytest.mark.parametrize(
    "event",
    [
        {"awslogs": {"data": base64.b64encode(gzip.compress(json.dumps(CONTROL_MESSAGE).encode())[:-30]).decode()}},
        {"awslogs": {"data": base64.b64encode(gzip.compress(b"[" * 100_000 + b"]" * 100_000)).decode()}},
        {"awslogs": {"data": base64.b64encode(gzip.compress(b"\xff\xfe" * 10)).decode()}},
    ],
    ids=["gzip-cut-short", "nested-100000-deep", "not-utf8"],
)
def test_a_payload_that_is_no_delivery_is_refused_not_raised_otherwise(rt, context, counted, event) -> None:
    with pytest.raises(InvalidEventError, match="malformed CloudWatch Logs subscription event"):
        on_log_line.handler(event, context)
    assert counted[contract.MALFORMED_EVENTS] == 1
    assert _table_items(rt) == []


@pytest.mark.parametrize(
    "event",
    [
        {"awslogs": {"data": "not base64 gzip"}},
        {"awslogs": {}},
        {"Records": []},
        {"awslogs": {"data": base64.b64encode(gzip.compress(b'{"messageType": "DATA_MESSAGE"}')).decode()}},
    ],
    ids=["not-gzip", "no-data", "another-event", "no-fields"],
)
def test_a_malformed_event_is_refused_and_changes_nothing(rt, context, counted, event) -> None:
    with pytest.raises(InvalidEventError, match="malformed CloudWatch Logs subscription event"):
        on_log_line.handler(event, context)
    assert counted[contract.MALFORMED_EVENTS] == 1
    assert _table_items(rt) == []
