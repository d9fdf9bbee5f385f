"""What one decision's rules read and conclude, and the findings both evidence ladders reach.

Every rule reads a `Context` (the signals, thresholds, limits and what was measured so far), writes what it saw into
`Context.evidence`, names the times it turns decisive in `Context.deadlines`, and returns a `Finding`. The ladders
with the agent (`progress_rules`) and without it (`silence_rules`) share what is here: the hosts whose GPUs speak for
the job, the finding of fatal lines, and the benign waits of a live job (a checkpoint, input, a learned pause).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from stallwatch.core import evidence, log_patterns, measures
from stallwatch.core.decision import NOT_PROBLEMS, Diagnosis
from stallwatch.core.measures import LEARNED_GAP_MARGIN
from stallwatch.core.policy import Thresholds
from stallwatch.core.reasons import error_summary, minutes
from stallwatch.core.signals import JobFacts, JobSignals, LogLine, Series

# No step (without the agent: no log line) for more than this many periods: the job is stalling, and the decision
# names the times its later rungs turn decisive (no alarm fires again once the first has).
STALLING_PERIODS = 2
# No progress a live job explains is never stopped before this many times the stall (without the agent, the
# log-silence) threshold: an undeclared checkpoint being written (its start line), the loop waiting for input
# (outside step(): a data stall, or a script idling after its work, which the wait must not hide for long).
CHECKPOINT_FACTOR = 4.0
DATA_WAIT_FACTOR = 2.0


@dataclass(frozen=True)
class Finding:
    """A diagnosis with its reasons; `stoppable` when enforce would stop for it."""

    diagnosis: Diagnosis
    reasons: tuple[str, ...]
    stoppable: bool = False
    overdue: bool = False  # a benign state that has lasted suspiciously long (startup beyond its grace)
    conclusive: bool = False  # independent evidence agrees: the shorter `confirmed_grace_minutes` applies

    @property
    def problem(self) -> bool:
        return self.overdue or self.diagnosis not in NOT_PROBLEMS


class Deadlines:
    """The times at which a rule turns decisive if nothing changes; the decision asks to be made again at the first
    one still ahead (`Decision.recheck_at`)."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.times: list[float] = []

    def add(self, t: float | None) -> None:
        """`t`, if ahead; a rule that never turns decisive (an infinite time: its witness cannot come) asks for none."""
        if t is not None and self.now < t < math.inf:
            self.times.append(t)

    def first(self) -> float | None:
        return min(self.times, default=None)


@dataclass(frozen=True)
class Context:
    """What every rule of one decision reads."""

    signals: JobSignals
    thresholds: Thresholds
    limits: measures.Limits
    now: float
    evidence: dict[str, Any]
    deadlines: Deadlines
    training_since: float
    logs: measures.Logs
    period: float  # the hosts' datapoints' period (or the agent's window, if longer)
    pauses: measures.Pauses  # the longest healthy pauses the job came back from, learned so far
    deaths: tuple[float, ...] = ()  # the fatal bursts earlier decisions saw as last words (`JobState.deaths`)


def with_gpus(hosts: dict[str, Any], facts: JobFacts) -> dict[str, Any]:
    """The hosts whose GPUs speak for the job: a heterogeneous cluster's CPU-only hosts have no GPU metrics, and only
    their logs count."""
    return {name: host for name, host in hosts.items() if facts.gpus_on(name)}


def error_finding(errors: dict[str, list[LogLine]], reasons: tuple[str, ...], conclusive: bool = False) -> Finding:
    """Fatal lines after progress stopped, and their second witness in `reasons`: a crashed rank, or a hang when all
    are NCCL collective timeouts; `conclusive` when every host said them."""
    patterns = {measures.fatal(line) for lines in errors.values() for line in lines}
    diagnosis = Diagnosis.HANG if patterns == {log_patterns.NCCL_TIMEOUT} else Diagnosis.CRASHED_RANK
    return Finding(diagnosis, (error_summary(errors), *reasons), stoppable=True, conclusive=conclusive)


def every_host_said(errors: dict[str, list[LogLine]], facts: JobFacts) -> bool:
    """Whether every GPU host's last words are among `errors` (a watchdog's timeouts after a hang)."""
    gpu_hosts = [host for host in errors if facts.gpus_on(host)]
    return bool(gpu_hosts) and len(gpu_hosts) >= facts.gpu_host_count()


def benign_wait(
    ctx: Context,
    hosts: dict[str, evidence.Host],
    since: float,
    threshold_s: float,
    slack_s: float = evidence.LAST_WORDS_S,
) -> Finding | None:
    """No progress, explained by something a live job does: a checkpoint being written (its start line at most
    `slack_s` before the last progress, nothing since on its host) or just written (its end line less than the
    threshold ago), with the agent the loop waiting outside step() for input, or a pause like the ones the job came
    back from (idle GPUs, memory held: a checkpoint whose lines no pattern reads). Never stopped before
    `CHECKPOINT_FACTOR` (`DATA_WAIT_FACTOR`) x the threshold, or LEARNED_GAP_MARGIN x that pause, from the last
    progress; then it is a stall like any other."""
    now = ctx.now
    checkpoint = evidence.checkpoint_since(hosts, since, slack_s)
    ended = evidence.checkpoint_ended(hosts, since)
    if checkpoint is None and ended is not None and now - ended < threshold_s:
        # A checkpoint's end line is life: the first step after it is due within the threshold, reported at the
        # agent's next window.
        ctx.deadlines.add(ended + threshold_s)
        ctx.evidence["checkpoint"] = {"ended_t": ended}
        what = f"a checkpoint ended {minutes(now - ended)} ago (its end line): steps are due"
        return Finding(Diagnosis.PHASE, (f"no progress for {minutes(now - since)}, {what}",))
    wait = ctx.signals.agent.get("DataWaitFraction", Series()).since(since).mean()
    waiting = wait is not None and wait > ctx.thresholds.data_wait_percent
    paused = _as_paused_before(ctx, hosts)
    if checkpoint is None and not waiting and not paused:
        return None
    if checkpoint is not None:
        ctx.evidence["checkpoint"] = {"since_t": checkpoint}
        what = f"writing a checkpoint for {minutes(now - checkpoint)} (its start line, nothing since)"
        limit, diagnosis, overrun = CHECKPOINT_FACTOR * threshold_s, Diagnosis.PHASE, Diagnosis.PHASE_OVERRUN
    elif waiting:
        ctx.evidence["data_wait_percent"] = round(wait or 0.0, 1)
        what = f"waiting for input {wait:.0f}% of the time since the last step"
        limit, diagnosis, overrun = DATA_WAIT_FACTOR * threshold_s, Diagnosis.DATA_STARVATION, Diagnosis.IDLE
    else:
        learned = minutes(ctx.pauses.idle_s or 0.0)
        what = f"paused with idle GPUs and memory held, as it came back from a {learned} pause"
        limit, diagnosis, overrun = 0.0, Diagnosis.PHASE, Diagnosis.IDLE
    limit = max(limit, paused)
    ctx.deadlines.add(since + limit)
    if now - since < limit:
        return Finding(
            diagnosis, (f"no progress for {minutes(now - since)}, {what}", f"not stopping before {minutes(limit)}")
        )
    return Finding(overrun, (f"no progress for {minutes(now - since)}, {what}: past {minutes(limit)}",), stoppable=True)


def _as_paused_before(ctx: Context, hosts: dict[str, evidence.Host]) -> float:
    """How long the job may pause with idle GPUs and memory held: LEARNED_GAP_MARGIN x the longest such pause it
    came back from (its own checkpoints, whatever their lines say), if every GPU host is idle and holds its memory
    now; else 0."""
    learned = ctx.pauses.idle_s
    gpu_hosts = [h for h in hosts.values() if h.gpus]
    idle = ctx.thresholds.idle_gpu_percent
    held = bool(gpu_hosts) and all(
        h.memory_now is not None and h.memory_now >= idle and h.util_now is not None and h.util_now < idle
        for h in gpu_hosts
    )
    if learned is None or not held:
        return 0.0
    return LEARNED_GAP_MARGIN * learned * ctx.limits.factor
