"""When a fatal line's wake-up decides: the subscription filter delivers a job's fatal lines (and the agent's stall
record, its stack dumps) to on_log_line, which decides on the job through the same engine and the same claim as
on_alarm (`runtime.wake`). Pure: no clock.

    start = decision_start(line_t, now)             # when the decision begins reading the job's signals
    wait = wait_for_recheck(recheck_at, now, deadline)   # a recheck due this soon is decided in the same invocation

A decision sees a line once FilterLogEvents returns it, `LINE_READABLE_S` after its timestamp; decisions begin on
a grid of `WAKE_GRID_S`, so the lines of one burst (every host's NCCL watchdog, a traceback's lines, arriving as
many events in many invocations) wake one decision: the one that begins at the first grid time after them. A line
that a decision begun before it could not see wakes another.
"""

from __future__ import annotations

import math

from stallwatch.core import log_patterns
from stallwatch.core.config import ON_ALARM_TIMEOUT_SECONDS
from stallwatch.core.contract import STACKS_MARKER

# A line is returned by FilterLogEvents this long after its timestamp: the log agent's flush (the CloudWatch agent's
# default force_flush_interval is 5 s) and CloudWatch Logs' ingestion.
LINE_READABLE_S = 5.0
WAKE_GRID_S = 10.0  # decisions of a wake-up begin on this grid: a burst's lines wake one
# A recheck the engine asks for this soon (its evidence turns decisive: a watchdog burst is confirmed a minute after
# it, a rank's death three) is waited for in the invocation: a schedule fires one to three minutes later (Scheduler's
# lead and minute). So is the next one, while the function's time allows one more decision after the wait.
WAIT_FOR_RECHECK_S = 210.0
DECISION_TIME_S = ON_ALARM_TIMEOUT_SECONDS  # one decision's time (on_alarm's timeout)
# How long CloudWatch Logs takes to deliver a line to the subscription's function: "seconds" (a batch per log stream,
# invoked asynchronously). The replay's model of it; the runtime reads the line's own timestamp.
DELIVERY_DELAY_S = 10.0


def seen_from(line_t: float) -> float:
    """The first grid time at which a decision that begins reading sees a line written at `line_t`."""
    return math.ceil((line_t + LINE_READABLE_S) / WAKE_GRID_S) * WAKE_GRID_S


def decision_start(line_t: float, now: float) -> float:
    """When the wake-up's decision begins reading: when it sees the line, or `now` if that has passed."""
    return max(seen_from(line_t), now)


def wait_for_recheck(recheck_at: float | None, now: float, deadline: float) -> float | None:
    """Seconds to wait for the recheck the decision asked for, if it is due within `WAIT_FOR_RECHECK_S` and one
    decision's time remains after it before `deadline` (the invocation's end); else None (its schedule decides it)."""
    if recheck_at is None or recheck_at - now > WAIT_FOR_RECHECK_S:
        return None
    wait = max(0.0, recheck_at - now)
    return wait if now + wait + DECISION_TIME_S <= deadline else None


def wakes(message: str, patterns: log_patterns.LinePatterns) -> bool:
    """Whether a delivered line wakes a decision: a fatal line by `patterns`, or the agent's stall record (its stack
    dump, written a minute into a stall: the engine alerts on it, never stops)."""
    return STACKS_MARKER in message or patterns.match(message) is not None


def delivered(message: str, filter_pattern: str, patterns: log_patterns.LinePatterns) -> bool:
    """Whether the subscription filter (`filter_pattern`: `Policy.fatal_filter_pattern`) delivers `message` and it
    wakes a decision (`wakes`; the filter is a superset of the patterns' regexes)."""
    return log_patterns.passes_fatal_filter(message, filter_pattern) and wakes(message, patterns)
