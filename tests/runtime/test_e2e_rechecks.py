"""End to end on moto: a decision that says when its evidence turns decisive is decided again then, by a one-time
EventBridge Scheduler schedule invoking on_alarm (`localrun.moto_scheduler` plays Scheduler on the test's clock)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from handlers import on_alarm, sweeper
from localrun.moto_world import MINUTE, RECHECK_GROUP, RECHECK_ROLE_ARN, alarm_event, scheduled_event
from stallwatch.aws.events import InvalidEventError
from stallwatch.aws.store import job_key
from stallwatch.core import contract, engine
from stallwatch.core.decision import Decision
from stallwatch.core.signals import Platform
from stallwatch.runtime import decide, environment
from tests.fixtures.request_limits import recording
from tests.runtime.test_e2e_hardening import API_BUDGET, SERVICES, _inject
from tests.runtime.test_e2e_stalls import ENFORCE, _alarm, audits, seed_nccl_hang

JOB = "t5-xxl"


def _lone_signal(world, job: str = JOB) -> None:
    """Steps stopped 11 minutes ago on busy GPUs that report no power: the engine waits for the full threshold."""
    world.create_job(job, hosts=2, tags=ENFORCE)
    world.steps_until(job, last_step_min=11)
    for host in ("algo-1", "algo-2"):
        world.host_gpu(job, host, world.every_minute(110, 99.0))


def _schedules(rt) -> list[dict[str, Any]]:
    scheduler = rt.clients.scheduler
    names = [s["Name"] for s in scheduler.list_schedules(GroupName=RECHECK_GROUP)["Schedules"]]
    described = [scheduler.get_schedule(Name=name, GroupName=RECHECK_GROUP) for name in names]
    return [{k: v for k, v in schedule.items() if k != "ResponseMetadata"} for schedule in described]


def _calls(rt) -> Counter[str]:
    """Every AWS call the runtime's clients make from now on, by operation, Scheduler's included."""
    calls: Counter[str] = Counter()
    for service in (*SERVICES, "scheduler"):
        getattr(rt.clients, service).meta.events.register("before-call", lambda model, **_: calls.update([model.name]))
    return calls


def _every_decision_asks_for_a_recheck(monkeypatch: pytest.MonkeyPatch, after: float) -> None:
    """The engine's decisions, each asking to be decided again `after` seconds later."""
    decide_now = engine.decide

    def asking(*args: Any) -> Decision:
        decision = decide_now(*args)
        return replace(decision, recheck_at=decision.at + after)

    monkeypatch.setattr(engine, "decide", asking)


def _recheck(job: str, at: float, platform: str = "sagemaker") -> dict[str, Any]:
    """A recheck's input, as Scheduler delivers it to on_alarm."""
    return {"source": "stallwatch.recheck", "platform": platform, "job": job, "at": at}


def test_a_lone_signal_is_warned_by_its_recheck_at_the_full_threshold(rt, world, slack, context, rechecks) -> None:
    # Given a lone signal the progress alarm looks at early, at 2/3 of the stall threshold
    _lone_signal(world)
    calls = _calls(rt)
    early = on_alarm.handler(alarm_event(_alarm(rt, JOB)), context)
    asked_at = rt.clock()

    # Then nothing is posted yet, and one schedule (one call, within the decision's budget) fires on_alarm at the
    # minute the engine asked for, rounded up
    recheck_at = rt.states.load(job_key("sagemaker", JOB)).state.recheck_at
    assert (early["diagnosis"], early["action"]) == ("healthy", "none")
    assert early["details"]["recheck"]["ok"] is True
    assert calls["CreateSchedule"] == 1
    assert sum(calls.values()) <= API_BUDGET
    [schedule] = _schedules(rt)
    fires_at = early["details"]["recheck"]["fires_at"]
    assert recheck_at <= fires_at < recheck_at + MINUTE
    assert fires_at >= asked_at + MINUTE
    assert slack.posts == []

    # When the clock reaches a moment before that minute, then the minute itself
    rt.clock.now = fires_at - 1
    assert rechecks.fire_due(rt.clock()) == []
    rt.clock.now = fires_at + 20
    [fired] = rechecks.fire_due(rt.clock())

    # Then the recheck decides the hang and warns at once, not at the next sweep; its schedule is gone, and the one
    # left is the warning's: the grace's end, when the stop comes
    assert fired.name == schedule["Name"]
    assert (fired.result["status"], fired.result["diagnosis"], fired.result["action"]) == ("decided", "hang", "warn")
    assert len(slack.posts) == 1
    assert "will be stopped" in slack.texts()[0]
    assert [a["trigger"] for a in audits(rt, JOB)][-1] == "recheck"
    [stop] = _schedules(rt)
    grace = fired.result["details"]["recheck"]
    assert stop["Name"] == grace["schedule"]
    assert grace["at"] == pytest.approx(rt.clock() + 5 * MINUTE, abs=1)


def test_a_recheck_is_scheduled_once_per_time_the_engine_gives(rt, world, context, rechecks, monkeypatch) -> None:
    # Given a job whose decisions ask for a recheck at 10:20, then 10:20 again, then 10:25
    _lone_signal(world)
    asked = iter([rt.clock() + 20 * MINUTE, rt.clock() + 20 * MINUTE, rt.clock() + 25 * MINUTE])
    decide_now = engine.decide
    monkeypatch.setattr(engine, "decide", lambda *args: replace(decide_now(*args), recheck_at=next(asked)))
    calls = _calls(rt)

    # When three alarm transitions are decided, each after the last one's claim ran out
    results = []
    for minute in (0, 3, 6):
        rt.clock.now = world.now + minute * MINUTE
        stamp = f"2026-11-30T10:0{minute}:00.000+0000"
        results.append(on_alarm.handler(alarm_event(_alarm(rt, JOB), timestamp=stamp), context))

    # Then Scheduler is asked twice, one call each: the first time, and when the time moved (the pending schedule
    # updated); the job has one schedule, at 10:25
    assert [r["status"] for r in results] == ["decided"] * 3
    assert ["recheck" in r.get("details", {}) for r in results] == [True, False, True]
    assert (calls["CreateSchedule"], calls["UpdateSchedule"]) == (1, 1)
    [schedule] = _schedules(rt)
    assert json.loads(schedule["Target"]["Input"])["at"] == world.now + 25 * MINUTE


def test_a_pending_recheck_a_later_decision_no_longer_needs_is_deleted_with_one_call(
    rt, world, context, rechecks, monkeypatch
) -> None:
    # Given a job whose first decision asks for a recheck at 10:20, and whose later decisions ask for none
    _lone_signal(world)
    asked = iter([rt.clock() + 20 * MINUTE, None, None])
    decide_now = engine.decide
    monkeypatch.setattr(engine, "decide", lambda *args: replace(decide_now(*args), recheck_at=next(asked)))
    on_alarm.handler(alarm_event(_alarm(rt, JOB), timestamp="2026-11-30T10:00:00.000+0000"), context)
    assert len(_schedules(rt)) == 1
    calls = _calls(rt)

    # When the job is decided again at 10:03 (its recheck pending) and at 10:06 (none left)
    results = []
    with recording() as requests:
        for minute in (3, 6):
            rt.clock.now = world.now + minute * MINUTE
            stamp = f"2026-11-30T10:0{minute}:00.000+0000"
            results.append(on_alarm.handler(alarm_event(_alarm(rt, JOB), timestamp=stamp), context))

    # Then the pending schedule was deleted, with one call, and nothing was asked of Scheduler the second time
    assert [r["status"] for r in results] == ["decided"] * 2
    assert results[0]["details"]["recheck"] == {"cancelled": True}
    assert "recheck" not in results[1].get("details", {})
    assert calls["DeleteSchedule"] == 1
    assert calls["CreateSchedule"] + calls["UpdateSchedule"] == 0
    assert _schedules(rt) == []
    assert [v for r in requests for v in r.violations()] == []


def test_a_recheck_that_cannot_be_deleted_is_logged_and_never_raised(rt, world, context, rechecks, monkeypatch) -> None:
    # Given a pending recheck, and Scheduler refusing DeleteSchedule
    _lone_signal(world)
    asked = iter([rt.clock() + 20 * MINUTE, None])
    decide_now = engine.decide
    monkeypatch.setattr(engine, "decide", lambda *args: replace(decide_now(*args), recheck_at=next(asked)))
    on_alarm.handler(alarm_event(_alarm(rt, JOB), timestamp="2026-11-30T10:00:00.000+0000"), context)
    _inject(rt.clients.scheduler, "DeleteSchedule", "AccessDeniedException", times=100)

    # When a later decision needs no recheck
    rt.clock.now = world.now + 3 * MINUTE
    result = on_alarm.handler(alarm_event(_alarm(rt, JOB), timestamp="2026-11-30T10:03:00.000+0000"), context)

    # Then the decision stands, the failure is in its outcome, and the schedule is left to fire and be skipped
    assert result["status"] == "decided"
    assert result["details"]["recheck"]["cancelled"] is False
    assert "AccessDenied" in result["details"]["recheck"]["detail"]
    assert len(_schedules(rt)) == 1


def test_a_recheck_is_not_coalesced_into_a_claim_taken_before_its_time(rt, world, slack, context, rechecks) -> None:
    # Given a job decided at 10:00 (its claim held until 10:02) whose recheck comes due at 10:00:30
    _lone_signal(world)
    on_alarm.handler(alarm_event(_alarm(rt, JOB)), context)
    decided_at = rt.clock()
    rt.clock.advance(60)

    # When another alarm arrives at 10:01, and the recheck for 10:00:30 too
    alarm = on_alarm.handler(alarm_event(_alarm(rt, JOB), timestamp="2026-11-30T10:01:00.000+0000"), context)
    recheck = on_alarm.handler(_recheck(JOB, decided_at + 30), context)

    # Then the alarm is coalesced into the held claim, but the recheck is decided
    assert alarm["status"] == "coalesced"
    assert recheck["status"] == "decided"
    assert audits(rt, JOB)[-1]["trigger"] == "recheck"


def test_a_recheck_after_which_a_decision_was_made_is_skipped_and_reads_nothing(rt, world, slack, context) -> None:
    # Given a hung job warned at 10:06
    seed_nccl_hang(world, JOB, ENFORCE)
    rt.clock.advance(6 * MINUTE)
    on_alarm.handler(alarm_event(_alarm(rt, JOB)), context)
    before = audits(rt, JOB)
    calls = _calls(rt)

    # When a recheck asked for 10:05 arrives (late, or delivered twice), and one asked for 10:06 exactly
    late = on_alarm.handler(_recheck(JOB, rt.clock() - MINUTE), context)
    same = on_alarm.handler(_recheck(JOB, rt.clock()), context)

    # Then the engine already looked at or after those times: skipped, one conditional UpdateItem each, no
    # signal read, nothing decided, posted or written
    assert (late["status"], same["status"]) == ("skipped", "skipped")
    assert dict(calls) == {"UpdateItem": 2}
    assert audits(rt, JOB) == before
    assert len(slack.posts) == 1


def test_a_schedule_that_fails_is_counted_never_raised_and_the_sweeper_decides_it(
    rt, world, slack, context, rechecks, counted
) -> None:
    # Given Scheduler refusing every CreateSchedule (a role that lost its grant)
    _lone_signal(world)
    _inject(rt.clients.scheduler, "CreateSchedule", "AccessDeniedException", times=100)

    # When the early look decides
    early = on_alarm.handler(alarm_event(_alarm(rt, JOB)), context)

    # Then the decision stands, the failure is in its outcome and counted, nothing raised
    assert (early["status"], early["action"]) == ("decided", "none")
    assert early["details"]["recheck"]["ok"] is False
    assert "AccessDenied" in early["details"]["recheck"]["detail"]
    assert counted[contract.RECHECK_SCHEDULE_FAILURES] == 1
    assert _schedules(rt) == []

    # And the sweeper's rule still decides it once the recheck's time has passed
    rt.clock.advance(5 * MINUTE)
    (late,) = sweeper.handler(scheduled_event(), context)["redecided"]
    assert (late["diagnosis"], late["action"]) == ("hang", "warn")


def test_a_failed_schedule_never_blocks_a_warning_or_its_post(rt, world, slack, context, rechecks, monkeypatch) -> None:
    # Given a hung job whose warning asks for a recheck when its grace ends, and Scheduler failing
    seed_nccl_hang(world, JOB, ENFORCE)
    _inject(rt.clients.scheduler, "CreateSchedule", "InternalServerException", times=100)
    _every_decision_asks_for_a_recheck(monkeypatch, after=5 * MINUTE)

    # When its alarm is decided
    result = on_alarm.handler(alarm_event(_alarm(rt, JOB)), context)

    # Then the warning is posted and audited as if Scheduler were up
    assert (result["action"], result["posted"]) == ("warn", True)
    assert result["details"]["recheck"]["ok"] is False
    assert "will be stopped" in slack.texts()[0]
    assert audits(rt, JOB)[-1]["outcome"]["slack"]["ok"] is True


def test_a_stop_schedules_no_recheck(rt, world, slack, context, rechecks, monkeypatch) -> None:
    # Given a hung job warned 6 minutes ago, whose every decision asks for a recheck 5 minutes later
    seed_nccl_hang(world, JOB, ENFORCE)
    _every_decision_asks_for_a_recheck(monkeypatch, after=5 * MINUTE)
    on_alarm.handler(alarm_event(_alarm(rt, JOB)), context)
    [warning_recheck] = _schedules(rt)
    rt.clock.advance(6 * MINUTE)
    calls = _calls(rt)

    # When the sweeper stops it
    (outcome,) = sweeper.handler(scheduled_event(), context)["redecided"]

    # Then no recheck is scheduled for a job that is stopping (the warning's stays as it was)
    assert (outcome["action"], outcome["stopped"]) == ("stop", True)
    assert calls["CreateSchedule"] + calls["UpdateSchedule"] == 0
    assert _schedules(rt) == [warning_recheck]


def test_two_decisions_from_one_read_schedule_once(rt, world, context, rechecks) -> None:
    # Given a lone signal, and two invocations that read its state at the same version
    _lone_signal(world)
    key = job_key("sagemaker", JOB)
    read = rt.states.load(key)
    signals = rt.source(Platform.SAGEMAKER).job_signals(JOB, rt.clock())
    calls = _calls(rt)

    # When both decide
    first = decide.decide_and_act(signals, rt, trigger="sweeper", read=read)
    second = decide.decide_and_act(signals, rt, trigger="sweeper", read=read)

    # Then only the winner of the commit schedules the recheck
    assert (first.status, second.status) == ("decided", "duplicate")
    assert calls["CreateSchedule"] == 1
    assert len(_schedules(rt)) == 1


def test_a_recheck_delivered_twice_decides_once(rt, world, slack, context, rechecks) -> None:
    # Given a lone signal decided early, and its recheck come due
    _lone_signal(world)
    early = on_alarm.handler(alarm_event(_alarm(rt, JOB)), context)
    rt.clock.now = early["details"]["recheck"]["fires_at"] + 5
    event = json.loads(_schedules(rt)[0]["Target"]["Input"])

    # When Scheduler (or Lambda's retry) delivers it twice
    results = [on_alarm.handler(event, context) for _ in range(2)]

    # Then one decision warns, the other is skipped
    assert [r["status"] for r in results] == ["decided", "skipped"]
    assert len(slack.posts) == 1


def test_a_recheck_of_a_job_that_is_gone_writes_nothing(rt, world, context) -> None:
    # Given no such training job
    # When its recheck arrives
    result = on_alarm.handler(_recheck("deleted-job", rt.clock() - 60), context)

    # Then it is not decided and leaves no state item behind
    assert result["status"] == "not_found"
    assert rt.clients.dynamodb.scan(TableName=rt.store.table)["Items"] == []


@pytest.mark.parametrize(
    ("event", "field"),
    [
        (_recheck("job.with.dots", 1.8e9), "job"),
        (_recheck("i-0123456789abcdef0", 1.8e9, platform="gcp"), "platform"),
        (_recheck("a" * 64, 1.8e9), "job"),
        (_recheck("ok-job", float("nan")), "at"),
        (_recheck("ok-job", -5.0), "at"),
        (_recheck("ok-job", 1e300), "at"),
        ({"source": "stallwatch.recheck", "platform": "sagemaker", "at": 1.8e9}, "job"),
        (_recheck("ok-job", 1.8e9) | {"source": "stallwatch.rechek"}, "alarmArn"),  # not a recheck: an alarm?
    ],
)
def test_a_malformed_recheck_is_refused_with_a_clear_error_and_changes_nothing(
    rt, world, slack, context, rechecks, event, field
) -> None:
    # Given a hung enforced job that would be acted on
    seed_nccl_hang(world, "ok-job", ENFORCE)

    # When a malformed recheck arrives, Then the error names the field (the invocation fails, the DLQ keeps it)
    with pytest.raises(InvalidEventError, match=field):
        on_alarm.handler(event, context)

    # And nothing was decided, posted, scheduled or written
    assert slack.posts == []
    assert _schedules(rt) == []
    assert rt.clients.dynamodb.scan(TableName=rt.store.table)["Items"] == []


def test_without_the_recheck_environment_nothing_is_scheduled(rt, world, context, monkeypatch) -> None:
    # Given functions deployed without a schedule group (the replay, a deployment from before rechecks)
    assert environment.Runtime.from_env().rechecks is None
    assert rt.rechecks is None
    _lone_signal(world)

    # When a decision asks for a recheck, Then it is decided as before, with nothing asked of Scheduler
    calls = _calls(rt)
    early = on_alarm.handler(alarm_event(_alarm(rt, JOB)), context)
    assert (early["status"], early["action"]) == ("decided", "none")
    assert "recheck" not in early.get("details", {})
    assert calls["CreateSchedule"] == 0


def test_on_alarm_targets_itself_where_its_environment_cannot_name_it(rt, monkeypatch, context) -> None:
    # Given on_alarm's environment: the group and the role, and no ALARM_ACTION_ARN (it cannot name itself)
    monkeypatch.setenv("RECHECK_SCHEDULE_GROUP", RECHECK_GROUP)
    monkeypatch.setenv("RECHECK_ROLE_ARN", RECHECK_ROLE_ARN)
    monkeypatch.delenv("ALARM_ACTION_ARN")
    runtime = environment.Runtime.from_env()
    assert runtime.rechecks is not None
    assert runtime.rechecks.target.function_arn == ""

    # When it is invoked, Then its rechecks invoke the function itself; a target the environment names is kept
    assert runtime.invoked_as(context.invoked_function_arn).rechecks.target.function_arn == context.invoked_function_arn
    assert runtime.invoked_as("arn:aws:lambda:us-east-1:123456789012:function:other").rechecks.target.function_arn == (
        context.invoked_function_arn
    )
    assert runtime.rechecks.target.group == RECHECK_GROUP
