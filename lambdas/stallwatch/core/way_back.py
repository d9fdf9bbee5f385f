"""A stalled job's way back, whatever its platform's (`PlatformDescription.way_back`): one tag grammar, one budget.

Pure. SageMaker's way back is a resume (a new job from the checkpoint, after the stop: `core.resume`); EC2's a restart
in place on the job's own nodes (instead of the stop); Slurm's a requeue (the stop is the requeue). A job opts in to
the two that replace its stop with one tag, `stallwatch:recover=<its platform's way>` (or `stop`, the default), and
every way back spends one budget, resume's: `stallwatch:resume=<N>` (else the policy's `resume_max_restarts`, else
`DEFAULT_RESTARTS` for a job that opted in by `stallwatch:recover`), and no progress since the last attempt ends the
loop: the job is stopped, and Slack hears why.

    recovers(tags, WayBack.REQUEUE)                          # stallwatch:recover=requeue: True; restart: TagError
    budget = plan(tags, stop, policy_default, done, before)  # (attempt, allowed), or NoResume (gave up, and why)
    done, steps = attempts(records, until)                   # the run's ways back so far, from its audit trail
    blamed_hosts(evidence, hosts, period, now, faults)       # {host: why} a hardware signal blames: an Xid, vanished,
                                                             # the platform's own health check's hardware verdict

A node is drained or replaced only where a health check (the platform's) or a hardware signal blames it: never
because its rank printed an application error (`blamed_hosts`).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from stallwatch.core import log_patterns
from stallwatch.core.decision import Action, stall_onset
from stallwatch.core.evidence import FRESH_PERIODS, VANISHED_PERIODS
from stallwatch.core.policy import RECOVER_REQUEUE, RECOVER_RESTART, RECOVER_STOP, RECOVER_TAG
from stallwatch.core.resume import RECOVERY_OUTCOME, NoResume, StopRecord, next_attempt, stop_of


class WayBack(StrEnum):
    """How a platform brings a stalled job back."""

    RESUME = "resume"  # after the stop, a new attempt from the checkpoint (opted in by `stallwatch:resume=<N>`)
    RESTART = "restart"  # in place of the stop: restarted on its own healthy nodes
    REQUEUE = "requeue"  # as the stop: requeued by the scheduler, on nodes no health signal blames


# The ways back a `stallwatch:recover` tag opts in to, in place of a plain stop (the values of one grammar).
IN_PLACE = (WayBack.RESTART, WayBack.REQUEUE)
assert (WayBack.RESTART.value, WayBack.REQUEUE.value) == (RECOVER_RESTART, RECOVER_REQUEUE)
# Without `stallwatch:resume` and a policy default, a job that opted in by `stallwatch:recover` may come back this
# often per run.
DEFAULT_RESTARTS = 3
# The audit records of a way back's steps (`action`), one per step (`phase`): a restart in place is an attempt of
# the run from its `restarted` step; a requeue, from its stop decision (whose outcome says so, `RECOVERY_OUTCOME`).
RECOVER_ACTION = "recover"
PHASE_FIELD = "phase"
RESTARTED_PHASE = "restarted"
REQUEUED = "requeued"  # the status a requeue's stop decision records in its outcome's `recovery`
# NVIDIA's Xid catalogue: the codes that mean the GPU needs a reset, a reboot or a replacement; the others (13, 31, 43,
# 45: the application's own faults) say nothing about the node.
HARDWARE_XIDS = {
    48: "double-bit ECC error",
    62: "GPU micro-controller halt",
    64: "row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
    154: "GPU recovery action: reset or reboot required",
    171: "uncorrectable DRAM ECC error",
    172: "uncorrectable SRAM ECC error",
}
BLAME_CHARS = 120  # of a blaming line, in the drain reason and Slack
XID_CODE = re.compile(r"\bXid \([^)]{0,24}\): (\d{1,4})\b")  # the kernel's "NVRM: Xid (PCI:0000:10:1c): 79, ..."


class TagError(ValueError):
    """A way back's tag cannot be taken as it is."""


def recovers(tags: Mapping[str, str], way: WayBack | None) -> bool:
    """Whether the job opted in to its platform's way back in place of a plain stop: `stallwatch:recover=<way>` (any
    case); `stop` or no tag: no. `TagError`, naming what the platform takes, for any other value (another platform's
    way among them)."""
    raw = tags.get(RECOVER_TAG)
    if raw is None:
        return False
    value = raw.strip().lower()
    if value == RECOVER_STOP:
        return False
    if way in IN_PLACE and value == way:
        return True
    takes = f"{way.value} or {RECOVER_STOP}" if way in IN_PLACE else RECOVER_STOP
    raise TagError(f"{RECOVER_TAG}={raw!r}: expected {takes}")


def plan(
    tags: Mapping[str, str], stop: StopRecord, default_max_restarts: int, done: int, before: float | None
) -> tuple[int, int] | NoResume:
    """(the attempt to make, the attempts allowed), or why not: resume's rules (a hang or a crashed rank, the budget,
    progress since the last attempt), with `DEFAULT_RESTARTS` where neither tag nor policy sets a budget.

    `done`: the run's attempts so far, of every way back (`attempts`); `before`: the highest step reached before the
    last."""
    return next_attempt(dict(tags), stop, default_max_restarts or DEFAULT_RESTARTS, done, before)


def stop_of_decision(decision_at: float, diagnosis: str, evidence: Mapping[str, Any]) -> StopRecord:
    """The engine's stop decision as the `StopRecord` the budget reads (its outcome is not known yet)."""
    agent = evidence.get("agent") or {}
    return StopRecord(
        at=decision_at,
        diagnosis=diagnosis,
        step=agent.get("step"),
        stall_onset=stall_onset(dict(evidence)) or decision_at,
        ok=None,
    )


@dataclass(frozen=True)
class Attempt:
    """A way back taken in place (a restart, a requeue), from its audit record: the run's next attempt begins at
    `at`; the stall before it began at `stall_onset`, at step `step`."""

    at: float
    stall_onset: float
    step: float | None


def attempt_of(record: Mapping[str, Any], outcome: Mapping[str, Any] | None) -> Attempt | None:
    """An audit record as an attempt in place: a restart's `restarted` step (unless the restart was refused), or a
    stop decision that requeued the job (unless the requeue could not be sent); None for any other record."""
    outcome = outcome or {}
    if record.get("action") == RECOVER_ACTION and record.get(PHASE_FIELD) == RESTARTED_PHASE:
        if (outcome.get("restart") or {}).get("ok") is False:
            return None
        at, onset = float(record["at"]), record.get("stall_onset")
        return Attempt(at=at, stall_onset=float(onset) if onset is not None else at, step=record.get("step"))
    if record.get("action") == Action.STOP.value and (outcome.get(RECOVERY_OUTCOME) or {}).get("status") == REQUEUED:
        stop = stop_of(dict(record), dict(outcome))
        if stop is None or stop.ok is False:
            return None
        return Attempt(at=stop.at, stall_onset=stop.stall_onset, step=stop.step)
    return None


def attempts(records: Iterable[Mapping[str, Any]], until: float | None = None) -> tuple[int, list[float]]:
    """The run's attempts in place so far (audit records, as `AuditTrail.records` reads them: `record`, `outcome`),
    and the steps the job had reached at its stops and attempts before `until` (None: all), for the budget."""
    done, steps = 0, []
    for item in records:
        record, outcome = item["record"], item.get("outcome")
        attempt = attempt_of(record, outcome)
        done += attempt is not None
        point = attempt or stop_of(record, outcome)
        if point is not None and point.step is not None and (until is None or point.at < until):
            steps.append(point.step)
    return done, steps


def blamed_hosts(
    evidence: Mapping[str, Any],
    hosts: Collection[str],
    period: float,
    now: float,
    faults: Mapping[str, str] | None = None,
) -> dict[str, tuple[str, ...]]:
    """The hosts a hardware signal blames in a decision's evidence, with why: a hardware Xid among its fatal lines, its
    metrics vanished while the others' are fresh (as `core.evidence.vanished` reads them), or the platform's own
    health check's hardware verdict on it (`faults`: `JobFacts.hardware_faults`, HyperPod's health agent). A rank's
    application error (a CUDA assert, an OOM, a traceback, HyperPod's ``XidUserAppError``) blames nobody: its node is
    never drained or replaced for it."""
    per_host = {h: found for h, found in (evidence.get("hosts") or {}).items() if h in hosts}
    newest = {h: found.get("newest_data_t") for h, found in per_host.items()}
    fresh = any(t is not None and now - t <= FRESH_PERIODS * period for t in newest.values())
    blamed: dict[str, tuple[str, ...]] = {}
    for host, found in sorted(per_host.items()):
        why = [str(e.get("message", ""))[:BLAME_CHARS] for e in found.get("errors") or [] if _hardware_xid(e)][-1:]
        t = newest[host]
        if fresh and t is not None and now - t > VANISHED_PERIODS * period:
            why.append(f"no metric for {(now - t) / 60:.0f} min while the others report")
        if why:
            blamed[host] = tuple(why)
    for host, said in sorted((faults or {}).items()):
        if host in hosts:
            blamed[host] = (*blamed.get(host, ()), said[:BLAME_CHARS])
    return blamed


def _hardware_xid(error: Mapping[str, Any]) -> bool:
    """An Xid fatal line of a hardware code (or of none named: "GPU has fallen off the bus")."""
    if error.get("pattern") != log_patterns.XID:
        return False
    code = XID_CODE.search(str(error.get("message", "")))
    return code is None or int(code.group(1)) in HARDWARE_XIDS
