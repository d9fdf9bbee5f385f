"""Reads that do not grow with hosts: SEARCH per host metric, the Logs Insights last-event query, the bounded log
tail, the claim that coalesces an alarm burst, and the alarm markers (on moto, with the localrun extensions)."""

from __future__ import annotations

from datetime import UTC, datetime

import boto3
import pytest
from botocore.stub import Stubber

from localrun.moto_world import MINUTE, World
from stallwatch.aws import log_reads, metric_reads, source
from stallwatch.aws.job_states import StoredState
from stallwatch.aws.metric_reads import SearchRef, read_metrics
from stallwatch.aws.platforms import adapter
from stallwatch.aws.platforms.sagemaker import STREAMS
from stallwatch.aws.store import job_key
from stallwatch.core import contract
from stallwatch.core.decision import JobState
from stallwatch.core.platforms.sagemaker import stream_host
from stallwatch.core.signals import JobFacts, Platform


def _power(world: World, job: str, host: str, watts: float) -> None:
    world.agent_host(job, host, "GPUPowerWatts", world.every_minute(30, watts))


def test_a_search_reads_one_metric_of_every_host_of_a_job_and_no_other_jobs(rt, world: World) -> None:
    # Given power readings of three hosts of one job, and of a job whose name starts with the first's
    for host, watts in (("algo-1", 100.0), ("algo-2", 200.0), ("algo-3", 300.0)):
        _power(world, "llama", host, watts)
    _power(world, "llama-v2", "algo-1", 999.0)

    # When one SEARCH over the first job's hosts is read
    job = ((contract.DIM_JOB, "llama"),)
    search = SearchRef(contract.NAMESPACE, "GPUPowerWatts", source.AGENT_DIMENSIONS, job, "Average", source.AGENT_LABEL)
    calls = []
    rt.clients.cloudwatch.meta.events.register("before-call", lambda model, **_: calls.append(model.name))
    found = read_metrics(rt.clients.cloudwatch, [search], world.now - 3600, world.now)[search]

    # Then one call returns each host's series, labelled by job and host; the other job's is not among them
    assert calls == ["GetMetricData"]
    assert sorted(found) == ["llama algo-1", "llama algo-2", "llama algo-3"]
    assert {label: series.latest() for label, series in found.items()}["llama algo-3"] == 300.0


def test_signals_of_a_job_cost_one_metric_call_whatever_its_hosts(rt, world: World) -> None:
    # Given a 40-host job with SageMaker GPU metrics and the agent's power on every host
    world.create_job("wide", hosts=40)
    for i in range(1, 41):
        world.host_gpu("wide", f"algo-{i}", world.every_minute(30, 90.0))
        _power(world, "wide", f"algo-{i}", 300.0 + i)
    calls = []
    rt.clients.cloudwatch.meta.events.register("before-call", lambda model, **_: calls.append(model.name))

    # When its signals are read
    signals = adapter(Platform.SAGEMAKER, rt.clients).job_signals("wide", world.now)

    # Then one GetMetricData call gave every host its per-device utilization and its own power
    assert calls.count("GetMetricData") == 1
    assert signals.hosts["algo-17"].gpu_util.latest() == pytest.approx(90.0)
    assert signals.hosts["algo-17"].agent["GPUPowerWatts"].latest() == 317.0
    assert signals.hosts["algo-40"].agent["GPUPowerWatts"].latest() == 340.0


def test_a_heterogeneous_jobs_search_is_divided_by_each_hosts_own_devices(rt, world: World) -> None:
    # Given a job of a p4d host (8 GPUs) 70% busy per GPU and a g5.12xlarge host (4 GPUs) 40% busy per GPU
    groups = [
        {"InstanceGroupName": "train", "InstanceType": "ml.p4d.24xlarge", "InstanceCount": 1},
        {"InstanceGroupName": "embed", "InstanceType": "ml.g5.12xlarge", "InstanceCount": 1},
    ]
    world.create_job("mixed", groups=groups)
    world.host_gpu("mixed", "algo-1", world.every_minute(30, 70.0), gpus=8)
    world.host_gpu("mixed", "algo-2", world.every_minute(30, 40.0), gpus=4)
    calls = []
    rt.clients.cloudwatch.meta.events.register("before-call", lambda model, **_: calls.append(model.name))

    # When its signals are read
    signals = adapter(Platform.SAGEMAKER, rt.clients).job_signals("mixed", world.now)

    # Then one call (a SEARCH per metric) gave each host its utilization per device of its own type
    assert calls.count("GetMetricData") == 1
    assert signals.hosts["algo-1"].gpu_util.latest() == pytest.approx(70.0)
    assert signals.hosts["algo-2"].gpu_util.latest() == pytest.approx(40.0)


@pytest.mark.parametrize(("named_in_the_search", "calls"), [(24, 1), (0, 2)])
def test_hosts_beyond_what_one_search_returns_are_read_by_name(
    rt, world: World, monkeypatch, named_in_the_search: int, calls: int
) -> None:
    # Given a 3-host job, SEARCH returning 2 series at most (CloudWatch: 500), and room to name the extra hosts in
    # the SEARCH (left out of it, read by name alongside) or none (they are read by name afterwards)
    monkeypatch.setattr(source, "MAX_SERIES_PER_SEARCH", 2)
    monkeypatch.setattr(source, "MAX_EXCLUDED_PER_SEARCH", named_in_the_search)
    monkeypatch.setattr("localrun.moto_metric_search.MAX_SERIES_PER_SEARCH", 2)
    world.create_job("big", hosts=3)
    for i in (1, 2, 3):
        _power(world, "big", f"algo-{i}", 100.0 * i)
    made = []
    rt.clients.cloudwatch.meta.events.register("before-call", lambda model, **_: made.append(model.name))

    # When its signals are read
    signals = adapter(Platform.SAGEMAKER, rt.clients).job_signals("big", world.now)

    # Then every host has its own series, the third read by name, in one call or two
    assert [signals.hosts[f"algo-{i}"].agent["GPUPowerWatts"].latest() for i in (1, 2, 3)] == [100.0, 200.0, 300.0]
    assert made.count("GetMetricData") == calls


def test_one_logs_insights_query_gives_every_hosts_newest_line(rt, world: World) -> None:
    # Given two jobs' hosts, one line 2 minutes ago and one 30 minutes ago, and a stream that is not a host's
    world.logs("a", "algo-1", [(30, "old"), (2, "new")])
    world.logs("b", "algo-2", [(30, "only line")])
    rt.clients.logs.create_log_stream(logGroupName=contract.SAGEMAKER_LOG_GROUP, logStreamName="other")

    # When the sweeper's query runs
    newest = log_reads.newest_events(
        rt.clients.logs, contract.SAGEMAKER_LOG_GROUP, stream_host, world.now - 3600, world.now + 1, lambda s: None
    )

    # Then each host's newest event time comes back, to the millisecond
    assert newest == {
        ("a", "algo-1"): pytest.approx(world.now - 2 * MINUTE, abs=0.001),
        ("b", "algo-2"): pytest.approx(world.now - 30 * MINUTE, abs=0.001),
    }


def test_a_query_still_running_is_polled_and_a_failed_one_is_an_error() -> None:
    # Given a Logs client whose query runs twice, then completes; and one whose query fails
    class Logs:
        class exceptions:
            ResourceNotFoundException = KeyError

        def __init__(self, statuses: list[str]) -> None:
            self.statuses = statuses

        def start_query(self, **_: object) -> dict:
            return {"queryId": "q"}

        def get_query_results(self, queryId: str) -> dict:
            return {"status": self.statuses.pop(0), "results": []}

    waits: list[float] = []

    # When each is run
    assert (
        log_reads.newest_events(Logs(["Running", "Scheduled", "Complete"]), "g", stream_host, 0, 1, waits.append) == {}
    )

    # Then the running one was polled with growing waits, and the failed one raised
    assert waits == [1.0, 2.0]
    with pytest.raises(log_reads.LogQueryError, match="Failed"):
        log_reads.newest_events(Logs(["Failed"]), "g", stream_host, 0, 1, waits.append)


def test_the_log_tail_is_fresh_on_a_busy_cluster_and_keeps_the_quiet_hosts_last_lines(rt, world: World) -> None:
    # Given 2 busy hosts logging every 10 s and a quiet host silent for 40 min (its freshness as the sweeper saw it)
    for host in ("algo-1", "algo-2"):
        world.logs("busy", host, [(m / 6, f"{host} step {m}") for m in range(300, -1, -1)])
    world.logs("busy", "algo-3", [(m, f"algo-3 step {m}") for m in range(60, 39, -1)])
    freshness = {"algo-3": world.now - 40 * MINUTE}
    calls = []
    rt.clients.logs.meta.events.register("before-call", lambda model, **_: calls.append(model.name))

    # When the tails are read
    tails = log_reads.read_tails(rt.clients.logs, STREAMS, "busy", ["algo-1", "algo-2", "algo-3"], freshness, world.now)

    # Then two calls give the busy hosts their newest lines and the quiet one the lines before its silence (each
    # window held on its page: no third read for the notable lines)
    assert calls == ["FilterLogEvents", "FilterLogEvents"]
    assert tails["algo-1"].lines[-1].message == "algo-1 step 0"
    assert tails["algo-1"].last_t == pytest.approx(world.now, abs=0.001)
    assert tails["algo-3"].lines[-1].message == "algo-3 step 40"
    assert tails["algo-3"].last_t == pytest.approx(world.now - 40 * MINUTE, abs=0.001)


def test_a_quiet_hosts_last_lines_are_read_when_its_freshness_is_their_own_millisecond(rt) -> None:
    # Given a host silent for 40 min whose last lines (a CUDA error among them) are at a millisecond whose float times
    # 1000 falls short of it, and that time as its freshness (its stream's lastEventTimestamp / 1000, as a sweep reads)
    start = round(rt.clock(), 3)
    ms = next(
        int((now - 40 * MINUTE) * 1000)
        for now in (start + i / 1000 for i in range(1000))
        if int((int((now - 40 * MINUTE) * 1000) / 1000 + 0.001) * 1000) <= int((now - 40 * MINUTE) * 1000)
    )
    world = World(rt.clients, now=ms / 1000 + 40 * MINUTE)
    crash = "[rank 7] RuntimeError: CUDA error: an illegal memory access was encountered"
    world.logs("quiet", "algo-1", [(m, f"step {m}") for m in range(60, 39, -5)] + [(40, crash)])

    # When its tail is read
    tails = log_reads.read_tails(rt.clients.logs, STREAMS, "quiet", ["algo-1"], {"algo-1": ms / 1000}, world.now)

    # Then its last lines are there, the error with them
    assert [line.message for line in tails["algo-1"].lines][-2:] == ["step 40", crash]


def test_a_crashed_ranks_error_among_64_busy_hosts_is_read_before_any_sweep(rt, world: World) -> None:
    # Given 63 hosts writing a line a minute for 3 hours (more than a page of FilterLogEvents) and one that died 10
    # minutes ago with a CUDA error, and no sweep yet (no freshness known: the quiet window reaches to the lookback)
    hosts = [f"algo-{i}" for i in range(1, 65)]
    for host in hosts[:-1]:
        world.logs("big", host, [(m, f"{host} step {m}") for m in range(179, -1, -1)])
    crash = "[rank504]: RuntimeError: CUDA error: an illegal memory access was encountered"
    world.logs("big", hosts[-1], [(m, f"{hosts[-1]} step {m}") for m in range(179, 10, -1)] + [(10, crash)])
    calls = []
    rt.clients.logs.meta.events.register("before-call", lambda model, **_: calls.append(model.name))

    # When the tails are read
    tails = log_reads.read_tails(rt.clients.logs, STREAMS, "big", hosts, {}, world.now)

    # Then the dead host's error line is among its notable lines, in four FilterLogEvents calls whatever the noise
    # (the quiet window's page could not hold three hours of it: two more reads ask for the notable lines alone, the
    # fatal ones and the checkpoint markers, whose filter patterns do not fit one 1,024-character pattern)
    assert [line.message for line in tails[hosts[-1]].notable] == [crash]
    assert tails[hosts[-1]].notable[0].pattern == "illegal_memory_access"
    assert calls == ["FilterLogEvents"] * 4


def test_a_claim_reads_the_state_and_holds_off_a_second_reader_until_it_runs_out(rt) -> None:
    # Given a job decided once (its state at version 1)
    key = job_key(Platform.SAGEMAKER, "claimed")
    now = rt.clock()
    rt.states.commit(key, StoredState(), StoredState(JobState(warned_at=now)), {}, now)

    # When two invocations claim it, and a third after the hold
    first = rt.states.claim_decision(key, now, hold_seconds=120)
    second = rt.states.claim_decision(key, now + 1, hold_seconds=120)
    third = rt.states.claim_decision(key, now + 121, hold_seconds=120)

    # Then the first read the state, the second was held off, the third got it again
    assert first is not None
    assert first.version == 1
    assert first.state.warned_at == now
    assert second is None
    assert third is not None
    assert third.version == 1


def test_a_first_decision_commits_over_its_own_claim(rt) -> None:
    # Given a job never decided, claimed (the claim creates its item)
    key = job_key(Platform.SAGEMAKER, "new-job")
    now = rt.clock()
    read = rt.states.claim_decision(key, now, hold_seconds=120)
    assert read == StoredState()

    # When its first decision commits, keeping the claim for the burst
    rt.states.commit(key, read, StoredState(JobState(warned_at=now)), {}, now, hold_until=now + 120)

    # Then the state is written, and the claim still holds
    assert rt.states.load(key).state.warned_at == now
    assert rt.states.claim_decision(key, now + 60, hold_seconds=120) is None


def test_alarm_markers_say_how_many_alarms_are_in_place(rt) -> None:
    # Given a job with all its alarms, one with some, and one with none
    now = rt.clock()
    rt.alarm_markers.mark("job#sagemaker#all", 27, 27, now)
    rt.alarm_markers.mark("job#sagemaker#some", 120, 1539, now)

    # When the markers are read
    markers = rt.alarm_markers.provisioned(["job#sagemaker#all", "job#sagemaker#some", "job#sagemaker#none"])

    # Then the complete, the partial and the missing are told apart
    assert markers["job#sagemaker#all"].complete
    assert not markers["job#sagemaker#some"].complete
    assert "job#sagemaker#none" not in markers


def test_metric_reads_keep_every_page() -> None:
    # Given a CloudWatch client that answers a SEARCH in two pages (botocore's Stubber checks each request)
    cloudwatch = boto3.client("cloudwatch", region_name="us-east-1", aws_access_key_id="a", aws_secret_access_key="s")
    search = SearchRef("ns", "m", ("JobName", "Host"), (("JobName", "j"),), "Sum", "label")
    request = {
        "MetricDataQueries": [search.query("q0", 60)],
        "StartTime": datetime.fromtimestamp(0, UTC),
        "EndTime": datetime.fromtimestamp(600, UTC),
        "ScanBy": "TimestampAscending",
    }
    stubber = Stubber(cloudwatch)
    for page, extra_request, extra_answer in ((1, {}, {"NextToken": "t"}), (2, {"NextToken": "t"}, {})):
        result = {"Id": "q0", "Label": "j algo-1", "Timestamps": [datetime.fromtimestamp(60 * page, UTC)]}
        answer = {"MetricDataResults": [result | {"Values": [1.0]}], **extra_answer}
        stubber.add_response("get_metric_data", answer, request | extra_request)

    # When it is read
    with stubber:
        found = metric_reads.read_metrics(cloudwatch, [search], 0, 600)

    # Then both pages were asked for, one call each, and their points are in the one series, oldest first
    stubber.assert_no_pending_responses()
    assert found[search]["j algo-1"].points == ((60.0, 1.0), (120.0, 1.0))


def test_a_crashed_hosts_last_lines_are_read_even_when_busy_hosts_fill_the_page(rt, world: World, monkeypatch) -> None:
    # Given pages of 60 events, 4 hosts logging every 10 s, and a host that crashed 30 minutes ago with an error
    monkeypatch.setattr(log_reads, "PAGE_EVENTS", 60)
    for i in range(1, 5):
        world.logs("crash", f"algo-{i}", [(m / 6, f"algo-{i} step {m}") for m in range(360, -1, -1)])
    crash = [(m, f"algo-5 step {m}") for m in range(60, 30, -1)] + [
        (30, "RuntimeError: CUDA error: an illegal memory access was encountered")
    ]
    world.logs("crash", "algo-5", crash)
    hosts = [f"algo-{i}" for i in range(1, 6)]

    # When the tails are read, the crashed host's freshness known from the sweeper
    tails = log_reads.read_tails(
        rt.clients.logs, STREAMS, "crash", hosts, {"algo-5": world.now - 30 * MINUTE}, world.now
    )

    # Then the crashed host's error line is in its tail, and the busy hosts' newest lines too
    assert tails["algo-5"].lines[-1].pattern is not None
    assert tails["algo-1"].lines[-1].message == "algo-1 step 0"


def test_a_job_of_very_many_hosts_reads_them_at_a_coarser_period_in_one_answer(rt, world: World) -> None:
    # Given a 200-host job (its 13 + 5 x 200 series at 60 s would be 182,340 datapoints, more than one answer)
    world.create_job("huge", hosts=200)
    requests = []
    rt.clients.cloudwatch.meta.events.register(
        "provide-client-params.cloudwatch.GetMetricData", lambda params, **_: requests.append(params)
    )

    # When its signals are read
    adapter(Platform.SAGEMAKER, rt.clients).job_signals("huge", world.now)

    # Then the job's own series stay at 60 s and the hosts' SEARCHes are at 120 s, in one call
    (request,) = requests
    periods = {q["Id"]: q["MetricStat"]["Period"] for q in request["MetricDataQueries"] if "MetricStat" in q}
    searches = [q["Expression"] for q in request["MetricDataQueries"] if "Expression" in q]
    assert set(periods.values()) == {60}
    assert len(searches) == 5
    assert all(expression.endswith(", 120)") for expression in searches)


def _facts(job: str, platform: Platform, hosts: int) -> JobFacts:
    """A running job of `hosts` p5 hosts, as the platform would describe it (EC2: that many instance ids)."""
    ids = tuple(f"i-{n:017x}" for n in range(hosts)) if platform is Platform.EC2 else ()
    return JobFacts(job, platform, "InProgress", None, 0.0, "ml.p5.48xlarge", hosts, 8, 192, instance_ids=ids)


@pytest.mark.parametrize("hosts", [501, 512, 524, 600, 1000, 10_000])
@pytest.mark.parametrize("platform", [Platform.SAGEMAKER, Platform.EC2])
def test_every_search_of_a_63_character_job_fits_cloudwatchs_1024_characters(hosts: int, platform: Platform) -> None:
    # Given a job of the longest name any platform allows, and more hosts than one SEARCH returns
    job = "j" * 62 + "9"

    # When its reads are planned (no call: the plan is the job's facts alone)
    facts = _facts(job, platform, hosts)
    reads = adapter(platform, None)._reads(facts)  # type: ignore[arg-type]
    searches = [*reads.agent.values(), *reads.platform.values(), *filter(None, [reads.log_idle]), *reads.parts]

    # Then every SEARCH is within the limit at any period, and the hosts each leaves out are read by name alongside
    # (EC2: each search is sent as parts over the job's instances, which cover every one of them once)
    assert searches
    assert all(len(s.expression(metric_reads.LONGEST_PERIOD)) <= metric_reads.MAX_SEARCH_CHARS for s in searches)
    for search in searches:
        left_out = [host for _, (by, host) in reads.named.items() if by == search]
        assert len(left_out) == len(search.excluded)
    if platform is Platform.SAGEMAKER:  # its hosts are named "<job>/algo-N": fewer fit than the 24 a short name has
        assert all(0 < len(s.excluded) < source.MAX_EXCLUDED_PER_SEARCH for s in reads.platform.values())
    else:
        for search in reads.searches():
            parts = [part for part, by_name in reads.parts.items() if search in by_name.values()]
            covered = [host for part in parts for host in part.any_of]
            assert sorted(covered) == sorted(facts.instance_ids)
        if hosts <= 1000:  # one GetMetricData call
            assert sum(1 for q in reads.all() if isinstance(q, SearchRef)) <= metric_reads.MAX_SEARCHES_PER_CALL


@pytest.mark.parametrize("period", [2, 0, 90, -60])
def test_a_period_cloudwatch_refuses_is_never_asked_for(rt, period: int) -> None:
    ref = metric_reads.MetricRef(contract.NAMESPACE, "Steps", ((contract.DIM_JOB, "j"),), "Sum")
    with pytest.raises(ValueError, match="CloudWatch takes 1, 5, 10, 20, 30 or a multiple of 60"):
        read_metrics(rt.clients.cloudwatch, [ref], 0, 600, period)
