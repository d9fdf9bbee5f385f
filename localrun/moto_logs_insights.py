"""A small moto extension: the Logs Insights query Stallwatch runs (moto 5.2.5 runs only `fields | sort | limit`).

    from localrun import moto_logs_insights
    moto_logs_insights.install()
    logs.start_query(logGroupName=group, startTime=s, endTime=e, queryString=LAST_EVENT_QUERY)

Runs ``[filter @logStream like /<regex>/ |] stats max(@timestamp) as <name> by @logStream`` as Logs Insights
does: one row per stream with an event in the time range (start and end in epoch seconds, both included), the
newest event's time as ``YYYY-MM-DD HH:MM:SS.mmm`` (UTC). Any other query goes to moto's own implementation.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from moto.logs import models

_STATS = re.compile(
    r"^\s*(?:filter\s+@logStream\s+like\s+/(?P<regex>(?:[^/\\]|\\.)*)/\s*\|\s*)?"
    r"stats\s+max\(@timestamp\)\s+as\s+(?P<name>\w+)\s+by\s+@logStream\s*$"
)
_original_execute = models.execute_query


def timestamp_text(ms: int) -> str:
    """A Logs Insights timestamp: ``2026-11-30 10:00:00.000`` (UTC)."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _execute(log_groups: list[Any], query: str, start_time: int, end_time: int) -> list[dict[str, str]]:
    match = _STATS.match(query)
    if not match:
        return _original_execute(log_groups, query, start_time, end_time)
    pattern = re.compile(match["regex"]) if match["regex"] is not None else None
    rows = []
    for group in log_groups:
        for name, stream in group.streams.items():
            if pattern and not pattern.search(name):
                continue
            times = [e.timestamp for e in stream.events if start_time * 1000 <= e.timestamp <= end_time * 1000]
            if times:
                rows.append({"@logStream": name, match["name"]: timestamp_text(max(times))})
    return rows


def install() -> None:
    models.execute_query = _execute  # moto's LogQuery looks it up in its module at query time
