"""The delay table of docs/engine.md, row by row: from the moment a diagnosis's condition turns decisive to the
decision (alarms, the rechecks the engine names, the sweeper), replayed on the corpus at the default policy.

Each row: a corpus trace, the diagnosis, when its condition turns decisive (seconds after the label's onset), and the
most the decision may come after that. A recheck fires in the minute after its time (EventBridge Scheduler's
precision, the runtime rounding up): up to 2 minutes; an alarm is evaluated every minute.
"""

from __future__ import annotations

import functools

import pytest

from corpus import generate
from stallwatch.core.decision import Action
from stallwatch.offline.replay import ReplayResult, replay
from stallwatch.offline.trace_file import load_trace

MIN = 60.0
RECHECK_S = 2 * MIN  # the minute the time is rounded up to, and the minute Scheduler may take


@functools.cache
def replayed(name: str) -> ReplayResult:
    return replay(load_trace(generate.TRACES_DIR / f"{name}.jsonl"))


def onset(result: ReplayResult) -> float:
    return result.expect["window_s"][0]


# (trace, diagnosis, decisive after the onset, most delay to the warning)
ROWS = [
    ("sm-hang-8host-agent", "hang", 3 * MIN, RECHECK_S),  # a collective spins on every host: crash_confirm
    ("ec2-hang-8node-agent", "hang", 3 * MIN, RECHECK_S),
    ("sm-crashed-rank-8host", "crashed_rank", 3 * MIN, RECHECK_S),  # fatal last words, the rank's GPUs dead
    # its memory released in the minute that holds the crash, stamped at that minute's start (20 s before it)
    ("ec2-crash-rank0-logs-4node-noagent", "crashed_rank", 3 * MIN - 20, RECHECK_S),
    ("sm-xid-rare-logger-noagent", "crashed_rank", 3 * MIN, RECHECK_S),
    # 4 periods past its newest datapoint's (stamped at its period's start: 3 to 4 minutes after it died)
    ("sm-rank0-host-lost-4host-agent", "crashed_rank", 3 * MIN, RECHECK_S + MIN),
    # every process left its GPUs without a fatal line: the agreement rung of idle_minutes (2/3 of 15)
    ("ec2-idle-after-training-4node", "idle", 10 * MIN, RECHECK_S),
    ("sm-idle-silent-1host", "idle", 10 * MIN, RECHECK_S),  # idle GPUs and silent logs agree at 2/3
    ("sm-checkpoint-overrun-2host", "phase_overrun", 10 * MIN, RECHECK_S),  # the budget's end + the allowance
    ("sm-eval-phase-hangs-2host-agent", "phase_overrun", 10 * MIN, RECHECK_S),
]


@pytest.mark.parametrize(("trace", "diagnosis", "decisive_s", "delay_s"), ROWS, ids=[row[0] for row in ROWS])
def test_a_stall_is_warned_soon_after_its_condition_turns_decisive(
    trace: str, diagnosis: str, decisive_s: float, delay_s: float
) -> None:
    # Given a corpus trace whose stall turns decisive `decisive_s` after its onset / When replayed
    result = replayed(trace)
    warn = next(d for d in result.decisions if d.decision.action is Action.WARN)
    # Then the warning, with that diagnosis, comes no earlier than the condition and at most `delay_s` after it
    assert warn.decision.diagnosis.value == diagnosis
    assert onset(result) + decisive_s - 1 <= warn.t <= onset(result) + decisive_s + delay_s


@pytest.mark.parametrize(
    ("trace", "grace_min"),
    [("sm-hang-8host-agent", 2.0), ("sm-crashed-rank-8host", 2.0), ("sm-idle-silent-1host", 5.0)],
)
def test_the_stop_comes_when_the_warnings_grace_ends(trace: str, grace_min: float) -> None:
    # Given a warned stall (conclusive evidence: the 2-minute grace; two signals: 5 minutes) / When replayed
    result = replayed(trace)
    # Then the recheck the warning named stops it within the minute after its grace
    assert grace_min * MIN <= result.first_stop_s - result.first_warn_s <= grace_min * MIN + RECHECK_S


def test_a_straggler_is_named_within_a_check_up_of_its_window() -> None:
    # Given a node slowed by 1.3x from t=1500 / When replayed
    result = replayed("sm-straggler-30pct-8host-agent")
    named = next(d for d in result.decisions if d.decision.diagnosis.value == "straggler")
    # Then it is named within 30 minutes: its 10-minute window, then the next check-up (every 20 minutes)
    assert named.decision.evidence["straggler"]["host"] == "algo-4"
    assert 1_500 + 10 * MIN <= named.t <= 1_500 + 30 * MIN
