"""A job's alarms: put when it starts (rendered from the policy after its tags), deleted when it ends.

Alarms are put only for a job the platform says is running now: a late or retried start event of a job that has
ended deletes its alarms instead of bringing them back.

Each platform's adapter reads its own state-change event (`PlatformAdapter.job_change`): a job that starts or ends,
or, where a job's hosts come and go one by one (an EC2 instance's state change concerns its job), a host that ends:
its alarms go, and the job ends with its last host."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from stallwatch.aws.events import JobStateEvent
from stallwatch.aws.observability import logger, metrics
from stallwatch.aws.platforms import platform_of
from stallwatch.aws.source import JobNotFoundError
from stallwatch.aws.store import job_key
from stallwatch.core import alarms, contract
from stallwatch.core.platforms import describe
from stallwatch.core.platforms.interface import Change, JobChange
from stallwatch.core.signals import JobFacts, JobStatus, Platform
from stallwatch.runtime.environment import ConfigurationError, Runtime
from stallwatch.runtime.resume import resume_after_stop
from stallwatch.runtime.run_goodput import run_ended

# A resume that started, or that the sweeper tries again (its give-up posts the run's summary): not over.
RUN_GOES_ON = frozenset({"resumed", "retrying"})
DELETE_ALARMS_LIMIT = 100  # DeleteAlarms names per call
ALARMS_PER_PAGE = 100  # DescribeAlarms MaxRecords
# PutMetricAlarm calls one invocation makes, at its default quota of 3 a second: on_job_state's timeout is 60 s.
ALARMS_PER_INVOCATION = 120


def on_job_state(event: JobStateEvent, rt: Runtime) -> dict[str, Any]:
    """A job started or ended: create or delete its alarms; an ended job's incident is closed, and a job Stallwatch
    stopped is resumed from its checkpoint when its run opted in (`resume.resume_after_stop`); a run that ends has its
    goodput kept for the fleet and posted when it opted in (`run_goodput.run_ended`; a job whose hosts end one by one,
    an EC2 job's, when the last of them has and no resume follows). The platform's adapter reads its event
    (`job_change`)."""
    platform = platform_of(event)
    if not rt.config.watches(platform):
        return {"status": "ignored", "reason": f"platforms.{platform.value}.monitor is false"}
    return apply_change(rt, platform, rt.source(platform).job_change(event))


def apply_change(rt: Runtime, platform: Platform, change: JobChange) -> dict[str, Any]:
    """What a platform said happened to a job (its event, or its own view on the sweeper's schedule), done: a start's
    alarms put, an end's retired (and what follows an end), a host's end."""
    if change.change is Change.IGNORED:
        return {"status": "ignored", "job": change.job, "reason": change.reason}
    if change.change is Change.STARTED:
        return provision_alarms(rt, platform, change.job)
    if change.change is Change.RETIRED:
        return retire_job(rt, platform, change.job, change.state, forget=not change.gone)
    if change.change is Change.ENDED:
        return _job_ended(rt, platform, change)
    return _host_ended(rt, platform, change)


def _job_ended(rt: Runtime, platform: Platform, change: JobChange) -> dict[str, Any]:
    """The job ended: retired, resumed if Stallwatch stopped it, and its run's summary if none follows."""
    name = change.job
    try:  # a job the platform does not know gets nothing written (its alarms, if any, go)
        rt.source(platform).facts(name)
    except JobNotFoundError as exc:
        deleted = delete_job_alarms(rt, platform, name, forget=False)
        return {"status": "not_found", "job": name, "reason": str(exc), "alarms_deleted": deleted}
    retired = retire_job(rt, platform, name, change.state)
    if change.run_goes_on:  # an attempt ended; the next one starts under its name (a Slurm requeue)
        return retired
    if change.stopped:
        retired["resume"] = resume_after_stop(rt, platform, name)
    if retired.get("resume", {}).get("status") not in RUN_GOES_ON:  # the run ends here
        retired |= run_ended(rt, name, change.tags, platform)
    return retired


def _host_ended(rt: Runtime, platform: Platform, change: JobChange) -> dict[str, Any]:
    """One host left the job: its alarms go; the job ends with its last running host. The platform may still show
    the host running just after the event, so the event's word is taken for it."""
    job, host = change.job, change.host
    result = provision_alarms(rt, platform, job, leaving=host, ended=change.state)
    if result["status"] != "retired" or not change.run_may_end:
        return result
    # A resume starts the job's hosts: a cluster's once every one of them has stopped. The run ends when its hosts
    # have ended and no resume follows: its summary is claimed once per start of the job (`run_end`).
    source = rt.source(platform)
    ended = _ended_group(rt, platform, job)
    if change.stopped and (job == host or ended is not None):
        result["resume"] = resume_after_stop(rt, platform, job)
    if ended is not None and result.get("resume", {}).get("status") not in RUN_GOES_ON:
        result |= run_ended(rt, job, ended.tags, platform, ended_run=source.run_end(ended))
    return result


def provision_alarms(
    rt: Runtime,
    platform: Platform,
    name: str,
    leaving: str | None = None,
    ended: str = "",
    budget: int | None = None,
    done: int = 0,
) -> dict[str, Any]:
    """Put the job's alarms as the policy (after its tags) renders them, and delete those it no longer renders (a
    host that left); none for mode off or a job its platform no longer watches (`PlatformDescription.unwatched`). A
    job whose host `leaving` was its last running one is retired (`ended` is that host's state).

    At most `budget` alarms (default `ALARMS_PER_INVOCATION`), from the `done`-th on (PutMetricAlarm's quota is
    3 a second: a 512-host job's 1,539 alarms take more than eight minutes); the job's marker keeps how many are in
    place, and the sweeper puts the rest."""
    try:
        facts = rt.source(platform).facts(name)
    except JobNotFoundError as exc:
        if leaving is not None:
            return retire_job(rt, platform, name, ended)
        return {"status": "not_found", "job": name, "reason": str(exc)}
    if leaving is not None:
        facts = facts.without_host(leaving)
        if facts.status is not JobStatus.RUNNING:
            return retire_job(rt, platform, name, ended)
    if facts.status is not JobStatus.RUNNING:
        deleted = delete_job_alarms(rt, platform, name)
        return {"status": "not_running", "job": name, "reason": f"status {facts.status}", "alarms_deleted": deleted}
    reason = describe(platform).unwatched(facts)
    if reason is not None:
        return {"status": "ignored", "job": name, "reason": reason}
    effective = rt.config.policy.for_job(facts.tags)
    tag_errors = [*facts.tag_errors, *effective.tag_errors]
    if tag_errors:
        logger.warning("ignored bad stallwatch tags", extra={"job": name, "errors": tag_errors})
    if not rt.alarm_action_arn:
        raise ConfigurationError("ALARM_ACTION_ARN is not set: the alarms' action is the on_alarm function")
    definitions = alarms.render_alarms(facts, effective, rt.config.alarm_prefix, [rt.alarm_action_arn])
    key = job_key(platform, name)
    stale: list[str] = []
    if not done:  # the first batch: hosts that left the job, or a policy that renders fewer alarms now
        wanted = {d["AlarmName"] for d in definitions}
        stale = [n for n in _alarm_names(rt, _job_prefix(rt, platform, name)) if n not in wanted]
        _delete(rt, stale)
    if not definitions:
        rt.alarm_markers.mark(key, 0, 0, rt.clock())  # nothing to put: the sweeper need not look again
        return {"status": "off", "job": name, "alarms_deleted": len(stale)}
    todo = definitions[done : done + (ALARMS_PER_INVOCATION if budget is None else budget)]
    for definition in todo:
        rt.clients.cloudwatch.put_metric_alarm(**definition)
    put = done + len(todo)
    rt.alarm_markers.mark(key, put, len(definitions), rt.clock())
    metrics.add_metric(name=contract.ALARMS_PUT, unit=MetricUnit.Count, value=len(todo))
    return {
        "status": "alarms_put",
        "job": name,
        "alarms": len(todo),
        "alarms_left": len(definitions) - put,
        "alarms_deleted": len(stale),
        "tag_errors": tag_errors,
    }


def retire_job(rt: Runtime, platform: Platform, name: str, reason: str, forget: bool = True) -> dict[str, Any]:
    """The job ended: delete its alarms and close its open incident (the table is written only for a job it knows;
    `forget`: its alarm marker too, see `delete_job_alarms`)."""
    deleted = delete_job_alarms(rt, platform, name, forget=forget)
    closed = rt.states.close_job(job_key(platform, name), f"job {reason}", rt.clock())
    return {"status": "retired", "job": name, "alarms_deleted": deleted, "incident_closed": closed}


def describe_alarms(rt: Runtime, prefix: str, **filters: Any) -> list[dict[str, Any]]:
    """Stallwatch's metric alarms under `prefix`, 100 a page (DescribeAlarms' most)."""
    paginator = rt.clients.cloudwatch.get_paginator("describe_alarms")
    pages = paginator.paginate(
        AlarmNamePrefix=prefix, AlarmTypes=["MetricAlarm"], PaginationConfig={"PageSize": ALARMS_PER_PAGE}, **filters
    )
    return [a for page in pages for a in page["MetricAlarms"]]


def alarms_in_alarm(rt: Runtime) -> list[dict[str, Any]]:
    """Only the alarms now in ALARM (the sweeper's check for alarms no decision followed), not every alarm."""
    return describe_alarms(rt, rt.config.alarm_prefix, StateValue="ALARM")


def _alarm_names(rt: Runtime, prefix: str) -> list[str]:
    return [a["AlarmName"] for a in describe_alarms(rt, prefix)]


def _job_prefix(rt: Runtime, platform: Platform, name: str) -> str:
    return alarms.job_alarm_prefix(rt.config.alarm_prefix, platform, name)


def _delete(rt: Runtime, names: list[str]) -> None:
    for offset in range(0, len(names), DELETE_ALARMS_LIMIT):
        rt.clients.cloudwatch.delete_alarms(AlarmNames=names[offset : offset + DELETE_ALARMS_LIMIT])


def delete_job_alarms(rt: Runtime, platform: Platform, name: str, forget: bool = True) -> int:
    """Delete every alarm under the job's name prefix; how many there were. `forget` drops the job's alarm marker
    too (a conditional delete); without it, as for a job no platform has, the table is not written to (a marker
    left over runs out with its TTL)."""
    names = _alarm_names(rt, _job_prefix(rt, platform, name))
    _delete(rt, names)
    if forget:
        rt.alarm_markers.forget(job_key(platform, name))
    return len(names)


def _ended_group(rt: Runtime, platform: Platform, job: str) -> JobFacts | None:
    """The job's facts when every host is stopped or terminated (none still stopping), else None."""
    try:
        facts = rt.source(platform).facts(job)
    except JobNotFoundError:
        return None
    return facts if facts.status is JobStatus.STOPPED else None
