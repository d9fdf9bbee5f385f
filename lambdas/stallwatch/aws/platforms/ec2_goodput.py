"""An EC2 job's run, for `core.goodput`: one job name is one run, and each start of its instance group is an attempt.

    run, spans = ec2_run_spans(clients, instances, store, "llm-70b", now=time.time(), period=60)   # [JobSpan, ...]

What an attempt is built from (docs/resume.md, "Goodput on EC2"):

- its start: the group's LaunchTime for the latest start (EC2 moves it on every start, so it never shows an earlier
  one); for an earlier attempt, the `launched` time Stallwatch's resume recorded when it restarted the group;
- the attempts of one run: Stallwatch's resumes (audit records whose StartInstances gave the next attempt its
  LaunchTime) link them; a start by anyone else begins a new run, so the report covers the latest run only; a
  restart in place (`core.way_back.attempt_of`) ends one attempt and begins the next on the same instances, no gap;
- its end: Stallwatch's stop of it (EC2 bills no stopping or stopped instance); for the last attempt, now while an
  instance runs, else the stop time EC2 writes in StateTransitionReason, else Stallwatch's stop, else its last
  agent window;
- its stall: Stallwatch's stop within it (the onset from the audit record); its windows: the agent's (CloudWatch);
- its instances: the group as it is now (heterogeneous groups priced per type).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from stallwatch.aws.agent_windows import windows
from stallwatch.aws.store import job_key
from stallwatch.core.goodput import JobSpan
from stallwatch.core.platforms import ec2_clusters as clusters
from stallwatch.core.platforms.interface import AuditTrail
from stallwatch.core.resume import LAUNCHED_FIELD, RESUME_ACTION, StopRecord
from stallwatch.core.signals import Platform
from stallwatch.core.way_back import Attempt, attempt_of

# A resume's audit time and the LaunchTime its StartInstances gives the group: one on_job_state invocation apart.
RESUME_LAUNCH_SLACK_S = 300.0
STOP_TIME = re.compile(r"\((\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) (?:GMT|UTC)\)")  # "User initiated (... GMT)"


@dataclass(frozen=True)
class Resume:
    """Stallwatch's StartInstances of the group (`at`), and when the attempt it ended had started (`launched`)."""

    at: float
    launched: float | None


def ec2_run_spans(
    clients: Any, instances: list[dict[str, Any]], store: AuditTrail | None, job: str, now: float, period: int
) -> tuple[str, list[JobSpan]]:
    """The EC2 job's latest run as `JobSpan`s, one per attempt, from its instances (DescribeInstances)."""
    states = {i["InstanceId"]: i["State"]["Name"] for i in instances}
    hosts = set(clusters.ec2_hosts(states))
    members = [i for i in instances if i["InstanceId"] in hosts]
    key = job_key(Platform.EC2, job)
    stops = [s for s in store.stops(key) if s.ok is not False] if store is not None else []
    records = store.records(key, "audit") if store is not None else []
    starts = attempt_starts(min(i["LaunchTime"].timestamp() for i in members), resumes_of(records))
    # A restart in place ends an attempt (its stall: from the onset to the restart) and begins the next one.
    in_place = [r for r in restarts_in_place(records) if r.at > starts[0]]
    starts = sorted({*starts, *(r.at for r in in_place)})
    stops = sorted(
        [*stops, *(StopRecord(r.at, "", r.step, r.stall_onset, ok=True) for r in in_place)], key=lambda s: s.at
    )
    live = any(states[i["InstanceId"]] in clusters.LIVE_EC2_STATES for i in members)
    layout = clusters.ec2_layout({i["InstanceId"]: i["InstanceType"] for i in members})
    spans = []
    for index, start in enumerate(starts):
        following = starts[index + 1] if index + 1 < len(starts) else None
        if following is not None:
            end: float | None = _stopped_at(stops, start, following)
        else:
            end = now if live else _last_end(members, stops, start)
        found = windows(clients, job, start, end if end is not None else now, period)
        end = end if end is not None else max((w.end for w in found), default=start)
        stop = _last_stop(stops, start, following)
        spans.append(
            JobSpan(
                name=job if index == 0 else f"{job} (restart {index})",
                instance_type=layout.instance_type,
                hosts=layout.instance_count,
                created=start,
                ended=max(end, start),
                windows=found,
                stall=(max(stop.stall_onset, start), stop.at) if stop is not None else None,
                stall_why=stop.why if stop is not None else None,
                fleet=layout.mixed_fleet(),
            )
        )
    return job, spans


def resumes_of(records: list[dict[str, Any]]) -> list[Resume]:
    """Stallwatch's resumes of the job that started its instances, from its audit records, oldest first."""
    found = []
    for item in records:
        record, outcome = item["record"], item.get("outcome") or {}
        if record.get("action") == RESUME_ACTION and (outcome.get("resume") or {}).get("ok") is not False:
            launched = record.get(LAUNCHED_FIELD)
            found.append(Resume(float(record["at"]), None if launched is None else float(launched)))
    return sorted(found, key=lambda r: r.at)


def restarts_in_place(records: list[dict[str, Any]]) -> list[Attempt]:
    """Stallwatch's restarts of the job's training on its own instances (recovery in place), oldest first."""
    found = (attempt_of(item["record"], item.get("outcome")) for item in records)
    return sorted((r for r in found if r is not None), key=lambda r: r.at)


def attempt_starts(latest: float, resumes: list[Resume]) -> list[float]:
    """The starts of the run's attempts, oldest first: the latest start, and before it each attempt Stallwatch's
    resumes restarted, while they link up (a resume without its `launched` time ends the chain there)."""
    starts = [latest]
    for resume in reversed(resumes):
        if resume.at > starts[0] + RESUME_LAUNCH_SLACK_S:
            continue  # a resume whose StartInstances did not start the group (it failed, or was overtaken)
        if resume.at < starts[0] - RESUME_LAUNCH_SLACK_S or resume.launched is None:
            break
        starts.insert(0, resume.launched)
    return starts


def _stopped_at(stops: list[StopRecord], start: float, next_start: float) -> float:
    """When Stallwatch stopped the attempt that a resume at `next_start` followed (its last stop before it)."""
    within = [s.at for s in stops if start < s.at <= next_start]
    return within[-1] if within else next_start


def _last_end(members: list[dict[str, Any]], stops: list[StopRecord], start: float) -> float | None:
    """The stopped group's end: EC2's stop time, else Stallwatch's stop of it; None if neither is known."""
    stopped = [stop_time(i) for i in members]
    known = [t for t in stopped if t is not None and t >= start]
    if known:
        return max(known)
    ours = [s.at for s in stops if s.at > start]
    return ours[-1] if ours else None


def stop_time(instance: dict[str, Any]) -> float | None:
    """When a no-longer-running instance stopped, from its StateTransitionReason; None if it does not say."""
    match = STOP_TIME.search(instance.get("StateTransitionReason") or "")
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp() if match else None


def _last_stop(stops: list[StopRecord], start: float, following: float | None) -> StopRecord | None:
    """Stallwatch's last stop of the attempt (before the `following` one's start)."""
    within = [s for s in stops if start < s.at and (following is None or s.at <= following)]
    return within[-1] if within else None
