"""Trace format v1: one job's metrics, logs and status history as JSON Lines, for replay and backtests.

    trace = read_trace(open("corpus/traces/sm-hang-8host.jsonl"))  # offline.trace_file.load_trace reads a path
    trace.header.job.name, len(trace.events), trace.duration_s

Line 1 is the header, then one event per line, sorted by ``t`` (seconds since the job entered InProgress):
a status change, a metric datapoint, a log line, or the end of the trace. Errors name the line and field.
Log streams are as on the platform: SageMaker's ``<job>/algo-N-<epoch>``, EC2's instance id (``i-...``, optionally
``i-.../<file>``), one job's instances spanning many streams; a Slurm node's
``slurm__var_log_stallwatch_slurm_<job>.<node>.log``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from stallwatch.core.platforms import describe
from stallwatch.core.signals import JobStatus, Platform


class TraceError(ValueError):
    """A trace file that is not valid trace format v1; the message names the line and field."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TraceJob(_Model):
    """The job as the platform describes it."""

    name: str = Field(min_length=1)
    platform: Platform
    instance_type: str
    instance_count: int = Field(ge=1)
    gpus_per_host: int = Field(ge=0)
    vcpus_per_host: int = Field(ge=1)
    tags: dict[str, str] = Field(default_factory=dict)
    # EC2: the instance ids (the hosts: one job may span many instances); SageMaker hosts are algo-1..algo-N.
    instance_ids: list[str] = Field(default_factory=list)
    # Each host's instance type where they differ (a heterogeneous cluster, a mixed EC2 group); absent: all hosts are
    # instance_type (with gpus_per_host and vcpus_per_host).
    host_types: dict[str, str] | None = None
    # Slurm: each node's EC2 instance, whose CloudWatch agent metrics are the node's (ParallelCluster, PCS).
    host_instances: dict[str, str] | None = None

    @model_validator(mode="after")
    def _check(self) -> TraceJob:
        platform = describe(self.platform)
        if platform.named_hosts and len(self.instance_ids) != self.instance_count:
            raise ValueError(
                f"{self.platform} jobs need one instance id per host: {self.instance_count} hosts, {self.instance_ids}"
            )
        hosts = platform.hosts(self.instance_count, self.instance_ids)
        if unknown := sorted(set(self.host_types or {}) - set(hosts)):
            raise ValueError(f"host_types names hosts the job does not have: {unknown}")
        if unknown := sorted(set(self.host_instances or {}) - set(hosts)):
            raise ValueError(f"host_instances names hosts the job does not have: {unknown}")
        if "." in self.name:
            raise ValueError(f"job name {self.name!r} must not contain '.'")
        return self


class Expectation(_Model):
    """The label: a stop inside ``window_s`` (seconds since InProgress), or no stop at all."""

    action: Literal["stop", "none"]
    window_s: tuple[float, float] | None = None
    # Optional: a diagnosis some decision must reach (e.g. "data_starvation" for an alert-only case).
    diagnosis: str | None = None
    # How many Slack alerts and stop warnings the replay may send at most; unset: 0 on a "none" trace, any on "stop".
    alerts: int | None = Field(None, ge=0)
    warnings: int | None = Field(None, ge=0)

    def allowed(self, field: Literal["alerts", "warnings"]) -> int | None:
        """The most `field` the replay may send (None: no limit). A healthy trace gets none unless its label says."""
        value = getattr(self, field)
        return 0 if value is None and self.action == "none" else value

    @model_validator(mode="after")
    def _check(self) -> Expectation:
        if self.action == "stop" and self.window_s is None:
            raise ValueError("action 'stop' needs window_s [lo, hi]")
        if self.window_s is not None and self.window_s[0] > self.window_s[1]:
            raise ValueError(f"window_s {list(self.window_s)}: lo must not exceed hi")
        return self


class TraceHeader(_Model):
    stallwatch_trace: Literal[1]
    job: TraceJob
    expect: Expectation | None = None
    # A sentence on what happens in the trace (corpus).
    scenario: str | None = None


class StatusEvent(_Model):
    t: float = Field(ge=0)
    status: JobStatus  # the trace's word for it, as the product has always written it (SageMaker's)
    secondary: str | None = None


class MetricDatum(_Model):
    namespace: str
    name: str
    dimensions: dict[str, str]
    value: float


class MetricEvent(_Model):
    t: float = Field(ge=0)
    metric: MetricDatum


class LogRecord(_Model):
    stream: str
    message: str


class LogEvent(_Model):
    t: float = Field(ge=0)
    log: LogRecord


class EndEvent(_Model):
    t: float = Field(ge=0)
    end: Literal[True]


Event = StatusEvent | MetricEvent | LogEvent | EndEvent
_EVENT_KINDS: dict[str, type[Event]] = {"status": StatusEvent, "metric": MetricEvent, "log": LogEvent, "end": EndEvent}
_METRIC_FIELDS = {"namespace", "name", "dimensions", "value"}
_LOG_FIELDS = {"stream", "message"}


@dataclass(frozen=True)
class Trace:
    """A parsed trace: the header and its events in time order."""

    header: TraceHeader
    events: tuple[Event, ...]
    source: str = "<trace>"  # the file it came from, for reports

    @property
    def job(self) -> TraceJob:
        return self.header.job

    @property
    def duration_s(self) -> float:
        """Where the trace ends: its end event, else its last event."""
        return self.events[-1].t if self.events else 0.0


def _error_text(exc: ValidationError) -> str:
    first = exc.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or "(line)"
    return f"field {field}: {first['msg']}"


def _number(value: object) -> bool:
    return type(value) in (int, float) and math.isfinite(value)  # type: ignore[arg-type]


def _plain_event(raw: dict) -> Event | None:
    """A metric or log event already in exactly the validated shape, built without validating it again (a long
    trace is mostly these); None for anything else, which the models validate."""
    t = raw.get("t")
    if len(raw) != 2 or not _number(t) or t < 0:
        return None
    metric, log = raw.get("metric"), raw.get("log")
    if type(metric) is dict and metric.keys() == _METRIC_FIELDS:
        dims, value = metric["dimensions"], metric["value"]
        names = (metric["namespace"], metric["name"])
        plain_dims = type(dims) is dict and all(type(k) is str and type(v) is str for k, v in dims.items())
        if plain_dims and all(type(n) is str for n in names) and _number(value):
            datum = MetricDatum.model_construct(namespace=names[0], name=names[1], dimensions=dims, value=float(value))
            return MetricEvent.model_construct(t=float(t), metric=datum)
    if type(log) is dict and log.keys() == _LOG_FIELDS and all(type(v) is str for v in log.values()):
        return LogEvent.model_construct(t=float(t), log=LogRecord.model_construct(**log))
    return None


def parse_event(raw: dict, where: str) -> Event:
    """One event line (already JSON-decoded); TraceError names `where` and the field."""
    plain = _plain_event(raw)
    if plain is not None:
        return plain
    kinds = [k for k in _EVENT_KINDS if k in raw]
    if len(kinds) != 1:
        raise TraceError(f"{where}: an event has exactly one of {sorted(_EVENT_KINDS)}, got keys {sorted(raw)}")
    try:
        return _EVENT_KINDS[kinds[0]].model_validate(raw)
    except ValidationError as exc:
        raise TraceError(f"{where}: {kinds[0]} event: {_error_text(exc)}") from exc


def read_trace(lines: Iterable[str], source: str = "<trace>") -> Trace:
    """Parse trace lines; blank lines are skipped."""
    header, events = scan_trace(lines, source)
    return Trace(header=header, events=tuple(events), source=source)


def scan_trace(lines: Iterable[str], source: str = "<trace>") -> tuple[TraceHeader, Iterator[Event]]:
    """The header, and the events one at a time, checked as `read_trace` checks them (a `TraceError` comes when
    the bad line is reached): a long trace need not be held in memory."""
    numbered = ((n, line) for n, line in enumerate(lines, start=1) if line.strip())
    number, line = next(numbered, (0, ""))
    if not number:
        raise TraceError(f"{source}: empty trace, expected a header line")
    try:
        header = TraceHeader.model_validate(_json_object(line, f"{source}:{number}"))
    except ValidationError as exc:
        raise TraceError(f"{source}:{number}: header: {_error_text(exc)}") from exc
    return header, _events(numbered, source)


def _events(numbered: Iterator[tuple[int, str]], source: str) -> Iterator[Event]:
    previous: Event | None = None
    for number, line in numbered:
        where = f"{source}:{number}"
        event = parse_event(_json_object(line, where), where)
        if previous is not None and event.t < previous.t:
            raise TraceError(f"{where}: field t: {event.t} is before the previous event's {previous.t}")
        if isinstance(previous, EndEvent):
            raise TraceError(f"{where}: event after the end event")
        previous = event
        yield event


def _json_object(line: str, where: str) -> dict:
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from exc
    if not isinstance(raw, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    return raw


def _line(model: BaseModel) -> str:
    return json.dumps(model.model_dump(mode="json", exclude_none=True), separators=(",", ":"))


def trace_text(header: TraceHeader, events: Iterable[Event]) -> str:
    """A trace as text: the header, then the events (sorted by t, stable), one JSON object a line."""
    ordered = sorted(events, key=lambda e: e.t)
    return "\n".join([_line(header), *(_line(e) for e in ordered)]) + "\n"
