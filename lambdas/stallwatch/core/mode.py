"""What the mode allows for a finding: enforce warns, then stops after the grace; notify alerts; observe audits; a
snooze holds every stop. Repeats within one incident are silent (`JobState.alerted`)."""

from __future__ import annotations

from stallwatch.core import measures
from stallwatch.core.decision import Action, JobState
from stallwatch.core.findings import Finding
from stallwatch.core.policy import EffectivePolicy, Mode
from stallwatch.core.reasons import minutes

WOULD_STOP = "would_stop"  # `JobState.alerted` marker: observe/notify already recorded "enforce would stop now"


def act(
    finding: Finding, policy: EffectivePolicy, state: JobState, now: float, limits: measures.Limits
) -> tuple[Action, Action, tuple[str, ...], float | None]:
    """(action, would, notes, stop_at): what the mode allows, what enforce would do, why, and when a warned stall
    becomes a stop (the grace: `confirmed_grace_minutes` after conclusive evidence, else `stop_grace_minutes`)."""
    if policy.mode is Mode.OFF or not finding.problem:
        return Action.NONE, Action.NONE, (), None
    grace = limits.confirmed_grace_s if finding.conclusive else limits.grace_s
    snoozed = state.snoozed_until is not None and state.snoozed_until > now
    snooze_note = (f"snoozed until {state.snoozed_until:.0f}",) if snoozed else ()
    until = state.snoozed_until if snoozed else None
    repeat = finding.diagnosis.value in state.alerted
    if policy.mode is Mode.ENFORCE:
        if not finding.stoppable:
            base = Action.AUDIT if snoozed else Action.ALERT
            return (Action.NONE if repeat else base), Action.NONE, snooze_note, until
        if state.stopped_at is not None:
            return Action.NONE, Action.NONE, (f"stop already requested at {state.stopped_at:.0f}",), None
        if snoozed:
            return (Action.NONE if repeat else Action.AUDIT), Action.NONE, snooze_note, until
        if not policy.may_stop:
            note = "not stopping: the job is not tagged stallwatch:mode=enforce"
            return (Action.NONE if repeat else Action.ALERT), Action.NONE, (note,), None
        if state.warned_at is None:
            note = f"will stop in {minutes(grace)} unless it recovers or is snoozed"
            return Action.WARN, Action.NONE, (note,), now + grace
        stop_at = state.warned_at + grace
        if now >= stop_at:
            return Action.STOP, Action.NONE, (f"warned {minutes(now - state.warned_at)} ago and still stalled",), None
        return Action.NONE, Action.NONE, (f"warned; stopping in {minutes(stop_at - now)}",), stop_at
    would, stop_at = Action.ALERT, None
    if finding.stoppable:
        stop_at = None if state.stall_since is None else state.stall_since + grace
        would = Action.STOP if stop_at is not None and now >= stop_at else Action.WARN
        if stop_at is None:
            stop_at = now + grace
    key = WOULD_STOP if would is Action.STOP else finding.diagnosis.value
    base = Action.AUDIT if policy.mode is Mode.OBSERVE or snoozed else Action.ALERT
    return (Action.NONE if key in state.alerted else base), would, snooze_note, until or stop_at
