"""Slurm jobs as Stallwatch sees them (ParallelCluster, PCS, HyperPod's Slurm): a job is named
``<cluster>-<id>-<name>`` (`slurm_names.slurm_job_name`, as the agent names it), its hosts are its Slurm nodes, its
facts are what deploy/slurm's start and end events said (`SlurmJob`) and what HyperPod says of its nodes, its GPU
metrics the CloudWatch agent's of the node's EC2 instance (``InstanceId``, where a node is one) or else the agent's
own, its logs one stream per node in the Slurm log group, named by the node's instance (`slurm_names.stream_name`).

    job = SlurmJob.of_event(detail)        # deploy/slurm's event, read
    facts = job.facts()                    # JobFacts: hosts, status, settings as tags, the time limit
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import Field

from stallwatch.core.goodput import Category
from stallwatch.core.platforms import cloudwatch_agent
from stallwatch.core.platforms.hyperpod import HARDWARE, HyperPodAction
from stallwatch.core.platforms.interface import (
    MetricMath,
    PlatformDescription,
    PlatformSettings,
    SeriesReader,
    agent_metric,
)
from stallwatch.core.platforms.slurm_names import log_key, parse_stream, slurm_job_name, stream_name
from stallwatch.core.pricing import instance_spec
from stallwatch.core.signals import JobFacts, JobSignals, JobStatus, LogLine, Platform, Series
from stallwatch.core.way_back import WayBack

JOB_NAME = re.compile(r"^[A-Za-z0-9_-]{1,63}\Z")
# Slurm's job states as a `JobStatus`; a job that Slurm holds out of running (pending, suspended, requeued, preempted)
# is paused: never a stall, never stopped.
RUNNING, PAUSED, COMPLETED, FAILED, STOPPED = (
    JobStatus.RUNNING,
    JobStatus.PAUSED,
    JobStatus.COMPLETED,
    JobStatus.FAILED,
    JobStatus.STOPPED,
)
STATUS_OF_STATE = {
    "RUNNING": RUNNING,
    "CONFIGURING": RUNNING,  # its nodes are booting: the startup grace covers it
    "COMPLETING": RUNNING,
    "PENDING": PAUSED,
    "SUSPENDED": PAUSED,
    "REQUEUED": PAUSED,
    "REQUEUE_HOLD": PAUSED,
    "REQUEUE_FED": PAUSED,
    "RESIZING": PAUSED,
    "STOPPED": PAUSED,  # scontrol stop: held, its processes SIGSTOPped
    "COMPLETED": COMPLETED,
    "FAILED": FAILED,
    "NODE_FAIL": FAILED,
    "OUT_OF_MEMORY": FAILED,
    "BOOT_FAIL": FAILED,
    "DEADLINE": FAILED,
    "CANCELLED": STOPPED,
    "TIMEOUT": STOPPED,
    "PREEMPTED": STOPPED,
}
# States Slurm holds a job in that are not stalls: goodput counts each as its own badput (`core.goodput`).
NOT_STALLS = frozenset({"PENDING", "SUSPENDED", "REQUEUED", "PREEMPTED", "TIMEOUT"})
HELD_RECHECK_S = 1800.0  # a held answer (SUSPENDED) is believed this long unless the controller says again
LEFT_TO_HYPERPOD = "LEFT_TO_HYPERPOD"  # the job's status while HyperPod acts on its nodes or restarts it
HYPERPOD_KEPT = 16  # of HyperPod's words about an attempt, the newest kept
# Slurm's states that are not stalls, as goodput counts them: each its own badput.
HELD_CATEGORIES = {
    "PENDING": Category.PENDING,
    "SUSPENDED": Category.SUSPENDED,
    "STOPPED": Category.SUSPENDED,
    "PREEMPTED": Category.PREEMPTED,
    "REQUEUED": Category.REQUEUED,
    "TIMEOUT": Category.TIME_LIMIT,
}
UNLIMITED = frozenset({"UNLIMITED", "INFINITE", "NOT_SET", "INVALID", "PARTITION_LIMIT", "N/A", ""})
# Where a job's settings are, and what its actions need (`JobFacts.platform_ids`).
CLUSTER, JOB_ID, SUBMIT_TIME, SUBMIT_EPOCH, SSM_TARGET, FLAVOR, RESTARTS = (
    "cluster",
    "job_id",
    "submit_time",
    "submit_epoch",
    "ssm_target",
    "flavor",
    "restarts",
)
HYPERPOD = "hyperpod"  # STALLWATCH_PLATFORM on HyperPod: the nodes a requeue drained are then replaced
LOG_GROUP_PART = "slurm"  # Slurm jobs' logs: the group of this name under the training nodes' group


def slurm_log_group(nodes_group: str) -> str:
    """Where Slurm jobs' logs are (deploy/slurm/cloudwatch-agent.json): under the training nodes' group, which their
    instance policy writes and the functions read."""
    return f"{nodes_group.rstrip('/')}/{LOG_GROUP_PART}"


class SlurmSettings(PlatformSettings):
    """`platforms.slurm`: off until a Slurm cluster reports to this deployment (docs/deploy.md, "Slurm clusters")."""

    monitor: bool = Field(
        False,
        description="Watch Slurm jobs, as deploy/slurm's PrologSlurmctld posts them (docs/deploy.md): the Slurm "
        "bus and rules, their grants and the controller's policy exist only if true. Off until a cluster is set up.",
    )
    log_subscription: bool = Field(
        True, description="Subscribe the Slurm jobs' group under the EC2 group (the stack creates it)."
    )


def time_limit_seconds(text: str) -> float | None:
    """Slurm's time limit as squeue prints it (``[days-]hours:minutes:seconds``, ``minutes:seconds``, ``UNLIMITED``)
    in seconds; None for no limit."""
    text = text.strip()
    if text.upper() in UNLIMITED:
        return None
    days, _, clock = text.rpartition("-")
    parts = clock.split(":")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in [*parts, *([days] if days else [])]):
        raise ValueError(f"not a Slurm time limit: {text!r}")
    if len(parts) == 1:  # minutes
        parts = [*parts, "0"]
    if len(parts) == 2 and not days:  # minutes:seconds
        parts = ["0", *parts]
    elif len(parts) == 2:  # days-hours:minutes
        parts = [*parts, "0"]
    hours, minutes, seconds = (int(p) for p in parts)
    return float(int(days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds)


def end_state(job_state: str, reason: str, exit_code: str) -> str:
    """How an attempt ended, from its end event: the state the epilog read once it returned (COMPLETED, CANCELLED,
    REQUEUED...), else, where it could only read COMPLETING (no `setsid`), the state its reason and exit code say."""
    if job_state and job_state != "COMPLETING":
        return job_state
    if reason == "TimeLimit":
        return "TIMEOUT"
    if reason == "NonZeroExitCode" or exit_code.split(":")[0] not in ("", "0"):
        return "FAILED"
    return "COMPLETED"


def node_of_stream(facts: JobFacts, stream: str) -> str | None:
    """The job's node whose stream `stream` is: the stream names the job's log key, one of its nodes, and that
    node's own EC2 instance (the job's start mapped it). A stream that names another job, a node not the job's, or
    another instance than the node's (another node's role wrote it) is none of the job's: it makes no decision."""
    found = parse_stream(stream)
    if found is None or found.key != log_key(facts.platform_ids.get(CLUSTER, ""), facts.platform_ids.get(JOB_ID, "")):
        return None
    instance = facts.host_instances.get(found.node)
    return found.node if instance is not None and instance == found.instance else None


def job_streams(facts: JobFacts) -> list[str]:
    """The job's streams: one per node whose instance is known (a node whose instance is not is never read)."""
    key = log_key(facts.platform_ids.get(CLUSTER, ""), facts.platform_ids.get(JOB_ID, ""))
    return [
        stream_name(facts.host_instances[node], key, node)
        for node in facts.instance_ids
        if node in facts.host_instances
    ]


@dataclass(frozen=True)
class SlurmNode:
    """One node of the job as the start event names it, and the EC2 instance behind it (where there is one)."""

    name: str
    addr: str = ""
    gpus: int = 0
    instance: str | None = None
    instance_type: str | None = None


@dataclass(frozen=True)
class SlurmJob:
    """One attempt of a Slurm job (a requeue starts the next, with a new submit time), as its events said."""

    cluster: str
    job_id: str
    name: str
    submit_time: str  # as Slurm prints it (the controller's local time): the runner checks it
    submit_epoch: int
    start_epoch: float
    state: str  # Slurm's word: CONFIGURING, RUNNING at its start; COMPLETED, CANCELLED, REQUEUED... at its end
    restarts: int = 0
    user: str = ""
    partition: str = ""
    nodes: tuple[SlurmNode, ...] = ()
    settings: dict[str, str] = field(default_factory=dict)  # stallwatch:NAME -> value (its comment, the defaults)
    time_limit_s: float | None = None
    ssm_target: str = ""
    flavor: str = "slurm"  # parallelcluster, pcs, hyperpod or slurm
    ended_epoch: float | None = None
    reason: str = ""  # Slurm's reason at its end (TimeLimit, NonZeroExitCode, ...)
    # A state that is not a stall the controller answered a stop with (SUSPENDED): the job is not stopped while it is
    # believed (`HELD_RECHECK_S` from the answer), then asked again by the next stop.
    held_state: str = ""
    held_since: float | None = None
    held_checked: float | None = None
    held_until: float | None = None  # the controller said it runs again
    # What HyperPod said it does about the job's nodes or the job (`core.platforms.hyperpod`), newest last.
    hyperpod: tuple[HyperPodAction, ...] = ()

    @property
    def job_name(self) -> str:
        return slurm_job_name(self.cluster, self.job_id, self.name)

    @property
    def log_key(self) -> str:
        return log_key(self.cluster, self.job_id)

    @classmethod
    def of_event(cls, detail: Any) -> SlurmJob:
        """The attempt as a start event (`aws.platforms.slurm_events.SlurmJobDetail`) describes it."""
        return cls(
            cluster=detail.cluster,
            job_id=detail.job_id,
            name=detail.name,
            submit_time=detail.submit_time,
            submit_epoch=detail.submit_epoch,
            start_epoch=float(detail.start_epoch or detail.submit_epoch),
            state=detail.job_state or "RUNNING",
            restarts=detail.restarts,
            user=detail.user,
            partition=detail.partition,
            nodes=tuple(SlurmNode(n.name, n.addr, n.gpus) for n in detail.nodes),
            settings=dict(detail.settings),
            time_limit_s=time_limit_seconds(detail.time_limit),
            ssm_target=detail.ssm_target,
            flavor=detail.platform,
        )

    def ended(self, state: str, at: float, reason: str = "") -> SlurmJob:
        return replace(self, state=state, ended_epoch=at, reason=reason)

    def with_instances(self, instances: dict[str, tuple[str, str]]) -> SlurmJob:
        """The nodes with their EC2 instance (id, type), by node name (`instances`: node -> (id, type))."""
        nodes = tuple(
            replace(n, instance=instances[n.name][0], instance_type=instances[n.name][1]) if n.name in instances else n
            for n in self.nodes
        )
        return replace(self, nodes=nodes)

    @property
    def status(self) -> JobStatus:
        return STATUS_OF_STATE.get(self.state, RUNNING if self.ended_epoch is None else FAILED)

    def held(self, state: str, now: float) -> SlurmJob:
        """The attempt as the controller found it at `now`: in `state`, which is not a stall."""
        going_on = self.held_state == state and self.held_since is not None and self.held_until is None
        since = self.held_since if going_on else now
        return replace(self, held_state=state, held_since=since, held_checked=now, held_until=None)

    def released(self, now: float) -> SlurmJob:
        """The attempt as the controller found it at `now`: running again after a hold."""
        if not self.held_state or self.held_until is not None:
            return self
        return replace(self, held_until=now)

    def held_at(self, now: float) -> str | None:
        """The state that is not a stall the attempt is believed in at `now`, if any."""
        if self.ended_epoch is not None or not self.held_state or self.held_checked is None:
            return None
        if self.held_until is not None:
            return None
        return self.held_state if now - self.held_checked < HELD_RECHECK_S else None

    def held_spans(self, now: float) -> tuple[tuple[float, float, str], ...]:
        """The attempt's time in states that are not stalls, as (start, end, state): held as the controller said
        (until it said the job runs again, the attempt ended or the answer lapsed), and past its time limit (until
        Slurm ended it)."""
        end = self.ended_epoch if self.ended_epoch is not None else now
        spans = []
        if self.held_state and self.held_since is not None and self.held_checked is not None:
            until = self.held_until if self.held_until is not None else self.held_checked + HELD_RECHECK_S
            spans.append((self.held_since, min(end, until), self.held_state))
        if self.time_limit_s is not None and self.start_epoch + self.time_limit_s < end:
            spans.append((self.start_epoch + self.time_limit_s, end, "TIMEOUT"))
        return tuple((a, b, state) for a, b, state in spans if b > a)

    def with_hyperpod(self, found: HyperPodAction) -> SlurmJob:
        """The attempt with what HyperPod said it does (a newer word from the same source about the same node
        replaces the older)."""
        same = (found.action, found.node, found.instance, found.source)
        kept = tuple(a for a in self.hyperpod if (a.action, a.node, a.instance, a.source) != same)
        return replace(self, hyperpod=(*kept, found)[-HYPERPOD_KEPT:])

    def left_to_hyperpod(self, now: float) -> HyperPodAction | None:
        """What HyperPod does to the job's nodes or the job now, if anything: the job is HyperPod's meanwhile."""
        return next((a for a in reversed(self.hyperpod) if a.acting_at(now) and a.at >= self.start_epoch), None)

    def facts(self, now: float | None = None) -> JobFacts:
        hosts = tuple(n.name for n in self.nodes)
        types = {n.name: n.instance_type for n in self.nodes if n.instance_type}
        first_type = next(iter(types.values()), "")
        known = first_type and all(types.get(h) == first_type for h in hosts)
        spec = instance_spec(first_type) if known else None
        gpus = spec.devices if spec else max((n.gpus for n in self.nodes), default=0)
        held = self.held_at(now) if now is not None else None
        hyperpod = self.left_to_hyperpod(now) if now is not None and self.ended_epoch is None else None
        if hyperpod is not None:
            held = LEFT_TO_HYPERPOD
        return JobFacts(
            name=self.job_name,
            platform=Platform.SLURM,
            status=PAUSED if held else self.status,
            secondary_status=held or self.state,
            start_time=self.start_epoch,
            instance_type=first_type if known else "",
            instance_count=len(hosts),
            gpus_per_host=gpus,
            vcpus_per_host=spec.vcpus if spec else 1,
            tags=dict(self.settings),
            instance_ids=hosts,
            host_types={} if known else types,
            platform_ids={
                CLUSTER: self.cluster,
                JOB_ID: self.job_id,
                SUBMIT_TIME: self.submit_time,
                SUBMIT_EPOCH: str(self.submit_epoch),
                SSM_TARGET: self.ssm_target,
                FLAVOR: self.flavor,
                RESTARTS: str(self.restarts),
            },
            host_instances={n.name: n.instance for n in self.nodes if n.instance},
            ends_by=None if self.time_limit_s is None else self.start_epoch + self.time_limit_s,
            notes=tuple(a.note() for a in self.hyperpod if a.at >= self.start_epoch),
            hardware_faults={
                a.node: a.note() for a in self.hyperpod if a.verdict == HARDWARE and a.node and a.at >= self.start_epoch
            },
        )


class SlurmDescription(PlatformDescription):
    platform = Platform.SLURM
    label = "Slurm"
    job_kind = "a Slurm job"
    resource = "a Slurm job"
    job_name = JOB_NAME
    settings = SlurmSettings
    configured_logs = True  # under the EC2 group (`slurm_log_group`)
    known_from_events = True  # deploy/slurm's start and end events, kept in the table (`aws.platforms.slurm_jobs`)
    # The agent's NVML utilization stands in where a node is no EC2 instance of the account (HyperPod).
    host_agent_metrics = cloudwatch_agent.AGENT_METRICS_READ
    named_hosts = True
    instance_hosts = True  # ParallelCluster and PCS nodes (`JobFacts.host_instances`); HyperPod's are none
    way_back = WayBack.REQUEUE  # its stop is the requeue, off the nodes a health signal blames (the adapter's)

    def host_of_instance(self, facts: JobFacts, instance: str) -> str | None:
        """The node whose EC2 instance it is (mapped by address when the job started)."""
        return next((node for node, found in facts.host_instances.items() if found == instance), None)

    def log_group(self, nodes_group: str) -> str | None:
        """Under the EC2 group (`slurm_log_group`), one stream per node's output file of a job."""
        return slurm_log_group(nodes_group)

    def hosts(self, instance_count: int, instance_ids: Sequence[str]) -> list[str]:
        """Slurm node names, as SLURMD_NODENAME names them to the agent."""
        return list(instance_ids)

    def gpu_utilization(self, facts: JobFacts, host: str) -> MetricMath:
        instance = metric_instance(facts, host)
        if instance is None:
            return agent_metric(facts, host, "GPUUtilization", "GPU utilization per GPU (the agent's)")
        return cloudwatch_agent.gpu_utilization(instance)

    def gpu_memory(self, facts: JobFacts, host: str) -> MetricMath:
        instance = metric_instance(facts, host)
        if instance is None:
            return agent_metric(facts, host, "GPUMemoryUtilization", "GPU memory used per GPU (the agent's)")
        return cloudwatch_agent.gpu_memory(instance)

    def host_of_stream(self, stream: str, job: str, hosts: Collection[str]) -> str | None:
        """The node a Slurm stream names, if it is one of `hosts` (a trace's; the adapter also checks the job's
        key and the node's instance: `node_of_stream`)."""
        found = parse_stream(stream)
        return found.node if found is not None and found.node in hosts else None

    def host_series(self, facts: JobFacts, host: str, read: SeriesReader) -> dict[str, Series]:
        """A node's EC2 instance's CloudWatch agent series (per device already); none for a node that is no
        instance of the account: the agent's own stand in."""
        instance = metric_instance(facts, host)
        if instance is None:
            return {"gpu_util": Series(), "gpu_mem_util": Series(), "cpu_util": Series(), "gpu_power": Series()}
        return cloudwatch_agent.host_series(instance, read)


SLURM = DESCRIPTION = SlurmDescription()


def metric_instance(facts: JobFacts, host: str) -> str | None:
    """The EC2 instance whose CloudWatch agent metrics are the node's: a ParallelCluster or PCS node's; none on
    HyperPod (its instances are SageMaker's, whose agent metrics the account does not get: the trainer agent's
    stand in)."""
    return None if facts.platform_ids.get(FLAVOR) == HYPERPOD else facts.host_instances.get(host)


# ---- the actions ----------------------------------------------------------------------------------------------

# Where the controller is (the event's `ssm_target`): its EC2 instance (ParallelCluster, PCS: the nodes are matched
# in its VPC), or HyperPod's SSM name of it, sagemaker-cluster:<cluster id>_<instance group>-<instance id>, whose
# cluster id names the HyperPod cluster to SageMaker's node APIs.
EC2_TARGET = re.compile(r"^i-[0-9a-f]{8,17}\Z")
HYPERPOD_TARGET = re.compile(
    r"^sagemaker-cluster:(?P<cluster>[a-z0-9]{12})_(?P<group>[A-Za-z0-9](?:-*[A-Za-z0-9]){0,62})-(?P<instance>i-[0-9a-f]{8,17})\Z"
)


def controller_instance(target: str) -> str | None:
    """The controller's EC2 instance of the account, where the target is one (not on HyperPod)."""
    return target if EC2_TARGET.match(target) else None


def hyperpod_cluster(target: str) -> str | None:
    """The HyperPod cluster id a HyperPod target names; None for any other target."""
    found = HYPERPOD_TARGET.match(target)
    return found["cluster"] if found else None


def this_attempt(signals: JobSignals) -> JobSignals:
    """The job's signals since its attempt began: a requeued job keeps its name, and the earlier attempt's steps,
    GPU series and lines are not this one's (its steps start again from the checkpoint)."""
    since = signals.facts.start_time

    def cut(series: dict[str, Series]) -> dict[str, Series]:
        return {name: s.since(since) for name, s in series.items()}

    def lines(found: tuple[LogLine, ...]) -> tuple[LogLine, ...]:
        return tuple(line for line in found if line.t >= since)

    hosts = {
        name: replace(
            host,
            gpu_util=host.gpu_util.since(since),
            gpu_mem_util=host.gpu_mem_util.since(since),
            cpu_util=host.cpu_util.since(since),
            gpu_power=host.gpu_power.since(since),
            agent=cut(host.agent),
            log_last_t=host.log_last_t if host.log_last_t is not None and host.log_last_t >= since else None,
            log_tail=lines(host.log_tail),
            error_lines=lines(host.error_lines),
            marker_lines=lines(host.marker_lines),
            log_idle=host.log_idle.since(since),
        )
        for name, host in signals.hosts.items()
    }
    return replace(signals, hosts=hosts, agent=cut(signals.agent))
