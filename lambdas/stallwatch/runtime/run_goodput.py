"""A run's end: its goodput measured once, kept for the fleet (the report's records, the dashboard's metrics) and
posted to Slack where the run opted in.

    run_ended(rt, "llama-8b-r1", tags, platform)              # {"goodput": {...}, "summary": {...}}
    run_ended(rt, "llm-70b", tags, platform, ended_run=start)  # a job restarting under its name: once per start

Claimed once per run end like the summary (`goodput`, or `goodput#<run end>`), with the run's record in the same
transaction, so the duplicated end events of a job (an EC2 group's nodes) record and publish it once.
"""

from __future__ import annotations

from typing import Any

from stallwatch.aws.fleet_runs import FleetRuns, publish
from stallwatch.aws.goodput import run_spans
from stallwatch.aws.observability import logger
from stallwatch.aws.store import job_key
from stallwatch.core.fleet import RunRecord
from stallwatch.core.goodput import Goodput, measure_goodput
from stallwatch.core.signals import Platform
from stallwatch.runtime.environment import Runtime
from stallwatch.runtime.summary import post_run_summary

GOODPUT_SK = "goodput"  # the claim on recording a run's end
RUN_GOODPUT_ACTION = "run_goodput"


def run_ended(
    rt: Runtime, name: str, tags: dict[str, str], platform: Platform, ended_run: float | None = None
) -> dict[str, Any]:
    """The job `name` ended and no attempt follows it: its run's goodput kept for the fleet and, where the run opted
    in, posted (`summary.post_run_summary`). `ended_run`: what tells one end of the job from the next where it
    restarts under its name (`PlatformAdapter.run_end`)."""
    recorded, goodput = record_run_end(rt, name, tags, platform, ended_run)
    return {"goodput": recorded, "summary": post_run_summary(rt, name, tags, platform, ended_run, goodput)}


def record_run_end(
    rt: Runtime, name: str, tags: dict[str, str], platform: Platform, ended_run: float | None = None
) -> tuple[dict[str, Any], Goodput | None]:
    """The run's goodput, measured, recorded and published once per run end (the report, the result); a run that
    cannot be measured is logged, never raised (it ended either way)."""
    now = rt.clock()
    key = job_key(platform, name)
    try:
        run, spans = run_spans(rt.clients, rt.store, name, now, platform=platform)
        goodput = measure_goodput(run, spans)
    except Exception as exc:
        logger.exception("could not measure the run's goodput", extra={"job": name})
        return {"status": "failed", "detail": f"{type(exc).__name__}: {exc}"}, None
    record = RunRecord.of(goodput, spans, platform.value, tags)
    audit = {
        "at": now,
        "job": name,
        "platform": platform.value,
        "trigger": "job-state",
        "action": RUN_GOODPUT_ACTION,
        "run": record.run,
        "goodput": goodput.ratio,
        "gpu_hours": record.gpu_hours,
    }
    claim = GOODPUT_SK if ended_run is None else f"{GOODPUT_SK}#{ended_run:017.3f}"
    if rt.audit.claim(key, claim, audit, now, also=[FleetRuns(rt.store).put(record, key, now)]) is None:
        return {"status": "duplicate"}, goodput
    publish(record, now)
    return {"status": "recorded", "goodput": goodput.ratio, "gpu_hours": record.gpu_hours}, goodput
