"""What Stallwatch asks a Slurm cluster's runner (deploy/slurm/stallwatch-runner) and what its answers mean. Pure.

The runner runs on the cluster's controller or a login node (ParallelCluster, PCS, HyperPod alike), pulls the
commands of its cluster from the deployment's table, runs only these kinds, each checked against its cluster and, for
a job, its id and submit time (Slurm reuses ids), and answers each with what the controller said:

    cancel   scancel of the running job; done once the controller no longer runs it
    requeue  the job's nodes at fault drained with Stallwatch's reason, then scontrol requeue
    drain    nodes drained with Stallwatch's reason (only nodes the cluster has)
    resume   nodes back in service (only nodes Stallwatch drained: their reason is Stallwatch's)
    report   the controller's view of the jobs the table holds as running, and of their nodes
    ping     the runner answers (doctor)

    command = cancel("pc1", "42", "2026-12-01T10:00:00")
    outcome = stop_outcome(answer)            # StopOutcome, from the runner's answer
    view = View.of_answer(answer)             # the controller's view, from a report's answer
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from stallwatch.core.platforms.interface import StopOutcome

VERSION = 1
CANCEL, REQUEUE, DRAIN, RESUME, REPORT, PING = "cancel", "requeue", "drain", "resume", "report", "ping"
KINDS = frozenset({CANCEL, REQUEUE, DRAIN, RESUME, REPORT, PING})
# What a command's fields may hold: the runner checks the same patterns before it runs anything.
CLUSTER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}\Z")
JOB_ID = re.compile(r"^[0-9]{1,10}\Z")
SUBMIT_TIME = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\Z")
NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
REASON_UNSAFE = re.compile(r"[^A-Za-z0-9 :;,._()=/+-]")
REASON_CHARS = 120  # Stallwatch's reason on a drained node ("stallwatch: " before it)
REASON_PREFIX = "stallwatch: "  # every reason Stallwatch sets; `resume` returns only nodes that carry it
NODES_MAX = 64  # nodes one command names
REPORT_JOBS_MAX = 500  # jobs one report asks about (its answer stays far below DynamoDB's 400 KB item)
# The answers' results.
CANCELLED, REQUEUED, DRAINED, RESUMED, REPORTED, PONG = (
    "cancelled",
    "requeued",
    "drained",
    "resumed",
    "reported",
    "pong",
)
NOTHING_TO_STOP = frozenset({"gone", "other_job"})  # the job ended, or the id is another job's now
NOT_RUNNING = "not_running"  # the job is in a state that is not a stall (pending, suspended...): left alone
DONE = frozenset({CANCELLED, REQUEUED})


class CommandError(ValueError):
    """A command whose field is not one a runner takes; the message names it."""


@dataclass(frozen=True)
class Command:
    """One command for one cluster's runner."""

    kind: str
    cluster: str
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    job_id: str = ""
    submit_time: str = ""
    nodes: tuple[str, ...] = ()
    reason: str = ""
    jobs: tuple[tuple[str, str], ...] = ()  # report: (job id, submit time) of each job the table holds as running

    def __post_init__(self) -> None:
        check(self.as_json())

    def as_json(self) -> dict[str, Any]:
        return {
            "v": VERSION,
            "id": self.id,
            "kind": self.kind,
            "cluster": self.cluster,
            "job_id": self.job_id,
            "submit_time": self.submit_time,
            "nodes": list(self.nodes),
            "reason": self.reason,
            "jobs": [list(job) for job in self.jobs],
        }


def check(data: Mapping[str, Any]) -> None:
    """CommandError unless `data` is a command a runner takes (deploy/slurm/stallwatch-runner checks the same)."""
    kind = data.get("kind")
    if data.get("v") != VERSION or kind not in KINDS:
        raise CommandError(f"kind {kind!r} (version {data.get('v')!r}) is no runner's command")
    if not CLUSTER.match(str(data.get("cluster", ""))):
        raise CommandError(f"cluster {str(data.get('cluster'))[:80]!r} is not a Slurm cluster name")
    named = JOB_ID.match(str(data.get("job_id", ""))) and SUBMIT_TIME.match(str(data.get("submit_time", "")))
    if kind in (CANCEL, REQUEUE) and not named:
        raise CommandError(f"a {kind} names its job by id and submit time as Slurm prints them")
    nodes = data.get("nodes") or []
    if len(nodes) > NODES_MAX or not all(isinstance(n, str) and NODE.match(n) for n in nodes):
        raise CommandError(f"nodes must be at most {NODES_MAX} Slurm node names")
    if kind in (DRAIN, RESUME) and not nodes:
        raise CommandError(f"a {kind} names its nodes")
    reason = str(data.get("reason", ""))
    if REASON_UNSAFE.search(reason) or len(reason) > REASON_CHARS:
        raise CommandError(f"reason: at most {REASON_CHARS} of letters, digits, spaces and :;,._()=/+-")
    jobs = data.get("jobs") or []
    if len(jobs) > REPORT_JOBS_MAX or not all(
        len(job) == 2 and JOB_ID.match(str(job[0])) and SUBMIT_TIME.match(str(job[1])) for job in jobs
    ):
        raise CommandError(f"jobs: at most {REPORT_JOBS_MAX} (job id, submit time) pairs")


def reason_text(text: str) -> str:
    """`text` as a drain reason may hold it (what the runner takes)."""
    return REASON_UNSAFE.sub("-", text)[:REASON_CHARS]


def cancel(cluster: str, job_id: str, submit_time: str) -> Command:
    return Command(CANCEL, cluster, job_id=job_id, submit_time=submit_time)


def requeue(cluster: str, job_id: str, submit_time: str, nodes: Iterable[str], reason: str) -> Command:
    return Command(
        REQUEUE, cluster, job_id=job_id, submit_time=submit_time, nodes=tuple(nodes), reason=reason_text(reason)
    )


def report(cluster: str, jobs: Iterable[tuple[str, str]]) -> Command:
    return Command(REPORT, cluster, jobs=tuple(sorted(set(jobs)))[:REPORT_JOBS_MAX])


def ping(cluster: str) -> Command:
    return Command(PING, cluster)


def stop_outcome(answer: Mapping[str, Any]) -> StopOutcome:
    """What the runner's answer to a cancel or requeue says of the stop: done once the controller no longer runs the
    job (cancelled, or requeued with the nodes drained), nothing to stop, left alone in a state that is not a stall,
    or the failure with the controller's words."""
    result, state = str(answer.get("result", "")), str(answer.get("state", ""))
    drained = ",".join(answer.get("drained") or [])
    if result in DONE:
        said = f"{result} ({state or 'ended'})" + (f"; {drained} drained" if drained else "")
        return StopOutcome(ok=True, detail=said, state=state)
    if result in NOTHING_TO_STOP:
        return StopOutcome(ok=True, detail=f"nothing to stop: {result.replace('_', ' ')}", state=state)
    if result == NOT_RUNNING:
        return StopOutcome(ok=True, detail=f"left alone: the job is {state}, not a stall", state=state, held=True)
    detail = str(answer.get("detail", ""))[:300]
    return StopOutcome(
        ok=False,
        detail=f"{result or 'no result'}: the job is {state or 'unknown'}" + (f" ({detail})" if detail else ""),
    )


# ---- the controller's view (a report's answer) ---------------------------------------------------------------------


@dataclass(frozen=True)
class JobView:
    """One job as the controller showed it: its state, submit time (as Slurm prints it, and in epoch seconds),
    start, restart count and nodes; `state` "" when the controller no longer knows it."""

    job_id: str
    state: str = ""
    submit_time: str = ""
    submit_epoch: int = 0
    start_epoch: float = 0.0
    restarts: int = 0
    nodes: tuple[str, ...] = ()
    reason: str = ""

    @property
    def known(self) -> bool:
        return bool(self.state)


@dataclass(frozen=True)
class NodeView:
    """One node as the controller showed it: its state words (IDLE, ALLOCATED+DRAIN, DOWN*+FAIL...) and reason."""

    name: str
    state: str = ""
    reason: str = ""


@dataclass(frozen=True)
class View:
    """The controller's view of the jobs a report asked about, and of their nodes, at `at`."""

    at: float
    jobs: dict[str, JobView] = field(default_factory=dict)
    nodes: dict[str, NodeView] = field(default_factory=dict)

    @classmethod
    def of_answer(cls, answer: Mapping[str, Any]) -> View:
        """A report's answer (`result` "reported") as a view; ValueError for any other answer."""
        if answer.get("result") != REPORTED:
            raise ValueError(f"not a report's answer: {str(answer.get('result'))[:40]!r}")
        jobs = {}
        for job_id, found in (answer.get("jobs") or {}).items():
            jobs[str(job_id)] = JobView(
                job_id=str(job_id),
                state=str(found.get("state", "")),
                submit_time=str(found.get("submit_time", "")),
                submit_epoch=int(found.get("submit_epoch") or 0),
                start_epoch=float(found.get("start_epoch") or 0),
                restarts=int(found.get("restarts") or 0),
                nodes=tuple(str(n) for n in found.get("nodes") or ()),
                reason=str(found.get("reason", "")),
            )
        nodes = {
            str(name): NodeView(str(name), str(found.get("state", "")), str(found.get("reason", "")))
            for name, found in (answer.get("nodes") or {}).items()
        }
        return cls(at=float(answer.get("at") or 0), jobs=jobs, nodes=nodes)
