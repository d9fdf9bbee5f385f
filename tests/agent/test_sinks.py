"""Sinks: the EMF stdout line, JSONL, fan-out isolation, "auto", and CloudWatch (moto, failures, no boto3)."""

from __future__ import annotations

import gc
import io
import json
import logging
import re
import sys
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from tests.agent.conftest import MemorySink
from trainer_agent import CloudWatchSink, EmfStdoutSink, JsonlSink, NullSink, Window, metric_definitions
from trainer_agent.cloudwatch import MAX_ATTEMPTS
from trainer_agent.contract import DIM_HOST, DIM_JOB, HOST_METRICS, JOB_METRICS, NAMESPACE, SCOPE_HOST, SCOPE_JOB
from trainer_agent.log import logger
from trainer_agent.sinks import FanOutSink, SinkWorker, build_sinks

JOB_WINDOW = Window(
    SCOPE_JOB, 1_700_000_000.25, "llama-pretrain", "algo-1", 0, 10.0,
    {"Steps": 12.0, "Step": 1200.0, "LastStepAge": 0.5, "TFLOPsPerAccelerator": 181.5, "MFU": 58.2, "Loss": 2.0625,
     "StepTime": 0.82, "ETA": 3.5e5},
    phase="eval",
)  # fmt: skip
ID_REUSE_TRIES = 100_000
HOST_WINDOW = Window(
    SCOPE_HOST, 1_700_000_000.25, "llama-pretrain", "algo-1", 0, 10.0, {"Heartbeat": 1.0, "StepTime": 9.9}
)


def assert_valid_emf(document: dict) -> None:
    """The CloudWatch Embedded Metric Format specification's rules for one document."""
    metadata = document["_aws"]
    assert isinstance(metadata["Timestamp"], int)
    assert metadata["Timestamp"] > 0
    for directive in metadata["CloudWatchMetrics"]:
        assert isinstance(directive["Namespace"], str)
        assert 1 <= len(directive["Namespace"]) <= 1024
        for dimension_set in directive["Dimensions"]:
            assert len(dimension_set) <= 30
            for dimension in dimension_set:
                assert isinstance(document[dimension], str)
        assert len(directive["Metrics"]) <= 100
        for metric in directive["Metrics"]:
            assert set(metric) <= {"Name", "Unit", "StorageResolution"}
            assert isinstance(document[metric["Name"]], (int, float))
            assert metric.get("StorageResolution", 60) in (1, 60)


@pytest.mark.parametrize("window", [JOB_WINDOW, HOST_WINDOW])
def test_the_stdout_line_is_one_flushed_valid_emf_document(window):
    stream = io.StringIO()
    EmfStdoutSink(stream).emit(window)
    (line,) = stream.getvalue().splitlines()
    document = json.loads(line)
    assert_valid_emf(document)
    (directive,) = document["_aws"]["CloudWatchMetrics"]
    units = JOB_METRICS if window.scope == SCOPE_JOB else HOST_METRICS
    assert directive["Namespace"] == NAMESPACE
    assert directive["Dimensions"] == ([[DIM_JOB]] if window.scope == SCOPE_JOB else [[DIM_JOB, DIM_HOST]])
    assert {metric["Name"]: metric["Unit"] for metric in directive["Metrics"]} == {
        name: units[name] for name in window.metrics
    }
    assert document["_aws"]["Timestamp"] == 1_700_000_000_250


def test_windows_under_a_minute_are_high_resolution():
    def resolution(interval_s):
        stream = io.StringIO()
        window = Window(SCOPE_JOB, 1.0, "j", "h", 0, interval_s, {"Steps": 1.0})
        EmfStdoutSink(stream).emit(window)
        return json.loads(stream.getvalue())["_aws"]["CloudWatchMetrics"][0]["Metrics"][0]["StorageResolution"]

    assert (resolution(10.0), resolution(60.0)) == (1, 60)


def test_the_stdout_sink_writes_to_the_current_stdout(capsys):
    EmfStdoutSink().emit(JOB_WINDOW)
    assert json.loads(capsys.readouterr().out)["JobName"] == "llama-pretrain"


def test_metric_definitions_read_every_job_metric_from_the_job_line_only():
    # Given the stdout lines of a job window and a host window, as SageMaker sees the log
    stream = io.StringIO()
    sink = EmfStdoutSink(stream)
    sink.emit(HOST_WINDOW)
    sink.emit(JOB_WINDOW)
    log = stream.getvalue()

    # When SageMaker applies each regex
    found = {}
    for definition in metric_definitions():
        matches = [m.group(1) for line in log.splitlines() if (m := re.search(definition["Regex"], line))]
        if matches:
            found[definition["Name"]] = float(matches[-1])

    # Then each job metric on the line is read with its value, and the host line's StepTime is not
    assert found == {f"stallwatch:{name}": value for name, value in JOB_WINDOW.metrics.items()}
    assert {d["Name"] for d in metric_definitions()} == {f"stallwatch:{name}" for name in JOB_METRICS}


def test_jsonl_sink_appends_one_object_per_window(tmp_path):
    path = tmp_path / "metrics" / "agent.jsonl"
    sink = JsonlSink(path)
    sink.emit(JOB_WINDOW)
    sink.emit(HOST_WINDOW)
    sink.close(1.0)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [record["scope"] for record in records] == ["job", "host"]
    assert {"t", "job", "host", "rank"} <= set(records[0])
    assert records[0]["MFU"] == 58.2


class Boom:
    def __init__(self):
        self.calls = 0

    def emit(self, window):
        self.calls += 1
        raise RuntimeError("boom")

    def close(self, timeout_s):
        raise RuntimeError("boom at close")


def test_fan_out_isolates_a_raising_sink():
    stream = io.StringIO()
    boom = Boom()
    fan_out = FanOutSink([boom, EmfStdoutSink(stream)])
    fan_out.emit(JOB_WINDOW)
    fan_out.emit(JOB_WINDOW)
    fan_out.close(1.0)
    assert boom.calls == 2
    assert len(stream.getvalue().splitlines()) == 2


def fail_once_through_a_worker(sink: Boom) -> None:
    """Hand `sink` one window on its own worker, and close the worker once the sink has raised."""
    worker = SinkWorker(sink)
    worker.put(JOB_WINDOW)
    worker.start_closing(time.monotonic() + 5.0)
    worker.join(time.monotonic() + 5.0)


class WarningLines(logging.Handler):
    """The agent's warnings, as text only (a record's arguments would keep the failed sink alive)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_a_failing_sink_is_logged_even_where_a_failed_sink_that_is_gone_had_its_id(monkeypatch):
    warnings = WarningLines()
    monkeypatch.setattr(logger, "handlers", [warnings])
    monkeypatch.setattr(logger, "propagate", False)  # pytest's own capture keeps records, and their arguments

    # Given a sink whose failure was logged, then dropped and collected
    first = Boom()
    fail_once_through_a_worker(first)
    address = id(first)
    del first
    gc.collect()

    # When another sink that Python placed at the same address (it reuses a freed object's id) fails
    held = [Boom() for _ in range(ID_REUSE_TRIES)]  # kept alive, so that each one takes a new place
    second = next((sink for sink in held if id(sink) == address), None)
    assert second is not None, f"no new object took the freed address in {ID_REUSE_TRIES} tries"
    fail_once_through_a_worker(second)

    # Then both failures were logged
    assert len([line for line in warnings.lines if "failed, its windows are dropped" in line]) == 2


class Gate:
    """A sink that holds its first window until released."""

    def __init__(self):
        self.entered = threading.Event()
        self.release = threading.Event()
        self.windows = []

    def emit(self, window):
        self.entered.set()
        self.release.wait(30.0)
        self.windows.append(window)

    def close(self, timeout_s):
        pass


def test_a_slow_sink_delays_no_other_sink():
    # Given a sink stuck on its first window next to a quick one
    gate, quick = Gate(), MemorySink()
    fan_out = FanOutSink([gate, quick])

    # When three windows go out
    for _ in range(3):
        fan_out.emit(JOB_WINDOW)
    assert gate.entered.wait(10.0)

    # Then the quick sink has all three while the slow one is still on its first, which then gets all three too
    deadline = time.monotonic() + 10.0
    while len(quick.windows) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (len(quick.windows), len(gate.windows)) == (3, 0)
    gate.release.set()
    fan_out.close(5.0)
    assert len(gate.windows) == 3


def test_a_sink_that_falls_behind_drops_its_newest_windows_only():
    gate = Gate()
    worker = SinkWorker(gate, max_windows=2)
    worker.put(JOB_WINDOW)
    assert gate.entered.wait(10.0)
    for _ in range(4):
        worker.put(JOB_WINDOW)
    assert worker.dropped == 2
    gate.release.set()
    worker.start_closing(time.monotonic() + 5.0)
    worker.join(time.monotonic() + 5.0)
    assert len(gate.windows) == 3


def test_fan_out_rejects_an_object_that_is_not_a_sink():
    with pytest.raises(TypeError, match="emit"):
        FanOutSink([object()])


def test_null_sink_accepts_windows():
    sink = NullSink()
    sink.emit(JOB_WINDOW)
    sink.close(0.0)


def test_auto_is_the_stdout_line_plus_cloudwatch_when_boto3_is_installed():
    kinds = [type(sink) for sink in build_sinks("auto").sinks]
    assert kinds == [EmfStdoutSink, CloudWatchSink]


def test_auto_without_boto3_is_the_stdout_line_only(monkeypatch):
    monkeypatch.setitem(sys.modules, "boto3", None)  # `import boto3` now raises ImportError
    assert [type(sink) for sink in build_sinks("auto").sinks] == [EmfStdoutSink]


def test_cloudwatch_sink_without_boto3_drops_windows_and_never_raises(monkeypatch):
    # Given boto3 cannot be imported
    monkeypatch.setitem(sys.modules, "boto3", None)
    sink = CloudWatchSink()

    # When windows are emitted and the sink closed
    sink.emit(JOB_WINDOW)
    sink.emit(HOST_WINDOW)
    sink.close(5.0)

    # Then nothing was sent and both windows are accounted as dropped
    assert (sink.sent, sink.dropped) == (0, 2)


@pytest.fixture
def cloudwatch():
    import boto3
    from moto import mock_aws

    with mock_aws():
        yield boto3.client("cloudwatch", region_name="us-east-1")


def test_cloudwatch_sink_publishes_the_contract_metrics(cloudwatch):
    # Given a window published through the sink's own thread
    sink = CloudWatchSink(region="us-east-1")
    now = datetime.now(UTC).timestamp()
    job = Window(SCOPE_JOB, now, "llama-pretrain", "algo-1", 0, 10.0, {"Steps": 0.0, "LastStepAge": 95.0})
    host = Window(SCOPE_HOST, now, "llama-pretrain", "algo-1", 0, 10.0, {"Heartbeat": 1.0})
    sink.emit(job)
    sink.emit(host)
    sink.close(10.0)

    # Then CloudWatch lists them under the contract's namespace and dimensions
    listed = cloudwatch.list_metrics(Namespace=NAMESPACE)["Metrics"]
    dims = {(m["MetricName"], tuple(sorted(d["Name"] for d in m["Dimensions"]))) for m in listed}
    assert dims == {("Steps", (DIM_JOB,)), ("LastStepAge", (DIM_JOB,)), ("Heartbeat", (DIM_HOST, DIM_JOB))}
    assert sink.sent == 3

    # And the values come back from GetMetricData
    result = cloudwatch.get_metric_data(
        MetricDataQueries=[
            {
                "Id": "age",
                "MetricStat": {
                    "Metric": {
                        "Namespace": NAMESPACE,
                        "MetricName": "LastStepAge",
                        "Dimensions": [{"Name": DIM_JOB, "Value": "llama-pretrain"}],
                    },
                    "Period": 60,
                    "Stat": "Maximum",
                },
            }
        ],
        StartTime=datetime.now(UTC) - timedelta(minutes=5),
        EndTime=datetime.now(UTC) + timedelta(minutes=5),
    )
    assert result["MetricDataResults"][0]["Values"] == [95.0]


def test_cloudwatch_datums_are_high_resolution_below_a_minute():
    datums = CloudWatchSink().datums(HOST_WINDOW)
    assert {d["StorageResolution"] for d in datums} == {1}
    assert datums[0]["Dimensions"] == [
        {"Name": DIM_JOB, "Value": "llama-pretrain"},
        {"Name": DIM_HOST, "Value": "algo-1"},
    ]
    assert {d["Unit"] for d in datums} == {"Count", "Seconds"}


class ThrottledClient:
    """PutMetricData that is throttled `failures` times, then accepts."""

    def __init__(self, failures: int, code: str = "Throttling") -> None:
        self.failures, self.code, self.calls = failures, code, []

    def put_metric_data(self, **kwargs):
        from botocore.exceptions import ClientError

        self.calls.append(kwargs)
        if len(self.calls) <= self.failures:
            raise ClientError(
                {"Error": {"Code": self.code}, "ResponseMetadata": {"HTTPStatusCode": 400}}, "PutMetricData"
            )


def test_cloudwatch_retries_throttling_with_backoff(monkeypatch):
    monkeypatch.setattr("trainer_agent.cloudwatch.BACKOFF_S", 0.001)
    client = ThrottledClient(failures=MAX_ATTEMPTS - 1)
    sink = CloudWatchSink(client=client)
    sink.emit(JOB_WINDOW)
    sink.close(5.0)
    assert len(client.calls) == MAX_ATTEMPTS
    assert (sink.sent, sink.dropped) == (len(JOB_WINDOW.metrics), 0)


def test_cloudwatch_does_not_retry_a_bad_request():
    client = ThrottledClient(failures=1, code="InvalidParameterValue")
    sink = CloudWatchSink(client=client)
    sink.emit(JOB_WINDOW)
    sink.close(5.0)
    assert len(client.calls) == 1
    assert (sink.sent, sink.dropped) == (0, 1)


class HangingClient:
    def __init__(self):
        self.entered = threading.Event()
        self.release = threading.Event()

    def put_metric_data(self, **kwargs):
        self.entered.set()
        self.release.wait()


def test_cloudwatch_drops_rather_than_blocks_when_its_queue_is_full():
    # Given CloudWatch hangs on the first call and the queue holds two windows
    client = HangingClient()
    sink = CloudWatchSink(client=client, queue_windows=2)
    sink.emit(JOB_WINDOW)
    assert client.entered.wait(5.0)

    # When ten more windows are emitted
    for _ in range(10):
        sink.emit(JOB_WINDOW)

    # Then emit returned every time: two windows wait in the queue and eight were dropped
    assert sink.dropped == 8
    client.release.set()
    sink.close(5.0)


class GatedClient(ThrottledClient):
    """Accepts every call, but the first waits for a gate: windows queue up behind it."""

    def __init__(self) -> None:
        super().__init__(failures=0)
        self.gate = threading.Event()
        self.entered = threading.Event()

    def put_metric_data(self, **kwargs):
        self.entered.set()
        self.gate.wait()
        super().put_metric_data(**kwargs)


def test_cloudwatch_batches_queued_windows_into_one_call():
    # Given a first call in flight and five more windows queued behind it
    client = GatedClient()
    sink = CloudWatchSink(client=client)
    sink.emit(JOB_WINDOW)
    assert client.entered.wait(5.0)
    for _ in range(5):
        sink.emit(JOB_WINDOW)

    # When the first call returns and the sink drains
    client.gate.set()
    sink.close(5.0)

    # Then the five queued windows went out in one PutMetricData call
    assert [len(call["MetricData"]) for call in client.calls] == [len(JOB_WINDOW.metrics), 5 * len(JOB_WINDOW.metrics)]


def test_cloudwatch_without_credentials_drops_windows(monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    sink = CloudWatchSink(require_credentials=True)
    sink.emit(JOB_WINDOW)
    sink.close(5.0)
    assert (sink.sent, sink.dropped) == (0, 1)


def test_cloudwatch_unreachable_is_retried_then_dropped_within_the_close_timeout(monkeypatch):
    # Given an endpoint where nothing listens (connection refused, no network needed)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setattr("trainer_agent.cloudwatch.BACKOFF_S", 0.001)
    sink = CloudWatchSink(region="us-east-1")

    # When a window is emitted and the sink closed
    sink.emit(JOB_WINDOW)
    sink.close(20.0)

    # Then it was dropped after the retries, and nothing raised
    assert (sink.sent, sink.dropped) == (0, 1)
