"""The decision engine: is this job stalled, and what may Stallwatch do about it? Pure: no I/O, no clock.

    decision = decide(signals, policy.for_job(signals.facts.tags), state, now)
    ...  # the caller stops, alerts or audits per decision.action
    state = next_state(state, decision)

With the agent, progress decides (Steps, Step, LastStepAge) and utilization, power and logs corroborate.
Without it, or once its metrics vanish, host GPU utilization and log silence decide, as TII did.
What it measures in the signals (step interval, log silence, utilization runs, error lines) is in `measures`.
A lone signal waits its full threshold; independent signals that agree decide after `agreement_fraction` of it (the
evidence ladder, docs/engine.md). The job's cadence (step interval, longest log gap) is learned across decisions and
kept in `JobState`.
The rules are in `diagnosis` (with `progress_rules` and `silence_rules` over `findings`), the words in `reasons`, and
what each mode allows in `mode`; this module holds the public API and what a job's state learns between decisions.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from stallwatch.core import evidence, measures, stack_dumps
from stallwatch.core.decision import STALLS, Action, Decision, Diagnosis, JobState, stall_onset
from stallwatch.core.diagnosis import diagnose, dump_lines
from stallwatch.core.findings import Deadlines, Finding
from stallwatch.core.mode import WOULD_STOP, act
from stallwatch.core.policy import EffectivePolicy
from stallwatch.core.signals import JobSignals, JobStatus

SAME_PROGRESS_S = 1.0  # two decisions' last progress this close is the same (read from different datapoints)


def decide(signals: JobSignals, policy: EffectivePolicy, state: JobState, now: float) -> Decision:
    """Diagnose the job and choose the action its mode allows. Pure and deterministic."""
    facts = signals.facts
    found: dict[str, Any] = {"status": facts.status, "secondary_status": facts.secondary_status}
    if facts.notes:  # the platform's own verdict (HyperPod's), in the decision and its alert
        found["platform_notes"] = list(facts.notes)
    if policy.tag_errors:
        found["tag_errors"] = list(policy.tag_errors)
    past_limit = facts.ends_by is not None and now >= facts.ends_by  # the platform ends it itself (Slurm's --time)
    if facts.status is not JobStatus.RUNNING or past_limit:
        reason = f"job is {facts.status}" if not past_limit else "past its time limit: the platform ends it"
        return Decision(
            job=facts.name,
            at=now,
            diagnosis=Diagnosis.FINISHED,
            action=Action.NONE,
            mode=policy.mode,
            reasons=(reason, *facts.notes),
            evidence=found | ({"ends_by": facts.ends_by} if past_limit else {}),
        )
    limits = measures.Limits.of(policy.thresholds, state.threshold_factor, measures.agent_window(signals.agent))
    deadlines = Deadlines(now)
    finding, cadence = diagnose(signals, policy.thresholds, limits, state, now, found, deadlines)
    if finding.stoppable:
        state = _resumed_warning(state, finding.diagnosis, found)
    if finding.diagnosis in STALLS:
        finding = _with_stacks(finding, signals, found, state)
    action, would, notes, stop_at = act(finding, policy, state, now, limits)
    if finding.diagnosis is Diagnosis.STRAGGLER and found["straggler"]["host"] in state.stragglers:
        action, would = Action.NONE, Action.NONE  # a host is named once a run; the evidence still says it lags
    deadlines.add(stop_at)
    return Decision(
        job=facts.name,
        at=now,
        diagnosis=finding.diagnosis,
        action=action,
        mode=policy.mode,
        reasons=finding.reasons + notes + facts.notes,
        evidence=found,
        would=would,
        stoppable=finding.stoppable,
        cadence=cadence,
        recheck_at=deadlines.first(),
    )


def _with_stacks(finding: Finding, signals: JobSignals, found: dict[str, Any], state: JobState) -> Finding:
    """A stall's finding with where every rank is, from the agent's dumps since the last progress (`core.stack_dumps`):
    the odd rank out, or one line saying why no dump tells."""
    report = stack_dumps.explain(
        stack_dumps.latest(dump_lines(signals), stall_onset(found, state.stall_since)), signals.has_agent
    )
    found["stacks"] = report.evidence()
    return replace(finding, reasons=(*finding.reasons, report.summary))


def next_state(state: JobState, decision: Decision) -> JobState:
    """What to remember after acting on `decision`: the incident's start, warning, stop and alerts, the cadence
    learned so far (a log gap only ever grows: one the job came back from stays normal) and when to look again."""
    if decision.diagnosis is Diagnosis.FINISHED:
        return state
    learned = decision.cadence
    pauses = measures.Pauses(state.busy_pause_s, state.idle_pause_s).merged(
        measures.Pauses(learned.busy_pause_s, learned.idle_pause_s)
    )
    gaps = [g for g in (state.log_gap_s, learned.log_gap_s) if g is not None]
    seen = evidence.bursts([*state.deaths, *decision.evidence.get("words_t", ())])
    state = state.with_(
        step_interval_s=learned.step_interval_s if learned.step_interval_s is not None else state.step_interval_s,
        log_gap_s=max(gaps, default=None),
        busy_pause_s=pauses.busy_s,
        idle_pause_s=pauses.idle_s,
        recheck_at=decision.recheck_at,
        deaths=tuple(t for t in seen if t >= decision.at - evidence.CRASH_LOOP_WINDOW_S),
    )
    if decision.diagnosis is Diagnosis.STRAGGLER and decision.action is not Action.NONE:
        state = state.with_(stragglers=(*state.stragglers, decision.evidence["straggler"]["host"]))
    warning = _kept_warning(state, decision.evidence)
    if decision.diagnosis in (Diagnosis.HEALTHY, Diagnosis.PHASE):
        state = _learn_recovery(state, decision)
        return JobState(
            snoozed_until=state.snoozed_until,
            threshold_factor=state.threshold_factor,
            step_interval_s=state.step_interval_s,
            log_gap_s=state.log_gap_s,
            step_gap_s=state.step_gap_s,
            busy_pause_s=state.busy_pause_s,
            idle_pause_s=state.idle_pause_s,
            recheck_at=state.recheck_at,
            stragglers=state.stragglers,
            deaths=state.deaths,
            warning=warning,
        )
    alerted = state.alerted
    if decision.action is not Action.NONE:
        keys = [decision.diagnosis.value]
        if decision.would is Action.STOP:
            keys.append(WOULD_STOP)
        alerted += tuple(k for k in keys if k not in alerted)
    snoozed = state.snoozed_until is not None and state.snoozed_until > decision.at
    if not decision.stoppable:
        return state.with_(stall_since=None, stall_from=None, warned_at=None, alerted=alerted, warning=warning)
    state = _resumed_warning(state, decision.diagnosis, decision.evidence)
    warned_at = decision.at if decision.action is Action.WARN else state.warned_at
    if decision.action is Action.WARN:
        mark = _stall_mark(decision.evidence)
        warning = None if mark is None else (decision.diagnosis.value, mark, decision.at)
    return state.with_(
        stall_since=state.stall_since if state.stall_since is not None else decision.at,
        stall_from=state.stall_from if state.stall_since is not None else _last_progress(decision),
        # A snooze voids an earlier warning: when it ends, a fresh warning comes before any stop.
        warned_at=None if snoozed else warned_at,
        warning=None if snoozed else warning,
        alerted=alerted,
        stopped_at=decision.at if decision.action is Action.STOP else state.stopped_at,
    )


def _last_progress(decision: Decision) -> float | None:
    """The last progress a decision saw: the agent's last step while it reports, else the newest log line."""
    agent = decision.evidence.get("agent", {})
    if agent.get("fresh") and agent.get("last_step_t") is not None:
        return agent["last_step_t"]
    return decision.evidence.get("logs", {}).get("last_t")


def _stall_mark(evidence: dict[str, Any]) -> float | None:
    """What marks one stall: the agent's last step (known once its metrics stopped too), else the newest log line.
    A decision that sees a later one saw progress."""
    last_step = evidence.get("agent", {}).get("last_step_t")
    return last_step if last_step is not None else evidence.get("logs", {}).get("last_t")


def _kept_warning(state: JobState, evidence: dict[str, Any]) -> tuple[str, float, float] | None:
    """The incident's warning, while the decision saw no progress since it."""
    mark = _stall_mark(evidence)
    if state.warning is None or mark is None or abs(mark - state.warning[1]) > SAME_PROGRESS_S:
        return None
    return state.warning


def _resumed_warning(state: JobState, diagnosis: Diagnosis, evidence: dict[str, Any]) -> JobState:
    """A warning withdrawn by a decision that lost sight of its evidence (a metric late, a tail cut short) and the
    same diagnosis found again with no progress since: the warning stands, and its grace runs on."""
    warning = _kept_warning(state, evidence)
    if state.warned_at is not None or warning is None or warning[0] != diagnosis.value:
        return state
    return state.with_(warned_at=warning[2], stall_from=state.stall_from or warning[1])


def _learn_recovery(state: JobState, decision: Decision) -> JobState:
    """A warned stall the job came back from was normal for it: remember its length (at most the time from the last
    progress before it to this decision), so the same stall is not warned again. Steps with the agent, logs without."""
    if state.warned_at is None or state.stall_from is None or decision.diagnosis is not Diagnosis.HEALTHY:
        return state
    gap = decision.at - state.stall_from
    if decision.evidence.get("agent", {}).get("fresh"):
        return state.with_(step_gap_s=max(gap, state.step_gap_s or 0.0))
    return state.with_(log_gap_s=max(gap, state.log_gap_s or 0.0))


def sweeper_due(
    state: JobState, incident_open: bool, last_decision_at: float | None, now: float, checkup_s: float
) -> bool:
    """The watchdog's rule for deciding a job without an alarm: an open incident, a warning waiting to become a stop,
    a snooze that has run out, a recheck the engine asked for (a lone signal reaching its full threshold, which no
    alarm announces), or a check-up once the last decision is `checkup_s` old (stragglers and slowdowns raise no
    alarm; 0: never)."""
    snooze_expired = state.snoozed_until is not None and state.snoozed_until <= now
    recheck = state.recheck_at is not None and state.recheck_at <= now
    checkup = checkup_s > 0 and last_decision_at is not None and now - last_decision_at >= checkup_s
    return incident_open or state.warned_at is not None or snooze_expired or recheck or checkup
