"""CloudWatch Logs reads that do not grow with hosts: each SageMaker host's newest event, and a job's log tail.

    last = newest_events(logs, start, now, sleep=time.sleep)       # {(job, host): t}, one Logs Insights query
    tails = read_tails(logs, "my-job", hosts, freshness, now)       # {host: HostLog}, two FilterLogEvents, or four
    tails = read_tails(logs, "my-job", hosts, freshness, now, stacks_since=t)  # and the agent's stack dumps since t

The sweeper runs one query per sweep over the whole log group (``stats max(@timestamp) by @logStream``) and
publishes each host's idleness; a decision reads its job's tail in at most two windows, one page each (10,000
events or 1 MB, streams interleaved by time): the last `LOG_RECENT_SECONDS` (fresh, whatever the busy hosts
write), and, when some hosts are quieter than that, the lines up to the quiet hosts' last ones. When a window does not
fit its page (a busy cluster, a job the sweeper has not seen), two more reads ask CloudWatch Logs for the notable
lines alone over the lookback (`LinePatterns.filter_patterns`: the fatal lines, then the checkpoint markers; one
1,024-character pattern cannot hold both), so a crashed rank's error among 512 busy hosts is one page away, however
much they write. A stalled job's decision also takes the agent's stack dumps since its last step: from these pages
when they hold every line since then, else by one filtered read (`stack_dump_reads`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from stallwatch.aws.stack_dump_reads import read_stacks
from stallwatch.core import contract, log_patterns
from stallwatch.core.reading import LOG_TAIL_SECONDS, LOOKBACK_SECONDS
from stallwatch.core.signals import LogLine

LOG_RECENT_SECONDS = 120  # the fresh window: 512 hosts at a line per 10 s are 6,144 events, one page
PAGE_EVENTS = 10_000  # FilterLogEvents' page
PAGE_FILL = 0.8  # of a page, the second window aims to fill
LAST_EVENT_FIELD = "last"
LAST_EVENT_QUERY = f"stats max(@timestamp) as {LAST_EVENT_FIELD} by @logStream"
QUERY_POLL_SECONDS = 1.0  # first wait for a Logs Insights query; doubled up to QUERY_POLL_MAX_SECONDS
QUERY_POLL_MAX_SECONDS = 8.0
QUERY_WAIT_SECONDS = 120.0  # a query not complete by then is given up (the sweep publishes nothing this time)
WHOLE_GROUP = ""  # `JobStreams.prefix` of streams that share no prefix (EC2's instance ids)
QUERY_DONE = frozenset({"Complete", "Failed", "Cancelled", "Timeout", "Unknown"})


K = TypeVar("K")  # what `newest_events` keys a stream's host by


class LogQueryError(RuntimeError):
    """A Logs Insights query failed, was cancelled, or did not finish in time."""


@dataclass
class HostLog:
    """One host's newest event time, the lines read around it and its notable lines, oldest first."""

    last_t: float | None = None
    lines: list[LogLine] = field(default_factory=list)
    notable: list[LogLine] = field(default_factory=list)  # fatal and checkpoint lines over the lookback
    stacks: list[LogLine] = field(default_factory=list)  # the agent's stack dumps since the job's last step


def newest_events(
    logs: Any,
    group: str,
    key_of: Callable[[str], K | None],
    start: float,
    end: float,
    sleep: Callable[[float], None],
) -> dict[K, float]:
    """Each host's newest event in `group` between `start` and `end` (epoch seconds), keyed by `key_of` its stream
    (None: no host's), from one Logs Insights query: StartQuery, then GetQueryResults until it completes."""
    try:
        query_id = logs.start_query(
            logGroupName=group,
            startTime=int(start),
            endTime=int(end),
            queryString=LAST_EVENT_QUERY,
        )["queryId"]
    except logs.exceptions.ResourceNotFoundException:
        return {}  # no training job has logged yet
    waited, wait = 0.0, QUERY_POLL_SECONDS
    while True:
        response = logs.get_query_results(queryId=query_id)
        if response["status"] in QUERY_DONE:
            break
        if waited >= QUERY_WAIT_SECONDS:
            raise LogQueryError(f"Logs Insights query {query_id} still {response['status']} after {waited:.0f} s")
        sleep(wait)
        waited, wait = waited + wait, min(wait * 2, QUERY_POLL_MAX_SECONDS)
    if response["status"] != "Complete":
        raise LogQueryError(f"Logs Insights query {query_id}: {response['status']}")
    newest: dict[K, float] = {}
    for row in response["results"]:
        fields = {f["field"]: f["value"] for f in row}
        key = key_of(fields.get("@logStream", ""))
        if key is not None and LAST_EVENT_FIELD in fields:
            t = _query_time(fields[LAST_EVENT_FIELD])
            newest[key] = max(newest.get(key, t), t)
    return newest


def _query_time(text: str) -> float:
    """A Logs Insights timestamp (``2026-11-30 10:00:00.000``, UTC) in epoch seconds."""
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC).timestamp()


@dataclass(frozen=True)
class JobStreams:
    """Where a job's streams are: a log group, the prefix every one of them starts with (`WHOLE_GROUP`: they share
    none, the group is read as a whole), and the host of a stream (None for another job's)."""

    group: str
    prefix: str | None  # None: "<job>/"
    host_of: Callable[[str, str], str | None]  # (stream, job) -> host

    def prefix_of(self, job: str) -> str:
        return self.prefix if self.prefix is not None else f"{job}/"

    def selection(self, job: str) -> dict[str, str]:
        """FilterLogEvents' selection of the job's streams."""
        prefix = self.prefix_of(job)
        return {"logGroupName": self.group} | ({"logStreamNamePrefix": prefix} if prefix else {})

    def host(self, stream: str, job: str) -> str | None:
        return self.host_of(stream, job)


def read_tails(
    logs: Any,
    streams: JobStreams,
    job: str,
    hosts: list[str],
    freshness: dict[str, float],
    now: float,
    patterns: log_patterns.LinePatterns = log_patterns.BUILT_IN,
    stacks_since: float | None = None,
) -> dict[str, HostLog]:
    """The job's hosts' log tails: the last `LOG_RECENT_SECONDS`, then, if hosts are quieter, the lines up to the
    quietest hosts' last ones (where a crashed rank's error is). One page each, so the calls do not grow with hosts;
    `freshness` (a host's newest event, as the sweeper last saw it) is raised by every line read. With
    `stacks_since`, the agent's stack dumps since then too: from the pages read when they hold every line since then
    (a job whose hosts all fell quiet), else by one filtered read (`stack_dump_reads`).

    The second window starts `LOG_TAIL_SECONDS` before the quiet hosts' last lines, or later: as late as one page
    holds at the rate the first window saw (512 busy hosts at a line every 10 s: about 3 minutes), so a page that
    is full ends at the quiet hosts' last lines, not 10 minutes before them. A host whose freshness is unknown (a
    job the sweeper has not seen yet) has the window reach back to the lookback. `patterns` names the lines (the job's
    policy may add its own)."""
    found = {host: HostLog(last_t=freshness.get(host)) for host in hosts}
    recent = now - LOG_RECENT_SECONDS
    recent_ms = int(recent * 1000)
    seen, complete = _read_window(logs, job, streams, recent_ms, int(now * 1000), found, patterns)
    quiet = [log.last_t for log in found.values() if log.last_t is None or log.last_t < recent]
    read_from = recent  # every line since then is in the pages read (when `complete`)
    if quiet:
        if None in quiet:
            start, end_ms = now - LOOKBACK_SECONDS, recent_ms - 1
        else:
            known = [t for t in quiet if t is not None]
            rate = seen / LOG_RECENT_SECONDS  # events a second, of the hosts still writing
            span = min(LOG_TAIL_SECONDS, PAGE_FILL * PAGE_EVENTS / rate) if rate else LOG_TAIL_SECONDS
            # up to the quiet hosts' last lines, whole milliseconds (a float's *1000 may fall short of the event's)
            start, end_ms = min(known) - span, min(round(max(known) * 1000), recent_ms - 1)
        start_ms = int(max(start, now - LOOKBACK_SECONDS) * 1000)
        complete &= _read_window(logs, job, streams, start_ms, end_ms, found, patterns)[1]
        if len(quiet) == len(found):  # no host wrote after the second window: it and the first hold every line
            read_from = start_ms / 1000
    if not complete:  # a page that could not hold its window: its fatal and checkpoint lines, on their own
        lookback = int((now - LOOKBACK_SECONDS) * 1000), int(now * 1000)
        for pattern in patterns.filter_patterns:
            _read_window(logs, job, streams, *lookback, found, patterns, notable=pattern)
    if stacks_since is not None:
        _stacks(logs, job, streams, found, stacks_since, now, held=complete and read_from <= stacks_since)
    for log in found.values():
        log.lines.sort(key=lambda line: line.t)
        log.notable.sort(key=lambda line: line.t)
    return found


def newest_marker(
    logs: Any,
    selections: Iterable[dict[str, Any]],
    start: float,
    end: float,
    patterns: log_patterns.LinePatterns,
    marker: str,
) -> float | None:
    """When the newest line of `marker`'s kind (a checkpoint's end) was written between `start` and `end`, over a
    job's streams (`JobHistory.log_selections`): FilterLogEvents with the markers' filter pattern, every page (only
    marker lines come back), so a live job's checkpoint is found however busy its log is."""
    newest: float | None = None
    for selection in selections:
        request = selection | {
            "startTime": int(start * 1000),
            "endTime": int(end * 1000),
            "filterPattern": patterns.filter_patterns[1],
            "interleaved": True,  # what CloudWatch Logs always does; moto needs it
        }
        try:
            pages = logs.get_paginator("filter_log_events").paginate(**request)
            for page in pages:
                for event in page.get("events", []):
                    t = event["timestamp"] / 1000
                    line = LogLine.read(t, event["logStreamName"], event["message"].rstrip("\n"), patterns)
                    if line.marker == marker and (newest is None or t > newest):
                        newest = t
        except logs.exceptions.ResourceNotFoundException:
            continue
    return newest


def _stacks(
    logs: Any, job: str, streams: JobStreams, found: dict[str, HostLog], since: float, now: float, held: bool
) -> None:
    """Each host's stack dumps since `since`: from the lines read when they hold every line since then (`held`: a
    stalled job whose hosts all fell quiet, as its tail's second window reads them), else by one filtered read."""
    if held:
        for log in found.values():
            log.stacks += [line for line in log.lines if line.t >= since and contract.STACKS_MARKER in line.message]
        return
    for line in read_stacks(logs, streams.selection(job) | {"interleaved": True}, since, now):
        host = streams.host(line.stream, job)
        if host in found:
            found[host].stacks.append(line)


def _read_window(
    logs: Any,
    job: str,
    streams: JobStreams,
    start_ms: int,
    end_ms: int,
    found: dict[str, HostLog],
    patterns: log_patterns.LinePatterns,
    notable: str | None = None,
) -> tuple[int, bool]:
    """One FilterLogEvents page over the job's streams, oldest first, both ends included: the events it held, and
    whether it held the whole window (no nextToken). `notable`: a filter pattern; only the fatal or marker lines it
    keeps, into each host's `notable`."""
    filtered = {"filterPattern": notable} if notable else {}
    try:
        response = logs.filter_log_events(
            **streams.selection(job),
            startTime=max(start_ms, 0),
            endTime=end_ms,
            limit=PAGE_EVENTS,
            interleaved=True,  # what CloudWatch Logs always does (the flag is ignored there); moto needs it
            **filtered,
        )
    except logs.exceptions.ResourceNotFoundException:
        return 0, True
    events = response.get("events", [])
    for event in events:
        host = streams.host(event["logStreamName"], job)
        if host not in found:
            continue
        line = LogLine.read(event["timestamp"] / 1000, event["logStreamName"], event["message"].rstrip("\n"), patterns)
        log = found[host]
        if notable:
            if line.pattern or line.marker:
                log.notable.append(line)
        else:
            log.lines.append(line)
        log.last_t = max(log.last_t or line.t, line.t)
    return len(events), "nextToken" not in response
