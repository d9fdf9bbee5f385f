"""End to end on moto: an alarm burst is decided once; the sweeper reads only what changed (alarms in ALARM, alarm
markers), decides before it provisions, and puts missing alarms in bounded batches across sweeps."""

from __future__ import annotations

from collections import Counter

import pytest

from handlers import on_alarm, on_job_state, sweeper
from localrun import moto_sagemaker
from localrun.moto_world import MINUTE, alarm_event, job_state_event, scheduled_event
from stallwatch.aws.store import job_key
from stallwatch.core import alarms
from stallwatch.core.signals import Platform
from stallwatch.runtime import decide, provision, sweep
from tests.runtime.test_e2e_stalls import ENFORCE, _alarm, seed_nccl_hang

JOB = "gemma-27b-pretrain"


def _calls(client) -> Counter[str]:
    calls: Counter[str] = Counter()
    client.meta.events.register("before-call", lambda model, **_: calls.update([model.name]))
    return calls


def _alarm_count(rt) -> int:
    pages = rt.clients.cloudwatch.get_paginator("describe_alarms").paginate()
    return sum(len(page["MetricAlarms"]) for page in pages)


def test_an_alarm_burst_on_one_job_is_decided_once(rt, world, slack, context) -> None:
    # Given a hung 2-host job whose progress alarm and every host alarm fire within a minute
    seed_nccl_hang(world, JOB, ENFORCE)
    names = [_alarm(rt, JOB)] + [_alarm(rt, JOB, alarms.GPU_IDLE, f"algo-{i}") for i in (1, 2)]
    describes = _calls(rt.clients.sagemaker)

    # When on_alarm gets them one after another
    statuses = []
    for name in names:
        statuses.append(on_alarm.handler(alarm_event(name), context)["status"])
        rt.clock.advance(20)

    # Then the first decides (one read of the job's signals, one warning); the others are coalesced into it
    assert statuses == ["decided", "coalesced", "coalesced"]
    assert describes["DescribeTrainingJob"] == 1
    assert len(slack.posts) == 1

    # And an alarm after the claim has run out is decided again
    rt.clock.advance(decide.COALESCE_SECONDS)
    later = alarm_event(_alarm(rt, JOB, alarms.LOG_IDLE, "algo-1"), "2026-11-30T10:05:00.000+0000")
    assert on_alarm.handler(later, context)["status"] == "decided"


@pytest.mark.slow
def test_the_sweeper_trusts_the_alarm_markers(rt, world, context) -> None:
    # Given a running job whose alarms on_job_state put
    world.create_job(JOB, hosts=2, tags=ENFORCE)
    on_job_state.handler(job_state_event(JOB, "InProgress", hosts=2, tags=ENFORCE), context)
    cloudwatch = _calls(rt.clients.cloudwatch)
    requests = []
    rt.clients.cloudwatch.meta.events.register(
        "provide-client-params.cloudwatch.DescribeAlarms", lambda params, **_: requests.append(params)
    )

    # When the sweeper runs
    summary = sweeper.handler(scheduled_event(), context)

    # Then it listed the alarms once (one page, for the clean-up of ended jobs), put no alarm, and left nothing to
    # provision
    assert cloudwatch["DescribeAlarms"] == 1
    assert requests[0]["MaxRecords"] == 100
    assert cloudwatch["PutMetricAlarm"] == 0
    assert (summary["alarms_provisioned"], summary["left_to_provision"]) == (0, 0)


def test_every_alarm_is_listed_once_an_hour_the_other_sweeps_read_only_alarms_in_alarm(rt, world, context):
    # Given a running job with its alarms, and one that stopped while its end event was lost
    world.create_job(JOB, hosts=2, tags=ENFORCE)
    world.create_job("ended-job", hosts=1)
    for job, hosts in ((JOB, 2), ("ended-job", 1)):
        on_job_state.handler(job_state_event(job, "InProgress", hosts=hosts), context)
    moto_sagemaker.set_training_job_status("ended-job", "Stopped", "Stopped")
    requests = []
    rt.clients.cloudwatch.meta.events.register(
        "provide-client-params.cloudwatch.DescribeAlarms", lambda params, **_: requests.append(dict(params))
    )

    # When the sweeper runs three times: now, 5 minutes later, and once the hour has passed
    first = sweeper.handler(scheduled_event(), context)
    rt.clock.advance(5 * MINUTE)
    moto_sagemaker.set_training_job_status(JOB, "Stopped", "Stopped")  # a second end event lost
    second = sweeper.handler(scheduled_event(), context)
    rt.clock.advance(sweep.ALARM_AUDIT_SECONDS)
    third = sweeper.handler(scheduled_event(), context)

    # Then the first and the third list every alarm and delete the ended jobs'; the one between reads only the
    # alarms in ALARM and leaves the lost end to the next hourly listing
    listings = [r for r in requests if r["AlarmNamePrefix"] == rt.config.alarm_prefix]  # not one job's alarms
    assert [r.get("StateValue") for r in listings] == [None, "ALARM", None]
    assert [s["orphan_alarms_deleted"] for s in (first, second, third)] == [6, 0, 9]
    assert _alarm_count(rt) == 0


def test_a_cold_sweep_decides_first_and_provisions_in_batches_over_sweeps(rt, world, slack, context, monkeypatch):
    # Given a new deployment: a hung job past its warning and two healthy 2-host jobs, none with alarms, and room
    # for 10 alarms a sweep (9 per job)
    monkeypatch.setattr(sweep, "PROVISION_ALARMS_PER_SWEEP", 10)
    seed_nccl_hang(world, JOB, ENFORCE)
    on_alarm.handler(alarm_event(_alarm(rt, JOB)), context)  # the warning (on_alarm puts no alarms)
    rt.clock.advance(6 * MINUTE)
    for job in ("ok-1", "ok-2"):
        world.create_job(job, hosts=2)
        world.progress_logs(job, "algo-1", until_min=1)
    order: list[str] = []
    for client in (rt.clients.cloudwatch, rt.clients.sagemaker):
        client.meta.events.register("before-call", lambda model, **_: order.append(model.name))

    # When the sweeper runs, then again each 5 minutes until nothing is left to provision
    first = sweeper.handler(scheduled_event(), context)
    puts = [order.count("PutMetricAlarm")]
    while True:
        rt.clock.advance(5 * MINUTE)
        order.clear()
        summary = sweeper.handler(scheduled_event(), context)
        puts.append(order.count("PutMetricAlarm"))
        if summary["left_to_provision"] == 0:
            break

    # Then the hung job was stopped before any alarm was put (and gets none), each sweep put at most 10 alarms,
    # and the healthy jobs have all of theirs in the end
    (outcome,) = first["redecided"]
    assert (outcome["action"], outcome["stopped"]) == ("stop", True)
    assert max(puts) <= 10
    assert puts[0] == 10
    assert _alarm_count(rt) == 18
    markers = rt.alarm_markers.provisioned([job_key(Platform.SAGEMAKER, j) for j in ("ok-1", "ok-2", JOB)])
    assert all(markers[job_key(Platform.SAGEMAKER, j)].complete for j in ("ok-1", "ok-2"))
    assert job_key(Platform.SAGEMAKER, JOB) not in markers


def test_a_job_too_big_for_one_invocation_gets_the_rest_of_its_alarms_from_the_sweeper(rt, world, context, monkeypatch):
    # Given on_job_state may put 5 alarms, and a 4-host job (15 alarms) starts
    monkeypatch.setattr(provision, "ALARMS_PER_INVOCATION", 5)
    monkeypatch.setattr(sweep, "PROVISION_ALARMS_PER_SWEEP", 6)
    world.create_job(JOB, hosts=4)
    world.progress_logs(JOB, "algo-1", until_min=1)

    # When it starts, and the sweeper runs twice
    started = on_job_state.handler(job_state_event(JOB, "InProgress", hosts=4), context)
    after_start = _alarm_count(rt)
    sweeps = [sweeper.handler(scheduled_event(), context) for _ in range(2)]

    # Then on_job_state put 5 and left 10, the sweeps put 6 then the last 4
    assert (started["alarms"], started["alarms_left"], after_start) == (5, 10, 5)
    assert [s["left_to_provision"] for s in sweeps] == [1, 0]
    assert _alarm_count(rt) == 15


def test_a_failed_log_query_costs_the_log_idleness_not_the_sweep(rt, world, slack, context, monkeypatch, caplog):
    # Given a hung job past its warning, and Logs Insights failing every query
    seed_nccl_hang(world, JOB, ENFORCE)
    on_alarm.handler(alarm_event(_alarm(rt, JOB)), context)
    rt.clock.advance(6 * MINUTE)
    monkeypatch.setattr(rt.clients.logs, "get_query_results", lambda **_: {"status": "Failed", "results": []})

    # When the sweeper runs
    summary = sweeper.handler(scheduled_event(), context)

    # Then nothing is published, the failure is logged, and the job is still decided (and stopped)
    assert summary["log_idle_published"] == 0
    assert any("log freshness query failed" in r.getMessage() for r in caplog.records)
    (outcome,) = summary["redecided"]
    assert (outcome["action"], outcome["stopped"]) == ("stop", True)
