"""The agent's stack dumps of a stalled job, from its log streams: FilterLogEvents on their marker, not paging.

    lines = read_stacks(logs, {"logGroupName": group, "logStreamNamePrefix": "my-job/"}, since, now)

One call asks CloudWatch Logs for the dump lines alone (`stack_dumps.FILTER_PATTERN`) since the job's last step; a
stall's dumps are one line per rank, each kept by the agent within `contract.STACKS_READ_BYTES` over the ranks, so
`STACK_PAGES` pages hold every rank's. The decision reads them only when the agent's metrics show no step
(`stack_dumps.dumps_since`): a healthy decision makes no call.
"""

from __future__ import annotations

from typing import Any

from stallwatch.core import stack_dumps
from stallwatch.core.signals import LogLine

STACK_PAGES = 3  # FilterLogEvents pages of 1 MB (contract.STACKS_READ_BYTES fits them)
PAGE_EVENTS = 10_000  # FilterLogEvents' most events a page


def read_stacks(logs: Any, selection: dict[str, Any], since: float, now: float) -> list[LogLine]:
    """The dump lines in [since, now] of the streams `selection` names (logGroupName and logStreamNamePrefix, or
    logStreamNames), oldest first; none if the log group does not exist."""
    request = selection | {
        "startTime": max(int(since * 1000), 0),
        "endTime": int(now * 1000),
        "filterPattern": stack_dumps.FILTER_PATTERN,
        "limit": PAGE_EVENTS,
    }
    lines: list[LogLine] = []
    for _ in range(STACK_PAGES):
        try:
            response = logs.filter_log_events(**request)
        except logs.exceptions.ResourceNotFoundException:
            return lines
        lines += [
            LogLine.read(event["timestamp"] / 1000, event["logStreamName"], event["message"].rstrip("\n"))
            for event in response.get("events", [])
        ]
        if not response.get("nextToken"):
            break
        request["nextToken"] = response["nextToken"]
    return lines
