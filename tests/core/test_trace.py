"""Trace format v1: parsing, writing, errors that name the line and field, and the trace signal source."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from stallwatch.core import contract
from stallwatch.core.reading import HOST_SERIES_READ, host_period
from stallwatch.core.signals import Platform
from stallwatch.core.trace import (
    EndEvent,
    LogEvent,
    LogRecord,
    MetricDatum,
    MetricEvent,
    StatusEvent,
    Trace,
    TraceError,
    TraceHeader,
    TraceJob,
    parse_event,
    read_trace,
)
from stallwatch.offline.trace_file import load_trace, write_trace
from stallwatch.offline.trace_source import TRACE_EPOCH, TraceSource

JOB = "bert-large"
HEADER = {
    "stallwatch_trace": 1,
    "job": {
        "name": JOB,
        "platform": "sagemaker",
        "instance_type": "ml.p4d.24xlarge",
        "instance_count": 2,
        "gpus_per_host": 8,
        "vcpus_per_host": 96,
        "tags": {"stallwatch:mode": "enforce"},
    },
    "expect": {"action": "stop", "window_s": [600, 2400]},
}


def gpu(t: float, host: str, value: float) -> dict:
    dims = {"Host": f"{JOB}/{host}"}
    return {
        "t": t,
        "metric": {
            "namespace": "/aws/sagemaker/TrainingJobs",
            "name": "GPUUtilization",
            "dimensions": dims,
            "value": value,
        },
    }


def lines(*objects: dict) -> list[str]:
    return [json.dumps(o) for o in objects]


def test_a_trace_parses_into_header_and_typed_events() -> None:
    # Given a header, a status change, a metric, a log line and the end
    trace = read_trace(
        lines(
            HEADER,
            {"t": 0, "status": "InProgress", "secondary": "Downloading"},
            gpu(60, "algo-1", 780.0),
            {"t": 61.5, "log": {"stream": f"{JOB}/algo-1-1700000000", "message": "step 120 loss 2.31"}},
            {"t": 7200, "end": True},
        )
    )

    # Then each event has its type, and the label is read
    assert [type(e) for e in trace.events] == [StatusEvent, MetricEvent, LogEvent, EndEvent]
    assert trace.job.platform is Platform.SAGEMAKER
    assert trace.header.expect.window_s == (600, 2400)
    assert trace.duration_s == 7200


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"<trace>:2: not JSON"),
        (json.dumps({"t": 5}), r"<trace>:2: an event has exactly one of"),
        (json.dumps({"t": 5, "log": {"stream": "s"}}), r"<trace>:2: log event: field log.message: Field required"),
        (json.dumps({"t": -1, "end": True}), r"<trace>:2: end event: field t"),
        (json.dumps({"t": 1, "status": "InProgress", "log": {}}), r"exactly one of"),
    ],
)
def test_bad_event_lines_name_the_line_and_field(line: str, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        read_trace([json.dumps(HEADER), line])


def test_events_out_of_order_are_rejected() -> None:
    with pytest.raises(TraceError, match=r":3: field t: 10.0 is before the previous event's 20.0"):
        read_trace(lines(HEADER, gpu(20, "algo-1", 1.0), gpu(10, "algo-1", 1.0)))


def test_a_bad_header_names_the_field() -> None:
    header = {**HEADER, "job": {**HEADER["job"], "platform": "gke"}}
    with pytest.raises(TraceError, match=r"<trace>:1: header: field job.platform"):
        read_trace(lines(header))


def test_an_ec2_header_needs_one_instance_id_per_host() -> None:
    header = {**HEADER, "job": {**HEADER["job"], "platform": "ec2", "instance_ids": ["i-1"]}}
    with pytest.raises(TraceError, match="one instance id per host"):
        read_trace(lines(header))


def test_a_stop_label_needs_a_window() -> None:
    with pytest.raises(TraceError, match="field expect: Value error, action 'stop' needs window_s"):
        read_trace(lines({**HEADER, "expect": {"action": "stop"}}))


def test_a_label_bounds_alerts_and_warnings_and_a_healthy_one_allows_none() -> None:
    with pytest.raises(TraceError, match=r"field expect\.warnings: Input should be greater than or equal to 0"):
        read_trace(lines({**HEADER, "expect": {"action": "none", "warnings": -1}}))
    healthy = read_trace(lines({**HEADER, "expect": {"action": "none", "alerts": 2}})).header.expect
    assert (healthy.allowed("alerts"), healthy.allowed("warnings")) == (2, 0)
    stall = read_trace(lines(HEADER)).header.expect
    assert (stall.allowed("alerts"), stall.allowed("warnings")) == (None, None)


def test_trace_source_reads_back_the_log_idle_seconds_the_replay_publishes() -> None:
    # Given the sweeper published algo-2's LogIdleSeconds at 5 and 10 minutes
    source = two_host_trace()
    source.publish_log_idle("algo-2", TRACE_EPOCH + 600, 0.0)
    source.publish_log_idle("algo-2", TRACE_EPOCH + 300, 300.0)

    # Then the host's history holds them in time order (in 1-minute periods, as GetMetricData returns), not the future
    assert source.job_signals(JOB, TRACE_EPOCH + 900).hosts["algo-2"].log_idle.values() == [300.0, 0.0]
    assert len(source.job_signals(JOB, TRACE_EPOCH + 500).hosts["algo-2"].log_idle) == 1


def test_write_then_load_round_trips(tmp_path: Path) -> None:
    # Given a header and events written out of order
    header = TraceHeader.model_validate(HEADER)
    datum = MetricDatum(namespace="Stallwatch", name="Steps", dimensions={"JobName": JOB}, value=3.0)
    events = [
        EndEvent(t=120.0, end=True),
        MetricEvent(t=60.0, metric=datum),
        LogEvent(t=30.0, log=LogRecord(stream=f"{JOB}/algo-1-1", message="hello")),
    ]
    path = tmp_path / "t.jsonl"

    # When written and loaded back
    write_trace(header, events, path)
    trace = load_trace(path)

    # Then the events come back sorted and equal, and the file is one JSON object per line
    assert [e.t for e in trace.events] == [30.0, 60.0, 120.0]
    assert trace.events[1] == events[1]
    assert trace.header == header
    assert all(json.loads(line) for line in path.read_text().splitlines())


def two_host_trace() -> TraceSource:
    job = TraceJob.model_validate(HEADER["job"])
    header = TraceHeader(stallwatch_trace=1, job=job)
    buffer = io.StringIO()
    steps = {"JobName": JOB}
    events = [
        StatusEvent(t=0, status="InProgress", secondary="Downloading"),
        StatusEvent(t=300, status="InProgress", secondary="Training"),
        *(MetricEvent.model_validate(gpu(t, "algo-1", 776.0)) for t in (600.0, 610.0)),
        MetricEvent.model_validate(gpu(620.0, "algo-2", 8.0)),
        MetricEvent(t=605, metric=MetricDatum(namespace="Stallwatch", name="Steps", dimensions=steps, value=4)),
        MetricEvent(t=615, metric=MetricDatum(namespace="Stallwatch", name="Steps", dimensions=steps, value=5)),
        LogEvent(t=630, log=LogRecord(stream=f"{JOB}/algo-2-1700000000", message="step 9 loss 2.1")),
        LogEvent(
            t=640,
            log=LogRecord(
                stream=f"{JOB}/algo-2-1700000000",
                message="RuntimeError: CUDA error: an illegal memory access was encountered",
            ),
        ),
        LogEvent(t=650, log=LogRecord(stream="someone-else/algo-1-1", message="not ours")),
    ]
    write_trace(header, events, buffer)
    return TraceSource(read_trace(buffer.getvalue().splitlines()))


def test_trace_source_normalizes_per_device_and_aggregates_like_get_metric_data() -> None:
    # Given a 2-host p4d trace
    source = two_host_trace()

    # When the job is looked at 15 minutes in
    signals = source.job_signals(JOB, TRACE_EPOCH + 900)

    # Then utilization is per device, agent Steps are summed per minute, and the period start stamps them
    host1 = signals.hosts["algo-1"]
    assert host1.gpu_util.values() == [97.0]  # 776 / 8, both datapoints in one minute averaged
    assert signals.hosts["algo-2"].gpu_util.values() == [1.0]
    assert signals.agent["Steps"].values() == [9.0]
    assert signals.agent["Steps"].points[0][0] % 60 == 0
    assert signals.has_agent


def test_trace_source_reads_logs_per_host_with_fatal_patterns() -> None:
    source = two_host_trace()
    signals = source.job_signals(JOB, TRACE_EPOCH + 900)
    host2 = signals.hosts["algo-2"]
    assert host2.log_last_t == TRACE_EPOCH + 640
    assert [line.pattern for line in host2.error_lines] == ["illegal_memory_access"]
    assert signals.hosts["algo-1"].log_last_t is None  # the other job's stream is not algo-1's


def test_trace_source_shows_only_the_past() -> None:
    # Given the same trace, looked at before training began
    source = two_host_trace()
    signals = source.job_signals(JOB, TRACE_EPOCH + 200)

    # Then the status is Downloading and no metric or log is visible yet
    assert signals.facts.secondary_status == "Downloading"
    assert signals.facts.status_history == ((TRACE_EPOCH, "Downloading"),)
    assert not signals.has_agent
    assert signals.hosts["algo-2"].log_last_t is None


def test_trace_source_refuses_another_job() -> None:
    with pytest.raises(KeyError, match="not 'other'"):
        two_host_trace().job_signals("other", TRACE_EPOCH)


def test_ec2_trace_source_reads_the_cloudwatch_agent_and_ignores_logs() -> None:
    # Given an EC2 instance's trace with the CloudWatch agent's per-instance metrics and a log line
    job = {**HEADER["job"], "name": "i-0abc", "platform": "ec2", "instance_count": 1, "instance_ids": ["i-0abc"]}
    dims = {"InstanceId": "i-0abc"}

    def cwagent(name: str, value: float) -> dict:
        return {"t": 60, "metric": {"namespace": "CWAgent", "name": name, "dimensions": dims, "value": value}}

    trace = read_trace(
        lines(
            {"stallwatch_trace": 1, "job": job},
            cwagent("nvidia_smi_utilization_gpu", 97.0),
            cwagent("nvidia_smi_memory_used", 30720.0),
            cwagent("nvidia_smi_memory_total", 40960.0),
            {"t": 61, "log": {"stream": "i-0abc/train.log", "message": "step 5"}},
        )
    )

    # When looked at after that minute
    signals = TraceSource(trace).job_signals("i-0abc", TRACE_EPOCH + 300)

    # Then utilization is as published, memory is used/total, and the log is not read (as in AWS)
    host = signals.hosts["i-0abc"]
    assert host.gpu_util.values() == [97.0]
    assert host.gpu_mem_util.values() == [75.0]
    assert host.log_last_t is None


@pytest.mark.parametrize(
    "raw",
    [
        {"t": 5, "metric": {"namespace": "Stallwatch", "name": "Steps", "dimensions": {"JobName": "j"}, "value": 3}},
        {"t": 5.5, "log": {"stream": "j/algo-1-1700000000", "message": "step 1"}},
        {"t": 5.5, "metric": {"namespace": "n", "name": "m", "dimensions": {}, "value": "2.5"}},
        {"t": 1, "metric": {"namespace": "n", "name": "m", "dimensions": {"a": "b"}, "value": True}},
    ],
)
def test_plain_events_parse_as_the_models_validate_them(raw: dict) -> None:
    # Given an event line, in the plain shape or one the models coerce
    # When it is parsed
    event = parse_event(raw, "t.jsonl:2")

    # Then it equals the validated model, field for field and type for type
    expected = type(event).model_validate(raw)
    assert event == expected
    assert event.model_dump() == expected.model_dump()
    assert type(event.t) is float


@pytest.mark.parametrize(("hosts", "period"), [(1, 60), (64, 60), (109, 60), (110, 120), (392, 240), (512, 300)])
def test_a_job_of_very_many_hosts_reads_its_host_series_at_a_coarser_period(hosts: int, period: int) -> None:
    # Given a job of `hosts` hosts read at 60 s
    # When the period of its per-host series is chosen
    chosen = host_period(hosts, 60)

    # Then it is the job's own until one GetMetricData answer (100,800 datapoints) could not hold them all
    assert chosen == period
    series = len(contract.JOB_METRICS) * 180 + hosts * HOST_SERIES_READ * (3 * 3600 // chosen)
    assert series <= 100_800
    assert (
        chosen == 60
        or len(contract.JOB_METRICS) * 180 + hosts * HOST_SERIES_READ * (3 * 3600 // (chosen - 60)) > 100_800
    )


def test_the_trace_source_reads_a_big_jobs_hosts_at_the_coarser_period_too() -> None:
    # Given a 512-host trace with one host's GPU utilization every minute for 20 minutes
    job = TraceJob.model_validate(HEADER["job"] | {"instance_count": 512})
    dims = {"Host": f"{JOB}/algo-7"}
    events = [
        MetricEvent(
            t=60.0 * m,
            metric=MetricDatum(
                namespace="/aws/sagemaker/TrainingJobs", name="GPUUtilization", dimensions=dims, value=800.0
            ),
        )
        for m in range(20)
    ]
    source = TraceSource(Trace(TraceHeader(stallwatch_trace=1, job=job), tuple(events)))

    # When it is looked at, 20 minutes in
    host = source.job_signals(JOB, TRACE_EPOCH + 1200).hosts["algo-7"]

    # Then the host's datapoints are 300 s periods (stamped at their start), as the AWS source reads them
    assert all(t % 300 == 0 for t, _ in host.gpu_util.points)
    assert len(host.gpu_util) == 4
    assert host.gpu_util.values() == [100.0] * 4
