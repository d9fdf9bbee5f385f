"""Recover in place, EC2's way back (`Ec2Platform.way_back`): a stalled job tagged `stallwatch:recover=restart` is
restarted on its own instances, within the run's budget (`core.way_back`, which the runtime applies).

    result = begin(ctx, attempt)            # a stop decision's attempt: the health check sent, the recovery claimed
    reports = continue_recoveries(ctx, now)  # the sweeper: each recovery's next step

The engine's stop decision (on_alarm or the sweeper) sends Stallwatch's health-check document to every node through
SSM Run Command and claims the recovery, once per stall, with its audit record. SSM answers asynchronously, so no
Lambda waits: each sweep reads what the nodes answered and takes the next step (`core.platforms.ec2_recovery`
decides it):

- every node healthy: the restart document (`systemctl restart stallwatch-train.service`) on all of them;
- a bad node in an Auto Scaling group: marked unhealthy, and the restart once its replacement runs (bounded);
- a bad node outside one: stopped, and the restart on the others, if the job can train on fewer nodes
  (`stallwatch:min-nodes`);
- then the first step after the restart: Slack hears how long it took, and the job is watched anew.

A move off a host an AWS Health event names (`attempt.moving`) takes the host out as a bad node, without the check.
Whatever cannot be recovered (a command SSM cannot deliver, a bad node the job cannot lose, a replacement that never
runs, a restart that fails or brings no step) is stopped as without recovery, and Slack hears why (`Teller`). Each
step is claimed on the recovery with its own audit record, so overlapping sweeps take it once; a restart sent by a
Lambda that died before recording it is found by its comment, so the training restarts once.

Kept whole (over 500 lines): one state machine whose steps share the recovery's claim, hold, fall-back and
Slack helpers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from stallwatch.aws import actions, autoscaling, ssm
from stallwatch.aws.audit_trail import AuditTrail
from stallwatch.aws.clients import AwsClients
from stallwatch.aws.job_states import JobStates
from stallwatch.aws.observability import logger, metrics
from stallwatch.aws.platforms.ec2_recoveries import (
    CHECKING,
    ENDED,
    RECOVERING,
    REPLACING,
    RESTARTED,
    RESTARTING,
    STOPPED,
    Claim,
    Recoveries,
    Recovery,
)
from stallwatch.aws.source import JobNotFoundError
from stallwatch.aws.ssm import Documents
from stallwatch.aws.store import Store, job_key
from stallwatch.core import contract
from stallwatch.core.command_answers import NodeCheck, NodeState, command_states
from stallwatch.core.config import SWEEPER_TIMEOUT_SECONDS, StallwatchConfig
from stallwatch.core.decision import Action
from stallwatch.core.platforms import ec2_recovery as rules
from stallwatch.core.platforms.ec2_recovery import FallBack, Restart, TakeOut, Wait
from stallwatch.core.platforms.interface import PlatformAdapter, Teller, WayBackAttempt, WayBackResult
from stallwatch.core.signals import JobFacts, JobStatus, Series
from stallwatch.core.way_back import PHASE_FIELD, RECOVER_ACTION, RESTARTED_PHASE, TagError

RECOVERIES_PER_SWEEP = 10  # the oldest recoveries under way; a step is one to three calls per 50 nodes
RECOVERIES_READ = 100  # recoveries under way looked through for one job's (`under_way`)
HOLD_SECONDS = SWEEPER_TIMEOUT_SECONDS  # a step's hold outlives the Lambda that takes it
TRIGGER = "recovery"
CHECK, RESTART = "check", "restart"  # what an SSM command's comment says it is
NOT_RECOVERED = "not_recovered"


@dataclass
class RestartContext:
    """What recovery in place works with: the EC2 adapter (`source`: facts, nodes, signals, stop), the deployment's
    clients, config, table and documents, and the runtime's `teller` (Slack and the audit trail)."""

    source: PlatformAdapter
    clients: AwsClients
    config: StallwatchConfig
    store: Store
    documents: Documents
    teller: Teller

    @cached_property
    def recoveries(self) -> Recoveries:
        return Recoveries(self.store)

    @cached_property
    def audit(self) -> AuditTrail:
        return AuditTrail(self.store)

    @cached_property
    def states(self) -> JobStates:
        return JobStates(self.store)


def begin(ctx: RestartContext, attempt: WayBackAttempt) -> WayBackResult:
    """A stop decision's attempt (or a move's): the recovery claimed once per stall and its first step taken (the
    health check sent; a move's hosts taken out), or why not (the job is stopped, or left, as without it)."""
    facts = attempt.facts
    if not (ctx.documents.health_check and ctx.documents.restart):
        return _not_recovered("this deployment has no recovery documents (SSM)")
    if attempt.moving:
        return _move_off(ctx, attempt)
    key = job_key(facts.platform, facts.name)
    claimed = ctx.recoveries.claim(key, attempt.stall_since)
    if claimed is not None:
        return _claimed_before(facts.name, claimed)
    if attempt.refused is not None:
        return _not_recovered(attempt.refused)
    recovery = _recovery(attempt, CHECKING)
    now = attempt.decided_at
    step_sk = ctx.recoveries.start(recovery, _audit(recovery, now, CHECKING), now, now + HOLD_SECONDS)
    if step_sk is None:
        return _claimed_before(facts.name, None)
    held = replace(recovery, held_until=now + HOLD_SECONDS)
    return _send_check(ctx, held, step_sk, now, attempt.reasons)


def under_way(store: Store, key: str) -> bool:
    """Whether a recovery of the job (its key) is under way."""
    return any(r.job_key == key for r in Recoveries(store).under_way(RECOVERIES_READ))


def _recovery(attempt: WayBackAttempt, phase: str) -> Recovery:
    facts = attempt.facts
    return Recovery(
        job_key=job_key(facts.platform, facts.name),
        job=facts.name,
        stall_since=attempt.stall_since,
        decided_at=attempt.decided_at,
        decision_sk=attempt.decision_sk,
        started_at=attempt.decided_at,
        attempt=attempt.attempt,
        allowed=attempt.allowed,
        diagnosis=attempt.diagnosis,
        step=attempt.step,
        stall_onset=attempt.stall_onset,
        nodes=facts.instance_ids,
        types={node: facts.host_types.get(node, facts.instance_type) for node in facts.instance_ids},
        phase=phase,
        phase_at=attempt.decided_at,
        moving=attempt.moving,
    )


def _not_recovered(reason: str) -> WayBackResult:
    return WayBackResult(audited={"status": NOT_RECOVERED, "reason": reason}, reason=reason)


def _claimed_before(job: str, claim: Claim | None) -> WayBackResult:
    """A stall whose recovery was claimed by an earlier decision: under way (nothing more to do here), or over."""
    if claim is not None and claim.status == STOPPED:
        return _not_recovered("its recovery in place fell back to a stop before")
    text = f":stethoscope: `{job}`: its recovery in place is under way (a repeated stop decision; nothing sent)"
    return WayBackResult(audited={"status": "duplicate"}, text=text)


def _send_check(
    ctx: RestartContext, recovery: Recovery, step_sk: str, now: float, reasons: tuple[str, ...]
) -> WayBackResult:
    """The health check to every node; a check SSM cannot deliver ends the recovery here, and the stop goes ahead."""
    try:
        sent = _send_health_check(ctx, recovery)
    except Exception as exc:  # a bug: the stop goes ahead, as for a check that could not be sent
        logger.exception("the health check raised", extra={"job": recovery.job})
        sent = ssm.Sent((), f"{type(exc).__name__}: {exc}")
    outcome = {"health_check": {"commands": list(sent.command_ids), "error": sent.error, "nodes": len(recovery.nodes)}}
    if sent.error:
        reason = f"the health check could not be delivered: {sent.error}"
        ctx.recoveries.finish(recovery, Claim(STOPPED, step=recovery.step, extra={"reason": reason}), now)
        _record(ctx, recovery, step_sk, outcome)
        metrics.add_metric(name=contract.RECOVERY_FALLBACKS, unit=MetricUnit.Count, value=1)
        return _not_recovered(reason)
    checking = replace(recovery, commands=sent.command_ids, held_until=0.0)
    if ctx.recoveries.advance(recovery, checking, now, own_hold=True) is None:
        logger.warning("the recovery moved on while its check was sent", extra={"job": recovery.job})
    _record(ctx, recovery, step_sk, outcome)
    nodes = len(recovery.nodes)
    text = rules.checking_text(recovery.job, recovery.diagnosis, nodes, recovery.attempt, recovery.allowed, reasons)
    audited = {"status": CHECKING, "attempt": recovery.attempt, "nodes": nodes, "commands": list(sent.command_ids)}
    return WayBackResult(audited=audited, text=text)


def _send_health_check(ctx: RestartContext, recovery: Recovery) -> ssm.Sent:
    document, timeout_s = ctx.documents.health_check, rules.HEALTH_DELIVERY_TIMEOUT_S
    return ssm.send(ctx.clients, document, recovery.nodes, _comment(recovery, CHECK), timeout_s)


# ---- a move off a host before its scheduled event (runtime.health) -----------------------------------------------


def _move_off(ctx: RestartContext, attempt: WayBackAttempt) -> WayBackResult:
    """Restart the job in place without the hosts `attempt.blamed` (host -> why: an AWS Health event's instance,
    before its window), as a recovery takes a bad node out: marked unhealthy in its Auto Scaling group (replaced), else
    stopped where the job can train on fewer nodes (`stallwatch:min-nodes`); the restart follows, and its first step,
    as for a stall (the sweeper continues it). A job that cannot lose the hosts is left as it is (`reason`); nothing
    is stopped."""
    facts, now = attempt.facts, attempt.decided_at
    try:
        floor = rules.min_nodes(facts.tags)
    except TagError as exc:
        return _not_moved(str(exc))
    groups = {node.name: node.group for node in ctx.source.nodes(facts.name)}
    checks = {node: NodeCheck(node, NodeState.SUCCEEDED, attempt.blamed.get(node, ())) for node in facts.instance_ids}
    plan = rules.after_checks(checks, groups, floor, deadline_passed=True, what=rules.MOVED_OFF)
    if not isinstance(plan, TakeOut):
        return _not_moved(
            plan.reason if isinstance(plan, FallBack) else "none of its hosts is on the instance any more"
        )
    recovery = _recovery(attempt, REPLACING)
    audit = _audit(recovery, now, attempt.diagnosis) | {
        "out": {node: list(why) for node, why in attempt.blamed.items()}
    }
    if ctx.recoveries.start(recovery, audit, now, now + HOLD_SECONDS) is None:
        return WayBackResult(audited={"job": facts.name, "status": "claimed_elsewhere"})
    held = replace(recovery, held_until=now + HOLD_SECONDS)
    return WayBackResult(audited=_take_out(ctx, held, facts, now, plan, {}, own=True))


def _not_moved(reason: str) -> WayBackResult:
    return WayBackResult(audited={"status": "not_moved", "reason": reason}, reason=reason)


# ---- the sweeper: each recovery's next step ---------------------------------------------------------------------


def continue_recoveries(ctx: RestartContext, now: float) -> list[dict[str, Any]]:
    """Take the next step of each recovery under way (oldest first, `RECOVERIES_PER_SWEEP` a sweep); one that
    fails is logged and counted, and tried again by the next sweep."""
    reports = []
    for recovery in ctx.recoveries.under_way(RECOVERIES_PER_SWEEP):
        if recovery.held_until > now:
            reports.append({"job": recovery.job, "status": "held"})
            continue
        if recovery.phase_at >= now:  # sent by this sweep's own decision: SSM answers by the next one
            reports.append({"job": recovery.job, "status": "sent"})
            continue
        try:
            reports.append(_advance(ctx, recovery, now))
        except Exception as exc:
            logger.exception("could not continue a recovery", extra={"job": recovery.job, "phase": recovery.phase})
            metrics.add_metric(name=contract.SWEEP_ERRORS, unit=MetricUnit.Count, value=1)
            reports.append({"job": recovery.job, "status": "error", "reason": str(exc)})
    return reports


def _advance(ctx: RestartContext, recovery: Recovery, now: float) -> dict[str, Any]:
    if recovery.phase == REPLACING:  # a one-node job has no running node between its node's end and the replacement
        return _await_replacement(ctx, recovery, now)
    try:
        facts = ctx.source.facts(recovery.job)
    except JobNotFoundError:
        facts = None
    running = facts is not None and facts.status is JobStatus.RUNNING
    if recovery.phase == RESTARTING and facts is not None:  # a short run may step, then end, between two sweeps
        return _watch(ctx, recovery, facts, now, running)
    if facts is None or not running:
        return _end(ctx, recovery, now, "the job is no longer running")
    return _after_checks(ctx, recovery, facts, now)


def _after_checks(ctx: RestartContext, recovery: Recovery, facts: JobFacts, now: float) -> dict[str, Any]:
    if not recovery.commands:  # its Lambda died before it sent the check: a health check only reads, send it again
        sent = _send_health_check(ctx, recovery)
        if sent.error:
            return _fall_back(ctx, recovery, now, f"the health check could not be delivered: {sent.error}")
        ctx.recoveries.advance(recovery, replace(recovery, commands=sent.command_ids, phase_at=now), now)
        return {"job": recovery.job, "status": CHECKING, "commands": list(sent.command_ids)}
    waited = now - recovery.phase_at >= rules.HEALTH_CHECK_WAIT_S
    answers = ssm.invocations(ctx.clients, recovery.commands)
    checks = rules.check_nodes(answers, recovery.nodes, recovery.types, waited)
    groups = {node.name: node.group for node in ctx.source.nodes(recovery.job)}
    try:
        floor = rules.min_nodes(facts.tags)
    except TagError as exc:
        logger.warning("ignored a bad min-nodes tag", extra={"job": recovery.job, "error": str(exc)})
        floor = None
    step = rules.after_checks(checks, groups, floor, waited)
    audited = {"checks": _checks_audited(checks)}
    if isinstance(step, Wait):
        pending = sorted(c.node for c in checks.values() if c.state in (NodeState.WAITING, NodeState.RUNNING))
        return {"job": recovery.job, "status": CHECKING, "waiting_for": pending}
    if isinstance(step, FallBack):
        return _fall_back(ctx, recovery, now, step.reason, audited)
    if isinstance(step, Restart):
        text = rules.restarting_text(recovery.job, len(recovery.nodes), len(step.nodes))
        return _restart(ctx, recovery, now, step.nodes, text, audited)
    return _take_out(ctx, recovery, facts, now, step, audited)


def _take_out(
    ctx: RestartContext,
    recovery: Recovery,
    facts: JobFacts,
    now: float,
    step: TakeOut,
    audited: dict[str, Any],
    own: bool = False,
) -> dict[str, Any]:
    """Bad nodes out: marked unhealthy in their group (it replaces them) or stopped; the restart follows on the nodes
    left and the replacements, once they run (at once when nothing is replaced). A move's node that cannot be taken
    out leaves the job running as it was. `own`: this Lambda holds the recovery already."""
    taking = recovery.at_phase(REPLACING, now, keep=step.keep, replaced=tuple(step.replace))
    audit = _audit(recovery, now, "take_out") | {
        "bad": {node: list(why) for node, why in step.bad.items()},
        "stop": list(step.stop),
        "replace": step.replace,
        **audited,
    }
    step_sk = ctx.recoveries.advance(recovery, taking, now, hold_until=now + HOLD_SECONDS, audit=audit, own_hold=own)
    if step_sk is None:
        return {"job": recovery.job, "status": "claimed_elsewhere"}
    held = replace(taking, version=recovery.version + 1, held_until=now + HOLD_SECONDS)
    refused = [error for node in step.replace if (error := autoscaling.mark_unhealthy(ctx.clients, node))]
    stopped = actions.stop(ctx.source, replace(facts, instance_ids=step.stop)) if step.stop else None
    if stopped is not None and not stopped.ok:
        refused.append(stopped.detail)
    outcome = {"unhealthy": list(step.replace), "stopped": stopped.detail if stopped else None, "refused": refused}
    if refused:
        _record(ctx, recovery, step_sk, outcome)
        reason = f"could not take out the bad nodes: {'; '.join(refused)}"
        if recovery.moving:  # a healthy job: it runs on as it was
            return _end(ctx, held, now, reason, own=True, told=True)
        return _fall_back(ctx, held, now, reason, own=True)
    what = rules.MOVED_OFF if recovery.moving else rules.FAILED_CHECK
    _tell(ctx, held, step_sk, rules.taken_out_text(recovery.job, step, rules.REPLACEMENT_WAIT_S, what), outcome, now)
    if step.replace:
        ctx.recoveries.advance(held, replace(held, held_until=0.0), now, own_hold=True)
        return {"job": recovery.job, "status": REPLACING, "bad": sorted(step.bad)}
    return _restart(ctx, held, now, step.keep, None, {}, own=True)


def _await_replacement(ctx: RestartContext, recovery: Recovery, now: float) -> dict[str, Any]:
    """The restart, once the bad nodes are gone and the job is as large as it is to be again (the group's
    replacements running); a stop of the job if that takes longer than `REPLACEMENT_WAIT_S`."""
    try:
        nodes = ctx.source.nodes(recovery.job)
    except JobNotFoundError:
        nodes = []
    running = {node.name for node in nodes if node.running}
    wanted = len(recovery.keep) + len(recovery.replaced)
    if not running & set(recovery.replaced) and len(running) >= wanted:
        joined = sorted(running - set(recovery.nodes))
        text = None
        if joined:
            text = f":arrows_counterclockwise: `{recovery.job}`: {', '.join(joined)} joined; restarting the training "
            text += f"in place on {len(running)} nodes (`{rules.TRAINING_UNIT}`)"
        return _restart(ctx, recovery, now, tuple(sorted(running)), text, {"joined": joined}, waiting=bool(joined))
    if now - recovery.phase_at > rules.REPLACEMENT_WAIT_S:
        left = ", ".join(sorted(recovery.replaced))
        reason = f"the replacement of {left} did not run within {rules.REPLACEMENT_WAIT_S / 60:.0f} min"
        return _fall_back(ctx, recovery, now, reason)
    return {"job": recovery.job, "status": REPLACING, "running": len(running), "wanted": wanted}


def _restart(
    ctx: RestartContext,
    recovery: Recovery,
    now: float,
    nodes: tuple[str, ...],
    text: str | None,
    audited: dict[str, Any],
    own: bool = False,
    waiting: bool = False,
) -> dict[str, Any]:
    """The restart document on `nodes`, once: the step is held while it is sent, and a restart sent by a Lambda that
    died before recording it is found by its comment. `waiting`: a replacement whose agent has not registered yet
    is waited for (within the replacement's wait), not a reason to stop."""
    if not own:
        held = _hold(ctx, recovery, now)
        if held is None:
            return {"job": recovery.job, "status": "claimed_elsewhere"}
        recovery = held
    comment = _comment(recovery, RESTART)
    found = ssm.find_command(ctx.clients, ctx.documents.restart, comment, recovery.phase_at)
    if found:
        sent = ssm.Sent((found,))
    else:
        sent = ssm.send(ctx.clients, ctx.documents.restart, nodes, comment, rules.RESTART_DELIVERY_TIMEOUT_S)
    if sent.error and waiting and not sent.command_ids and "InvalidInstanceId" in sent.error:
        ctx.recoveries.advance(recovery, replace(recovery, held_until=0.0), now, own_hold=True)
        return {"job": recovery.job, "status": REPLACING, "waiting_for": "the replacement's SSM agent"}
    if sent.error:
        return _fall_back(ctx, recovery, now, f"the restart could not be delivered: {sent.error}", own=True)
    restarted = recovery.at_phase(RESTARTING, now, keep=nodes, restarted_at=now)
    restarted = replace(restarted, commands=sent.command_ids, held_until=0.0)
    audit = _audit(recovery, now, RESTARTED_PHASE) | {"nodes": list(nodes), **audited}
    claim = Claim(RECOVERING, step=recovery.step, restarted_at=now)
    step_sk = ctx.recoveries.advance(recovery, restarted, now, audit=audit, claim=claim, own_hold=True)
    if step_sk is None:
        logger.warning("the recovery moved on while its restart was sent", extra={"job": recovery.job})
        return {"job": recovery.job, "status": "claimed_elsewhere"}
    outcome = {"restart": {"ok": True, "commands": list(sent.command_ids), "nodes": len(nodes)}}
    if text is None:
        _record(ctx, recovery, step_sk, outcome)
    else:
        _tell(ctx, recovery, step_sk, text, outcome, now)
    return {"job": recovery.job, "status": RESTARTING, "nodes": len(nodes), "restarted_at": now}


def _hold(ctx: RestartContext, recovery: Recovery, now: float) -> Recovery | None:
    """Take the recovery's next step: held by this Lambda (the recovery as held), or None if another run has it."""
    held = replace(recovery, held_until=now + HOLD_SECONDS)
    if ctx.recoveries.advance(recovery, held, now, hold_until=held.held_until) is None:
        return None
    return replace(held, version=recovery.version + 1)


def _watch(ctx: RestartContext, recovery: Recovery, facts: JobFacts, now: float, running: bool) -> dict[str, Any]:
    """After the restart: the restart commands' answers, then the first step (or, without the agent, log line);
    a job that ended since (`running` False) is reported if it stepped, else its recovery ends quietly."""
    assert recovery.restarted_at is not None
    if running:
        answers = ssm.invocations(ctx.clients, recovery.commands)
        states = command_states(answers, recovery.keep, now - recovery.phase_at >= rules.RESTART_WAIT_S)
        failed = rules.restart_failures(states)
        if failed is not None:
            return _fall_back(ctx, recovery, now, failed)
    signals = ctx.source.job_signals(recovery.job, now)
    period = ctx.config.policy.for_job(facts.tags).thresholds.alarm_period_seconds
    logs = [h.log_last_t for h in signals.hosts.values() if h.log_last_t is not None]
    agent = signals.agent
    progress = rules.first_progress(
        agent.get("Steps", _EMPTY), agent.get("Step", _EMPTY), max(logs, default=None), recovery.restarted_at, period
    )
    if progress is None and not running:
        return _end(ctx, recovery, now, "the job is no longer running")
    if progress is None:
        grace_s = ctx.config.policy.for_job(facts.tags).thresholds.startup_grace_minutes * 60
        if now - recovery.restarted_at > grace_s:
            return _fall_back(ctx, recovery, now, f"no step within {grace_s / 60:g} min of the restart")
        return {"job": recovery.job, "status": "watching", "since_restart_s": round(now - recovery.restarted_at, 1)}
    by, step = progress
    after = max(min(by, now) - recovery.restarted_at, 0.0)
    audit = _audit(recovery, now, "progress") | {"reached_by": by, "first_step": step, "seconds_after_restart": after}
    done = Claim(RESTARTED, step=recovery.step, restarted_at=recovery.restarted_at)
    step_sk = ctx.recoveries.finish(recovery, done, now, audit, own_hold=False)
    if step_sk is None:
        return {"job": recovery.job, "status": "claimed_elsewhere"}
    _release_engine_stop(ctx, recovery, forget_stall=True)
    metrics.add_metric(name=contract.JOBS_RECOVERED, unit=MetricUnit.Count, value=1)
    text = rules.progress_text(recovery.job, step, after)
    _tell(ctx, recovery, step_sk, text, {"first_step": step, "seconds_after_restart": after}, now)
    return {"job": recovery.job, "status": "progressed", "step": step, "seconds_after_restart": after}


def _fall_back(
    ctx: RestartContext,
    recovery: Recovery,
    now: float,
    reason: str,
    audited: dict[str, Any] | None = None,
    own: bool = False,
) -> dict[str, Any]:
    """Stop the job as without recovery, and tell Slack why: the step held, the job stopped, then the recovery ended
    with the stop's own audit record (Stallwatch's stop, for the resume and the goodput report). A stop that fails
    is given back to the engine, whose next decision stops the job as any other (and retries it). `own`: this
    Lambda holds the recovery already."""
    held = recovery if own else _hold(ctx, recovery, now)
    if held is None:
        return {"job": recovery.job, "status": "claimed_elsewhere"}
    try:
        source = ctx.source
        stopped = actions.stop(source, source.facts(recovery.job))
    except JobNotFoundError:
        stopped = actions.StopResult(ok=True, detail="no instance left to stop", stopped=0, targets=0)
    stop_record = {
        "at": now,
        "job": recovery.job,
        "platform": recovery.platform.value,
        "trigger": TRIGGER,
        "action": Action.STOP.value,
        "diagnosis": recovery.diagnosis,
        "reasons": [f"recovery in place: {reason}"],
        "evidence": {"agent": {"step": recovery.step, "last_step_t": recovery.stall_onset}},
        **(audited or {}),
    }
    claim = Claim(STOPPED, step=recovery.step, restarted_at=recovery.restarted_at, extra={"reason": reason})
    step_sk = ctx.recoveries.finish(held, claim, now, stop_record)
    metrics.add_metric(name=contract.RECOVERY_FALLBACKS, unit=MetricUnit.Count, value=1)
    metrics.add_metric(
        name=contract.JOBS_STOPPED if stopped.ok else contract.STOP_FAILURES, unit=MetricUnit.Count, value=1
    )
    if not stopped.ok:
        logger.error("the fallback stop failed; the next decision stops the job", extra={"job": recovery.job})
        _release_engine_stop(ctx, recovery, forget_stall=False)
    outcome = {"stop": {"ok": stopped.ok, "detail": stopped.detail}}
    detail = (stopped.count or stopped.detail) if stopped.ok else f"stop FAILED, will retry: {stopped.detail}"
    if step_sk is not None:
        _tell(ctx, recovery, step_sk, rules.fell_back_text(recovery.job, reason, detail), outcome, now)
    return {"job": recovery.job, "status": STOPPED, "reason": reason, "stopped": stopped.ok}


def _end(
    ctx: RestartContext, recovery: Recovery, now: float, reason: str, own: bool = False, told: bool = False
) -> dict[str, Any]:
    """The job ended otherwise (its own end, a human's stop): the recovery ends quietly; or (`told`) a move that
    could not take its node out ends with the job running, and Slack hears why."""
    audit = _audit(recovery, now, ENDED) | {"reason": reason}
    claim = Claim(ENDED, step=recovery.step, restarted_at=recovery.restarted_at)
    ended = ctx.recoveries.finish(recovery, claim, now, audit, own_hold=own)
    if ended is not None and told:
        text = f":warning: `{recovery.job}`: not moved off: {reason}; it runs on as it was"
        _tell(ctx, recovery, ended, text, {"ended": reason}, now)
    return {"job": recovery.job, "status": ENDED if ended is not None else "claimed_elsewhere", "reason": reason}


def _release_engine_stop(ctx: RestartContext, recovery: Recovery, forget_stall: bool) -> None:
    """Give the job back to the engine: its stop decision no longer stands (`forget_stall`: the stall is over)."""
    stored = ctx.states.load(recovery.job_key)
    if stored.state.stopped_at is None or abs(stored.state.stopped_at - recovery.decided_at) > 1e-3:
        return  # a newer decision (the job healthy again, or its end) has moved the state on already
    if not ctx.states.release_stop(recovery.job_key, stored.state, stored.version, forget_stall=forget_stall):
        logger.info("the engine's state moved on before the recovery gave it back", extra={"job": recovery.job})


# ---- records and Slack ------------------------------------------------------------------------------------------


def _audit(recovery: Recovery, now: float, phase: str) -> dict[str, Any]:
    return {
        "at": now,
        "job": recovery.job,
        "platform": recovery.platform.value,
        "trigger": TRIGGER,
        "action": RECOVER_ACTION,
        PHASE_FIELD: phase,
        "attempt": recovery.attempt,
        "diagnosis": recovery.diagnosis,
        "step": recovery.step,
        "stall_onset": recovery.stall_onset,
        "nodes": list(recovery.nodes),
    }


def _comment(recovery: Recovery, what: str) -> str:
    """An SSM command's comment (100 characters at most): what it is, of which stall, so a lost send can be found."""
    return f"stallwatch {what} {recovery.job} {recovery.stall_since:.0f}"


def _checks_audited(checks: dict[str, NodeCheck]) -> dict[str, Any]:
    return {
        node: {"state": c.state.value, "failures": list(c.failures), **({"detail": c.detail} if c.detail else {})}
        for node, c in checks.items()
    }


def _record(ctx: RestartContext, recovery: Recovery, audit_sk: str, outcome: dict[str, Any]) -> None:
    try:
        ctx.audit.record_outcome(recovery.job_key, audit_sk, outcome)
    except Exception:  # what was done is done; only its record would be missing
        logger.exception("could not record a recovery step", extra={"job": recovery.job, "audit": audit_sk})


def _tell(
    ctx: RestartContext, recovery: Recovery, audit_sk: str, text: str, outcome: dict[str, Any], now: float
) -> None:
    """Post `text` in the recovery's thread and record it with `outcome` on the step's audit record; never raises."""
    try:
        thread = ctx.recoveries.thread_of(recovery)
    except Exception:
        logger.exception("could not read the recovery's Slack thread", extra={"job": recovery.job})
        thread = None
    ctx.teller.tell(recovery.job_key, audit_sk, text, outcome, now, thread)


_EMPTY = Series()
