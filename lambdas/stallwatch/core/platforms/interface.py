"""The platform seam: what Stallwatch needs of a platform, as one interface and one pure description.

    describe(facts.platform).host_names(facts)           # core.platforms: names, hosts, metrics, log streams
    adapter(facts.platform, clients).stop(facts)         # aws.platforms: the platform's API behind `PlatformAdapter`

A platform is two modules, each with its registry entry: its description (`core.platforms.<name>`, a
`PlatformDescription`: pure data and rules) and its adapter (`aws.platforms.<name>`, a `PlatformAdapter`: facts,
signals, stop, resume, goodput, the sweep's listing, its state-change events). Nothing else names a platform:
callers ask the registries (tests/test_platform_seam.py checks it).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict, Field

from stallwatch.core import contract
from stallwatch.core.doctor_checks import Check, Probe, StackFound
from stallwatch.core.goodput import JobSpan
from stallwatch.core.policy import RECOVER_TAG, STOP_OPT_IN_TAG, STOP_OPT_IN_VALUE
from stallwatch.core.reading import HOST_SERIES_READ, NEURON_AGENT_METRICS_READ
from stallwatch.core.resume import NoResume, ResumePlan, StopRecord
from stallwatch.core.signals import JobFacts, JobSignals, JobStatus, Platform, Series
from stallwatch.core.way_back import IN_PLACE, TagError, WayBack, recovers

# How a description reads one of a host's platform series in replay: (namespace, name, dimensions, divisor) -> series.
SeriesReader = Callable[[str, str, dict[str, str], float], Series]


@dataclass(frozen=True)
class MetricMath:
    """A host's per-device GPU percentage as CloudWatch metric math: the series it reads (id -> namespace, metric
    name, dimensions; their Average) and the expression over them."""

    inputs: dict[str, tuple[str, str, dict[str, str]]]
    expression: str
    label: str


@dataclass(frozen=True)
class InstanceLayout:
    """A job's instances: the primary type (the first group's), the host count, and each host's type where the
    hosts differ."""

    instance_type: str
    instance_count: int
    host_types: dict[str, str] = field(default_factory=dict)

    def mixed_fleet(self) -> dict[str, int]:
        """Instance type -> hosts of it where the hosts differ; empty when all are `instance_type`."""
        return dict(Counter(self.host_types.values()))


class PlatformSettings(BaseModel):
    """A platform's settings, `platforms.<name>` in the deployment's config (`core.config.StallwatchConfig`): whether
    Stallwatch watches its jobs, and whether its log group's fatal lines wake the engine. A platform with settings of
    its own subclasses it (`PlatformDescription.settings`)."""

    model_config = ConfigDict(extra="forbid")

    monitor: bool = Field(True, description="Watch the platform's jobs.")
    log_subscription: bool = Field(
        True,
        description="Send the fatal lines of the platform's log group to on_log_line, where it has one "
        '(docs/deploy.md, "Fatal lines wake the engine").',
    )


class PlatformDescription:
    """One platform as data and pure rules: how it names jobs and hosts, where its host metrics and logs are."""

    platform: ClassVar[Platform]
    label: ClassVar[str]  # "SageMaker": in messages and exported traces
    job_kind: ClassVar[str]  # "a SageMaker job"
    job_name: ClassVar[re.Pattern[str]]  # every name a job of it can have
    # Names that are this platform's before any other's (an instance id is EC2's); None: no such names.
    name_hint: ClassVar[re.Pattern[str] | None] = None
    settings: ClassVar[type[PlatformSettings]] = PlatformSettings  # its sub-model under `platforms:` in the config
    resource: ClassVar[str]  # "a SageMaker training job": what the platform calls a job, in messages
    host_agent_metrics: ClassVar[tuple[str, ...]]  # the agent's per-host series of a GPU job (core.reading)
    host_series_read: ClassVar[int] = HOST_SERIES_READ  # every per-host series a decision reads (`host_period`)
    named_hosts: ClassVar[bool] = False  # its hosts are named by the platform (`JobFacts.instance_ids`), not counted
    # How a stalled job comes back (`core.way_back`): resumed after its stop, restarted in place of it, requeued as it;
    # None: it is stopped, and that is all.
    way_back: ClassVar[WayBack | None] = None
    # Its logs are read from where the deployment's config says (EC2's log group): a reader needs that config.
    configured_logs: ClassVar[bool] = False
    # Its jobs are what their events said, kept in the deployment's table (Slurm's): a reader needs the table.
    known_from_events: ClassVar[bool] = False
    # Its hosts are EC2 instances of the account, or run on them (`host_of_instance`): AWS Health's scheduled events
    # for an instance reach its jobs (`runtime.health`), and those that opted in to its way back in place are moved
    # off the instance by it (`moves_off_hosts`).
    instance_hosts: ClassVar[bool] = False

    def names_job(self, name: str) -> bool:
        return self.job_name.match(name) is not None

    def unwatched(self, facts: JobFacts) -> str | None:
        """Why the job as its facts show it is not one Stallwatch watches (its tags no longer make it one); None
        when it is."""
        return None

    def hosts(self, instance_count: int, instance_ids: Sequence[str]) -> list[str]:
        """The job's hosts as the signals name them."""
        raise NotImplementedError

    def host_names(self, facts: JobFacts) -> list[str]:
        return self.hosts(facts.instance_count, facts.instance_ids)

    def agent_metrics(self, facts: JobFacts) -> tuple[str, ...]:
        """The agent's per-host series a decision of the job reads: a GPU job's (`host_agent_metrics`), a Neuron
        job's (`NEURON_AGENT_METRICS_READ`: its only witnesses), both where the hosts' type is unknown."""
        neuron = facts.neuron()
        if neuron is None:
            return tuple(dict.fromkeys((*self.host_agent_metrics, *NEURON_AGENT_METRICS_READ)))
        return NEURON_AGENT_METRICS_READ if neuron else self.host_agent_metrics

    def utilization(self, facts: JobFacts, host: str) -> MetricMath:
        """The host's accelerator utilization per device, for its gpu-idle alarm: a Neuron host's is the agent's
        (no platform publishes a NeuronCore's), a GPU host's the platform's (`gpu_utilization`)."""
        if facts.neuron():
            return agent_metric(facts, host, "AcceleratorUtilization", "NeuronCore utilization (the agent's)")
        return self.gpu_utilization(facts, host)

    def memory(self, facts: JobFacts, host: str) -> MetricMath:
        """The host's accelerator memory per device, for its gpu-memory alarm (as `utilization`)."""
        if facts.neuron():
            return agent_metric(facts, host, "AcceleratorMemoryUtilization", "NeuronCore memory used (the agent's)")
        return self.gpu_memory(facts, host)

    def gpu_utilization(self, facts: JobFacts, host: str) -> MetricMath:
        """The host's GPU utilization per device, for its gpu-idle alarm."""
        raise NotImplementedError

    def gpu_memory(self, facts: JobFacts, host: str) -> MetricMath:
        """The host's GPU memory per device, for its gpu-memory alarm."""
        raise NotImplementedError

    def host_of_stream(self, stream: str, job: str, hosts: Collection[str]) -> str | None:
        """The host among `hosts` whose log stream `stream` is; None for another job's or no host's."""
        raise NotImplementedError

    def host_series(self, facts: JobFacts, host: str, read: SeriesReader) -> dict[str, Series]:
        """The host's `HostSignals` platform fields, per device, from its raw series as `read` gives them."""
        raise NotImplementedError

    def host_of_instance(self, facts: JobFacts, instance: str) -> str | None:
        """The job's host on the EC2 instance `instance` (an id); None when none of its hosts is on it."""
        return None

    def moves_off_hosts(self, facts: JobFacts) -> bool:
        """Whether the job's tags opt it in to its way back in place (`stallwatch:recover=<way_back>`), which moves
        it off a host an AWS Health event names (a stop opt-in is the runtime's to check; a bad tag value: not)."""
        try:
            return self.way_back in IN_PLACE and recovers(facts.tags, self.way_back)
        except TagError:
            return False

    @property
    def host_move_tags(self) -> str:
        """The tags that opt a job in to being moved off a host, as Slack names them ("" where none can)."""
        if self.way_back not in IN_PLACE:
            return ""
        return f"{STOP_OPT_IN_TAG}={STOP_OPT_IN_VALUE} and {RECOVER_TAG}={self.way_back}"

    def log_group(self, nodes_group: str) -> str | None:
        """The log group its jobs' hosts write to, whose fatal lines a subscription filter sends to on_log_line
        (`PlatformSettings.log_subscription`); None where it has none of its own. `nodes_group`: the deployment's
        group of the training nodes' logs (`StallwatchConfig.ec2_log_group`)."""
        return None


def agent_metric(facts: JobFacts, host: str, metric: str, label: str) -> MetricMath:
    """One of the agent's per-host metrics of the job's `host`, as a host alarm reads it."""
    dims = {contract.DIM_JOB: facts.name, contract.DIM_HOST: host}
    return MetricMath({"m1": (contract.NAMESPACE, metric, dims)}, "m1", label)


@dataclass(frozen=True)
class StopResult:
    """Whether the job is stopped or stopping now, and what the platform said; where a job is several instances,
    how many of them are (`stopped` of `targets`)."""

    ok: bool
    detail: str
    stopped: int | None = None
    targets: int | None = None
    # Where the stop is asynchronous (an SSM command: Slurm's scancel or requeue), the commands whose answers say how
    # it went, read back by the sweeper (`PlatformAdapter.stop_outcome`); `ok` says only that they were sent.
    commands: tuple[str, ...] = ()

    @property
    def count(self) -> str:
        """ "3 of 4 instances stopping", or "" where the platform stops one job."""
        return "" if self.targets is None else f"{self.stopped} of {self.targets} instances stopping"


@dataclass(frozen=True)
class StopOutcome:
    """How an asynchronous stop went, from its commands' answers: the job stopped (or requeued) or not (`ok`), what
    the platform said, and whether the platform held the job in a state that is not a stall (`held`: suspended,
    pending, preempted; nothing was done, and the job is watched again)."""

    ok: bool
    detail: str
    state: str = ""  # the platform's word for the job's state, as the command found it
    held: bool = False


@dataclass(frozen=True)
class ResumeResult:
    """Whether the new attempt was started, what the platform said, and whether a later try may succeed."""

    ok: bool
    detail: str
    code: str = ""  # the error code ("" when started)
    transient: bool = False


@dataclass(frozen=True)
class ResumeVerdict:
    """What a platform makes of resuming a stopped job: the plan (or why not), and what the audit record keeps of
    the stopped attempt (EC2: when its group had started, as each start moves it)."""

    plan: ResumePlan | NoResume
    audit: dict[str, Any] = field(default_factory=dict)


# The run's ways back so far and the steps it had reached at its earlier stalls, before a time (`runtime.way_back`).
RestartHistory = Callable[[float | None], tuple[int, list[float]]]


class Change(StrEnum):
    """What a platform's state-change event says happened to a job."""

    IGNORED = "ignored"  # nothing Stallwatch acts on (`JobChange.reason` says why)
    STARTED = "started"  # the job, or one of its hosts, runs: its alarms are put
    ENDED = "ended"  # the job ended (the platform confirms it first)
    HOST_ENDED = "host_ended"  # one of its hosts ended: its alarms go, and the job's with its last host
    RETIRED = "retired"  # a job the platform no longer knows or watches: its alarms go without a look


@dataclass(frozen=True)
class JobChange:
    """A platform's state-change event, read: what happened to which job. `state` is the platform's word for it."""

    change: Change
    job: str
    state: str
    host: str | None = None  # HOST_ENDED: the host that ended
    stopped: bool = False  # a stop that a resume may follow (SageMaker's Stopped, an EC2 instance stopped)
    run_may_end: bool = False  # HOST_ENDED: a state the job's run may end in (its summary, when no resume follows)
    tags: dict[str, str] = field(default_factory=dict)  # the job's tags as the event carries them
    reason: str = ""  # IGNORED: why
    run_goes_on: bool = False  # ENDED: an attempt ended and the next one follows under its name (Slurm's requeue)
    gone: bool = False  # RETIRED: the platform no longer knows it (or never did): the table is not written for it


@dataclass(frozen=True)
class WayBackAttempt:
    """One attempt of a job's way back in place, as the generic stop or a move off a host asks it of the platform: the
    job, the decision it stands in for, its place in the run's budget (`core.way_back.plan`), and the hosts a health
    signal blames (host -> why; a rank's application error blames none)."""

    facts: JobFacts
    decided_at: float
    decision_sk: str  # the audit record whose Slack message opens the way back's thread
    stall_since: float  # the stall it recovers (the engine's `stall_since`): one way back per stall
    diagnosis: str
    reasons: tuple[str, ...]
    step: float | None  # the step the job had reached
    stall_onset: float
    attempt: int
    allowed: int
    blamed: dict[str, tuple[str, ...]] = field(default_factory=dict)
    moving: bool = False  # a move off the blamed hosts before an AWS Health event's window, not a stall's way back
    refused: str | None = None  # the budget's refusal: the way back is not taken (a repeated decision aside)


@dataclass(frozen=True)
class WayBackResult:
    """What the platform made of a way back: under way in place of the stop (`text`, told in the stop message's place),
    taken as the stop itself (`stop`, a requeue whose answer the sweeper reads), or not taken (`reason`: the job is
    stopped as without it; a move, left as it was). `audited`: what the decision's audit record keeps of it."""

    audited: dict[str, Any]
    text: str | None = None
    stop: StopResult | None = None
    reason: str | None = None


class Teller(Protocol):
    """How a way back's later steps reach Slack and the audit trail (the runtime's): `text` posted in `thread` (bot
    mode), recorded with `outcome` on the job's audit record `audit_sk`; never raises."""

    def tell(
        self, key: str, audit_sk: str, text: str, outcome: dict[str, Any], now: float, thread: str | None = None
    ) -> None: ...


@dataclass(frozen=True)
class Node:
    """One of a job's nodes, for recovery in place: whether it runs, and the group that replaces it (if any)."""

    name: str
    running: bool
    group: str | None = None


@dataclass(frozen=True)
class JobHistory:
    """A job from its start, as an exported trace holds it (`offline.export`)."""

    facts: JobFacts
    start: float  # the trace's t = 0 (epoch seconds)
    ended: float | None  # when it ended, where it has and the platform says when
    changes: tuple[
        tuple[float, JobStatus, str | None], ...
    ] = ()  # status changes before its end: (epoch, status, secondary)
    final: tuple[JobStatus, str | None] | None = None  # the status it ended in (at `ended`, else the trace's end)
    log_selections: tuple[dict[str, Any], ...] = ()  # FilterLogEvents selections of its streams (group, streams)


class AuditTrail(Protocol):
    """Stallwatch's records of a job (`aws.audit_trail.AuditTrail`), as a platform's goodput reads them."""

    def stops(self, key: str) -> list[StopRecord]: ...

    def records(self, key: str, kind: str) -> list[dict[str, Any]]: ...


class PlatformAdapter(Protocol):
    """One platform's API, as the runtime, the sweeper and the CLI use it (`aws.platforms.adapter`).

    Reads raise `aws.source.JobNotFoundError` for a job the platform does not know; `stop` never raises for an API
    error (it returns it)."""

    platform: ClassVar[Platform]
    description: ClassVar[PlatformDescription]
    # its EventBridge state-change event, or a union of them (`aws/platforms/<name>_events.py`)
    state_event: ClassVar[Any]

    def facts(self, job_name: str) -> JobFacts:
        """What the platform says about the job now."""
        ...

    def job_signals(
        self, job_name: str, now: float, freshness: dict[str, float] | None = None, facts: JobFacts | None = None
    ) -> JobSignals:
        """The job's signals at `now`: `freshness`, each host's newest log event if the caller knows it; `facts`,
        the job's if the caller has just read them."""
        ...

    def many_job_signals(
        self,
        job_names: Iterable[str],
        now: float,
        freshness: dict[str, dict[str, float]] | None = None,
        known: dict[str, JobFacts] | None = None,
    ) -> dict[str, JobSignals]:
        """Several jobs' signals, their metrics read together."""
        ...

    def stop(self, facts: JobFacts) -> StopResult:
        """Stop the job as `facts` describe it (its hosts in `facts.instance_ids`, where the platform stops hosts): a
        plain stop, whoever asks (the engine, an operator, a way back that falls back to it)."""
        ...

    def way_back(self, attempt: WayBackAttempt, teller: Teller) -> WayBackResult:
        """Take the job's way back in place of its stop (where `description.way_back` is one of
        `core.way_back.IN_PLACE`, the tag and the budget allowing it, `runtime.way_back`): restart it in place, or
        requeue it off the hosts `attempt.blamed` names. Never raises for an API error (it returns it)."""
        ...

    def continue_way_back(self, now: float, teller: Teller) -> list[dict[str, Any]]:
        """The sweeper's next step of each way back of the platform under way ([] where a way back is one step)."""
        ...

    def way_back_under_way(self, job: str) -> bool:
        """Whether a way back of the job is under way (a move off a host waits for it to end)."""
        ...

    def stop_outcome(self, facts: JobFacts, result: StopResult, sent_at: float, now: float) -> StopOutcome | None:
        """How an asynchronous stop (`result.commands`) went; None while its commands have not answered."""
        ...

    def running_jobs(self, now: float) -> dict[str, JobFacts | None]:
        """Every running job the sweep looks at, with its facts where one listing gives them."""
        ...

    def reconcile(self, now: float) -> list[JobChange]:
        """The running jobs checked against the platform's own view, on the sweeper's schedule: what happened that
        no event told (a job that ended, one requeued; Slurm's, from its controller), kept, as changes to apply."""
        ...

    def newest_log_lines(self, jobs: dict[str, JobFacts | None], now: float) -> list[tuple[str, str, float]]:
        """Each host's newest log line (job, host, epoch seconds) of the running `jobs`; a failed read costs its
        jobs' log idleness (logged and counted), never the sweep."""
        ...

    def job_of_log_stream(self, group: str, stream: str) -> str | None:
        """The watched job whose host writes `stream` in `group` (a subscription's delivery); None for a group not
        the platform's (`PlatformDescription.log_group`), a stream no job of it writes, or a platform not watched."""
        ...

    def job_change(self, event: Any) -> JobChange:
        """What the platform's state-change event (`state_event`) says happened."""
        ...

    def plan_resume(self, name: str, stop: StopRecord, max_restarts: int, history: RestartHistory) -> ResumeVerdict:
        """Whether and as what the job Stallwatch stopped (`stop`) restarts from its checkpoint."""
        ...

    def start_attempt(self, plan: ResumePlan) -> ResumeResult:
        """Start the planned attempt; API errors are returned, never raised."""
        ...

    def run_end(self, facts: JobFacts) -> float | None:
        """What tells one end of the job's run from the next where a job restarts under its own name (EC2: its
        group's start), for the end-of-run summary's claim; None where each attempt is a job of its own."""
        ...

    def run_spans(self, store: AuditTrail | None, job: str, now: float, period: int) -> tuple[str, list[JobSpan]]:
        """The run `job` belongs to, as `JobSpan`s for `core.goodput` (stops from `store`, if given)."""
        ...

    def nodes(self, job: str) -> list[Node]:
        """The job's nodes as they are now (recovery in place, where `description.way_back` is a restart)."""
        ...

    def history(self, job: str) -> JobHistory:
        """The job from its start, for an exported trace."""
        ...

    def iam_probes(self, region: str, account: str) -> list[Probe]:
        """The doctor's IAM questions of the platform (`stallwatch doctor`): its stops and resumes allowed under
        their tags and denied without, simulated against the functions' roles."""
        ...

    def doctor(self, found: StackFound) -> Iterator[Check]:
        """The doctor's checks of the platform (`stallwatch doctor`): the stack's rule of its events, its own
        resources, its hosts' metrics."""
        ...
