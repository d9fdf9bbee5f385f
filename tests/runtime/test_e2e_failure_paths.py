"""End to end on moto: what happens when acting fails after a decision is committed, when one job breaks the sweep,
and when a failed stop is released after the job's state moved on."""

from __future__ import annotations

import pytest

from handlers import on_alarm, sweeper
from localrun.moto_world import MINUTE, alarm_event, all_alarms, scheduled_event
from stallwatch.aws import actions
from stallwatch.aws.job_states import StoredState
from stallwatch.aws.slack import AlertMessage
from stallwatch.aws.store import job_key
from stallwatch.core import alarms, contract
from stallwatch.core.decision import JobState
from tests.runtime.test_e2e_stalls import ENFORCE, _alarm, audits, seed_nccl_hang

JOB = "falcon-40b-sft"
EXAMPLE_AMI = "ami-12c6146b"  # one of moto's built-in images


def _commit_stop(rt, key: str) -> tuple[JobState, int]:
    """A warned job's stop, committed as the watchdog does before calling StopTrainingJob; its state and version."""
    now = rt.clock()
    warned = JobState(stall_since=now - 40 * MINUTE, warned_at=now - 6 * MINUTE)
    rt.states.commit(
        key, rt.states.load(key), StoredState(warned, 0, "incident#1"), {"action": "warn"}, now - 6 * MINUTE
    )
    read = rt.states.load(key)
    stopping = warned.with_(stopped_at=now)
    rt.states.commit(key, read, StoredState(stopping, read.version, "incident#1"), {"action": "stop"}, now)
    return stopping, read.version + 1


# ---- Store.release_stop ----------------------------------------------------------------------------------------


def test_a_failed_stop_released_after_a_snooze_keeps_the_snooze(rt) -> None:
    # Given a committed stop, and an operator's snooze committed while StopTrainingJob was failing
    key = job_key("sagemaker", JOB)
    stopping, version = _commit_stop(rt, key)
    read = rt.states.load(key)
    snoozed = read.state.with_(snoozed_until=rt.clock() + 60 * MINUTE)
    rt.states.commit(key, read, StoredState(snoozed, read.version, read.incident), {"action": "snooze"}, rt.clock())

    # When the failed stop is released, with or without the version it was written at
    released = [rt.states.release_stop(key, stopping, version=version), rt.states.release_stop(key, stopping)]

    # Then nothing is written: the snooze, the newer state, survives
    assert released == [False, False]
    after = rt.states.load(key)
    assert after.state == snoozed
    assert after.version == version + 1


def test_a_failed_stop_of_a_job_that_ended_does_not_bring_its_state_back(rt) -> None:
    # Given a committed stop, and the job ending (its state cleared) before the stop's failure came back
    key = job_key("sagemaker", JOB)
    stopping, version = _commit_stop(rt, key)
    assert rt.states.close_job(key, "job Failed", rt.clock())

    # When the failed stop is released, Then no state item is recreated (it would have no expires_at)
    assert rt.states.release_stop(key, stopping, version=version) is False
    state_item = {"pk": {"S": key}, "sk": {"S": "state"}}
    assert "Item" not in rt.clients.dynamodb.get_item(TableName=rt.store.table, Key=state_item)


def test_a_failed_stop_nothing_changed_since_is_released_for_the_sweeper(rt) -> None:
    # Given a committed stop and nothing written since
    key = job_key("sagemaker", JOB)
    stopping, version = _commit_stop(rt, key)

    # When it is released, Then the stop is forgotten and the rest of the state kept
    assert rt.states.release_stop(key, stopping, version=version) is True
    after = rt.states.load(key)
    assert after.state == stopping.with_(stopped_at=None)
    assert (after.version, after.incident) == (version + 1, "incident#1")


# ---- a committed decision whose action raises ------------------------------------------------------------------


def test_a_stop_that_raises_is_recorded_and_retried_by_the_next_sweep(
    rt, world, slack, context, monkeypatch, counted, caplog
) -> None:
    # Given a hung enforced job past its warning, and actions.stop raising on its first call
    seed_nccl_hang(world, JOB, ENFORCE)
    on_alarm.handler(alarm_event(_alarm(rt, JOB)), context)
    rt.clock.advance(6 * MINUTE)

    stop = actions.stop
    broken = [True]

    def stop_or_raise(clients: object, facts: object) -> actions.StopResult:
        if broken[0]:
            raise RuntimeError("unexpected answer from StopTrainingJob")
        return stop(clients, facts)

    monkeypatch.setattr(actions, "stop", stop_or_raise)
    event = alarm_event(_alarm(rt, JOB, alarms.GPU_IDLE, "algo-1"), "2026-11-30T10:06:00.000+0000")

    # When a new alarm transition arrives
    result = on_alarm.handler(event, context)

    # Then the handler returns normally, the failure is counted, logged with the exception, and audited
    assert (result["status"], result["action"], result["stopped"]) == ("decided", "stop", False)
    assert world.status(JOB) == "InProgress"
    assert counted[contract.STOP_FAILURES] == 1
    assert any(r.levelname == "ERROR" and r.exc_info and "stop raised" in r.getMessage() for r in caplog.records)
    stop_audit = next(a for a in audits(rt, JOB) if a["action"] == "stop")
    assert stop_audit["outcome"]["stop"]["ok"] is False
    assert stop_audit["outcome"]["stop"]["detail"] == "RuntimeError: unexpected answer from StopTrainingJob"
    assert rt.states.load(job_key("sagemaker", JOB)).state.stopped_at is None

    # When Lambda retries the event, and the sweeper runs with stop working again
    broken[0] = False
    assert on_alarm.handler(event, context)["status"] == "coalesced"  # within the job's claim
    rt.clock.advance(5 * MINUTE)
    (outcome,) = sweeper.handler(scheduled_event(), context)["redecided"]

    # Then the sweeper stops the job, once
    assert (outcome["action"], outcome["stopped"]) == ("stop", True)
    assert world.status(JOB) == "Stopping"
    assert [a["outcome"]["stop"]["ok"] for a in audits(rt, JOB) if a["action"] == "stop"] == [False, True]


def test_a_message_that_fails_to_render_still_stops_and_records_the_outcome(
    rt, world, slack, context, monkeypatch, caplog
) -> None:
    # Given a hung enforced job past its warning, and the stop message failing to render
    seed_nccl_hang(world, JOB, ENFORCE)
    on_alarm.handler(alarm_event(_alarm(rt, JOB)), context)
    rt.clock.advance(6 * MINUTE)

    def broken_render(self: AlertMessage) -> dict:
        raise KeyError("blocks")

    monkeypatch.setattr(AlertMessage, "render", broken_render)

    # When the sweeper reaches the stop
    (outcome,) = sweeper.handler(scheduled_event(), context)["redecided"]

    # Then the job is stopped, the render failure is logged and audited, and nothing is kept to post again
    assert (outcome["action"], outcome["stopped"], outcome["posted"]) == ("stop", True, False)
    assert world.status(JOB) == "Stopping"
    assert any(r.levelname == "ERROR" and r.exc_info for r in caplog.records)
    stop_audit = next(a for a in audits(rt, JOB) if a["action"] == "stop")
    assert stop_audit["outcome"]["slack"] == {"ok": False, "detail": "render: KeyError: 'blocks'"}
    assert rt.pending_posts.oldest(10) == []


# ---- the sweeper ---------------------------------------------------------------------------------------------------


def test_one_job_that_fails_to_render_its_alarms_does_not_stop_the_sweep(
    rt, world, slack, context, monkeypatch, counted, caplog
) -> None:
    # Given a job whose alarms fail to render, a healthy job, and a hung enforced job past its warning; none has
    # alarms yet
    world.create_job("broken-job", hosts=1)
    world.create_job("ok-job", hosts=1)
    world.logs("broken-job", "algo-1", [(3, "step 1")])
    seed_nccl_hang(world, JOB, ENFORCE)
    on_alarm.handler(alarm_event(_alarm(rt, JOB)), context)
    rt.clock.advance(6 * MINUTE)
    render_alarms = alarms.render_alarms

    def render_or_fail(facts, *args, **kwargs):
        if facts.name == "broken-job":
            raise ValueError("instance type unknown")
        return render_alarms(facts, *args, **kwargs)

    monkeypatch.setattr(alarms, "render_alarms", render_or_fail)

    # When the sweeper runs
    summary = sweeper.handler(scheduled_event(), context)

    # Then the hung job is decided (and stopped: no alarms for it), the healthy job still gets its alarms, and the
    # error is reported
    assert (summary["running"], summary["alarms_provisioned"], summary["provisioning_errors"]) == (3, 1, 1)
    assert summary["log_idle_published"] == 3
    (outcome,) = summary["redecided"]
    assert (outcome["job"], outcome["action"], outcome["stopped"]) == (JOB, "stop", True)
    names = [a["AlarmName"] for a in all_alarms(rt.clients.cloudwatch)]
    assert names
    assert all(".ok-job." in name for name in names)
    assert counted[contract.SWEEP_ERRORS] == 1
    assert any(
        r.levelname == "ERROR" and r.exc_info and "could not provision alarms" in r.getMessage() for r in caplog.records
    )


@pytest.mark.parametrize(("value", "swept"), [("True", True), ("TRUE", True), ("true", True), ("false", False)])
def test_ec2_monitor_tag_is_matched_in_any_case_by_the_sweeper(rt, context, value, swept) -> None:
    # Given a running instance tagged stallwatch:monitor with `value`
    tags = [{"Key": "stallwatch:monitor", "Value": value}]
    instance = rt.clients.ec2.run_instances(
        ImageId=EXAMPLE_AMI,
        InstanceType="p4d.24xlarge",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
    )["Instances"][0]["InstanceId"]

    # When the sweeper runs, Then it is swept (and its alarms created) exactly when on_job_state would watch it
    summary = sweeper.handler(scheduled_event(), context)
    names = [a["AlarmName"] for a in all_alarms(rt.clients.cloudwatch)]
    assert summary["running"] == int(swept)
    assert summary["alarms_provisioned"] == int(swept)
    assert bool(names) is swept
    assert all(f".{instance}." in name for name in names)
