"""Slurm jobs (ParallelCluster, PCS, HyperPod's Slurm): known from deploy/slurm's start and end events (kept in the
table, `slurm_jobs`), their nodes' EC2 instances found by address (DescribeInstances) for the CloudWatch agent's
metrics, their logs one stream per node under one prefix per job in the Slurm log group; stopped and requeued through
SSM Run Command with Stallwatch's documents on the cluster's controller, whose answers the sweeper reads back.

An instance is never stopped: the job is the unit (`scancel`), and its way back (`stallwatch:recover=requeue`, within
the run's budget: `core.way_back`) drains the nodes a health signal blames and requeues it, which Slurm starts again
on healthy nodes from the job's checkpoint.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from botocore.exceptions import BotoCoreError, ClientError

from stallwatch.aws import ssm
from stallwatch.aws.agent_windows import windows
from stallwatch.aws.log_reads import HostLog, JobStreams, read_tails
from stallwatch.aws.metric_reads import MetricQuery, MetricRef
from stallwatch.aws.observability import logger, metrics
from stallwatch.aws.platforms.slurm_doctor import slurm_checks
from stallwatch.aws.platforms.slurm_events import SlurmJobStateChange
from stallwatch.aws.platforms.slurm_jobs import SlurmJobs, runs
from stallwatch.aws.source import AwsSignalSource, JobNotFoundError, JobReads, agent_search
from stallwatch.aws.store import job_key
from stallwatch.core import contract
from stallwatch.core.doctor_checks import Check, StackFound
from stallwatch.core.goodput import Category, JobSpan
from stallwatch.core.platforms.cloudwatch_agent import HOST_METRICS, host_dimensions, memory_percent
from stallwatch.core.platforms.interface import (
    AuditTrail,
    Change,
    JobChange,
    JobHistory,
    Node,
    RestartHistory,
    ResumeResult,
    ResumeVerdict,
    StopOutcome,
    StopResult,
    Teller,
    WayBackAttempt,
    WayBackResult,
)
from stallwatch.core.platforms.slurm import (
    HELD_CATEGORIES,
    HYPERPOD,
    JOB_ID,
    RUNNING,
    SLURM,
    SSM_TARGET,
    SUBMIT_EPOCH,
    SUBMIT_TIME,
    SlurmJob,
    answer_outcome,
    end_state,
    job_of_stream,
    slurm_log_group,
    stream_prefix,
    this_attempt,
)
from stallwatch.core.resume import NoResume, ResumePlan, StopRecord
from stallwatch.core.signals import JobFacts, JobSignals, Platform, Series
from stallwatch.core.way_back import REQUEUED

DELIVERY_TIMEOUT_S = 60  # SendCommand TimeoutSeconds (SSM's least is 30): the controller is one node, online
# The documents give up after 180 s (their timeoutSeconds): an answer not read by then is the stop's failure.
ANSWER_WAIT_S = 600
FILTER_VALUES_LIMIT = 200  # DescribeInstances: filter values of one call, all filters' together (FilterLimitExceeded)
MAPPED_STATES = ["pending", "running"]
DRAIN_REASON_CHARS = 120  # the requeue document's reason (allowedPattern: 160 at most, "stallwatch: " before it)
REASON_UNSAFE = re.compile(r"[^A-Za-z0-9 :;,._()=/+-]")  # what the reason's allowedPattern refuses
MAX_DRAINED = 64  # the nodes parameter's allowedPattern: at most 64 names
UNMAPPED_FLAVORS = frozenset({HYPERPOD})  # its nodes are no EC2 instances of the account


class SlurmPlatform(AwsSignalSource):
    """`PlatformAdapter` of Slurm jobs."""

    platform = Platform.SLURM
    description = SLURM
    state_event = SlurmJobStateChange
    state_rule = "Slurm job events rule"

    @property
    def jobs(self) -> SlurmJobs:
        if self.store is None:
            raise JobNotFoundError("Slurm jobs are known from their events, kept in the deployment's table: none given")
        return SlurmJobs(self.store)

    @property
    def _log_group(self) -> str:
        """The Slurm jobs' group, under the deployment's EC2 group."""
        return slurm_log_group(self.config.ec2_log_group)

    def facts(self, job_name: str) -> JobFacts:
        job = self.jobs.current(job_name)
        if job is None:
            raise JobNotFoundError(f"no Slurm job {job_name!r}: no start or end event of it was received")
        return job.facts(self.clock())

    def _job_of_stream(self, stream: str) -> str | None:
        """A node's output file names its job (deploy/slurm/stallwatch-log.sh's ``<job>.<node>.log``)."""
        return job_of_stream(stream)

    # ---- events ---------------------------------------------------------------------------------------------

    def job_change(self, event: SlurmJobStateChange) -> JobChange:
        """deploy/slurm's start event: the attempt kept (its nodes mapped to their EC2 instances) and its alarms
        put; its end: kept with how it ended, its alarms gone. A requeued attempt's run goes on: the next attempt's
        start event follows under the same name."""
        detail, at = event.detail, event.time.timestamp()
        job = SlurmJob.of_event(detail)
        name = job.job_name
        if detail.state == "started":
            job = job.with_instances(self._instances(job))
            if not self.jobs.start(job, at):
                return JobChange(Change.IGNORED, name, job.state, reason="a late start of an attempt that has ended")
            return JobChange(Change.STARTED, name, job.state, tags=job.settings)
        state = end_state(detail.job_state, detail.reason, detail.exit_code)
        ended = self.jobs.end(job, state, at, detail.reason, at)
        goes_on = not ended.status.ended  # requeued: its next attempt starts under its name
        return JobChange(Change.ENDED, name, state, tags=ended.settings, run_goes_on=goes_on)

    def _instances(self, job: SlurmJob) -> dict[str, tuple[str, str]]:
        """The EC2 instances behind the job's nodes, by private address (ParallelCluster and PCS nodes are instances
        of the account); none on HyperPod, or where DescribeInstances is refused (the agent's metrics stand in)."""
        addrs = sorted({n.addr for n in job.nodes if n.addr})
        if job.flavor in UNMAPPED_FLAVORS or not addrs:
            return {}
        found: dict[str, tuple[str, str]] = {}
        try:
            chunk = FILTER_VALUES_LIMIT - len(MAPPED_STATES)
            for offset in range(0, len(addrs), chunk):
                filters = [
                    {"Name": "private-ip-address", "Values": addrs[offset : offset + chunk]},
                    {"Name": "instance-state-name", "Values": MAPPED_STATES},
                ]
                pages = self.clients.ec2.get_paginator("describe_instances").paginate(Filters=filters)
                for page in pages:
                    for reservation in page["Reservations"]:
                        for instance in reservation["Instances"]:
                            address = instance.get("PrivateIpAddress", "")
                            found[address] = (instance["InstanceId"], instance["InstanceType"])
        except (ClientError, BotoCoreError) as exc:
            logger.warning("could not map the Slurm nodes to instances", extra={"job": job.job_name, "error": str(exc)})
            return {}
        return found

    # ---- the sweep ------------------------------------------------------------------------------------------

    def running_jobs(self, now: float) -> dict[str, JobFacts | None]:
        """The attempts whose start was heard and whose end was not (one Query)."""
        return {name: job.facts(now) for name, job in sorted(self.jobs.running().items())}

    def newest_log_lines(self, jobs: dict[str, JobFacts | None], now: float) -> list[tuple[str, str, float]]:
        """Each node's newest log line, from its stream in the Slurm log group: one DescribeLogStreams a job, by its
        streams' prefix; one job's failure costs its log idleness, not the sweep."""
        found = []
        for job, facts in jobs.items():
            hosts = set(facts.instance_ids) if facts is not None else set()
            try:
                streams = self._streams(job)
            except (ClientError, BotoCoreError):
                logger.exception("could not read a Slurm job's log streams", extra={"job": job})
                metrics.add_metric(name=contract.SWEEP_ERRORS, unit=MetricUnit.Count, value=1)
                continue
            for stream in streams:
                host = SLURM.host_of_stream(stream["logStreamName"], job, hosts)
                last_ms = stream.get("lastEventTimestamp") or stream.get("lastIngestionTime")
                if host is not None and last_ms:
                    found.append((job, host, last_ms / 1000))
        return found

    def _streams(self, job: str) -> list[dict[str, Any]]:
        pages = self.clients.logs.get_paginator("describe_log_streams").paginate(
            logGroupName=self._log_group, logStreamNamePrefix=stream_prefix(job)
        )
        try:
            return [s for page in pages for s in page["logStreams"]]
        except self.clients.logs.exceptions.ResourceNotFoundException:
            return []

    # ---- actions --------------------------------------------------------------------------------------------

    def stop(self, facts: JobFacts) -> StopResult:
        """`scancel` on the controller (the cancel document). Asynchronous: `ok` says the command was sent; its answer
        is read by the sweeper (`stop_outcome`)."""
        return self._send(facts, requeue=False)

    def way_back(self, attempt: WayBackAttempt, teller: Teller) -> WayBackResult:
        """The requeue, as the stop (the requeue document): the nodes a health signal blames (`attempt.blamed`: a
        hardware Xid, a vanished host, an AWS Health event's instance; never a rank's application error) drained with
        Stallwatch's reason (FAIL with `Action:Replace` on HyperPod), then the job requeued, which Slurm starts again
        on healthy nodes. Asynchronous, as the stop: its answer is read by the sweeper."""
        if attempt.refused is not None:
            return WayBackResult(audited={"status": "not_recovered", "reason": attempt.refused}, reason=attempt.refused)
        drained = tuple(sorted(attempt.blamed))[:MAX_DRAINED]
        stopped = self._send(attempt.facts, requeue=True, drained=drained, moving=attempt.moving)
        audited = {"status": REQUEUED, "attempt": attempt.attempt, "allowed": attempt.allowed, "drained": list(drained)}
        return WayBackResult(audited=audited, stop=stopped)

    def _send(self, facts: JobFacts, requeue: bool, drained: tuple[str, ...] = (), moving: bool = False) -> StopResult:
        """The cancel or the requeue document to the job's controller, `drained` first (a requeue's)."""
        ids = facts.platform_ids
        target = ids.get(SSM_TARGET, "")
        if not target:
            return StopResult(ok=False, detail="no SSM target: deploy/slurm's settings name no controller")
        parameters = {"jobId": ids[JOB_ID], "submitTime": ids[SUBMIT_TIME]}
        if requeue:
            document = self.documents.slurm_requeue
            why = "moved off before a scheduled event" if moving else "stalled"
            reason = f"{facts.name} {why}" + (f" on {','.join(drained)}" if drained else "")
            parameters |= {"nodes": ",".join(drained), "reason": REASON_UNSAFE.sub("-", reason)[:DRAIN_REASON_CHARS]}
            if ids.get("flavor") == HYPERPOD:
                parameters["hyperpodAction"] = "Replace"
        else:
            document = self.documents.slurm_cancel
        what = "requeue" if requeue else "scancel"
        if not document:
            return StopResult(ok=False, detail=f"this deployment has no Slurm {what} document (SSM)")
        sent = ssm.send(
            self.clients, document, (target,), f"stallwatch {what} {facts.name}", DELIVERY_TIMEOUT_S, parameters
        )
        if sent.error:
            return StopResult(ok=False, detail=sent.error)
        first = f", {','.join(drained)} drained first" if drained else ""
        detail = f"{what} of Slurm job {ids[JOB_ID]} sent to {target}{first} (command {sent.command_ids[0]})"
        return StopResult(ok=True, detail=detail, commands=sent.command_ids)

    def stop_outcome(self, facts: JobFacts, result: StopResult, sent_at: float, now: float) -> StopOutcome | None:
        """The document's one JSON line: the job cancelled or requeued, left alone in a state that is not a stall
        (kept as its state: the job is watched again once it runs), or the failure; none past `ANSWER_WAIT_S`."""
        answers = ssm.invocations(self.clients, result.commands)
        answer = next(iter(answers.values()), None)
        outcome = None if answer is None else answer_outcome(answer.status, answer.details, answer.code, answer.output)
        if outcome is None and now - sent_at > ANSWER_WAIT_S:
            return StopOutcome(ok=False, detail=f"no answer from the controller within {ANSWER_WAIT_S / 60:.0f} min")
        if outcome is not None and outcome.held:
            self.jobs.hold(facts.name, int(facts.platform_ids[SUBMIT_EPOCH]), outcome.state, now)
        return outcome

    # ---- resume, runs, history ------------------------------------------------------------------------------

    def plan_resume(self, name: str, stop: StopRecord, max_restarts: int, history: RestartHistory) -> ResumeVerdict:
        return ResumeVerdict(
            NoResume("a Slurm job is requeued (stallwatch:recover=requeue), never resumed anew", alert=False)
        )

    def start_attempt(self, plan: ResumePlan) -> ResumeResult:
        raise NotImplementedError("a Slurm job is requeued by its stop, never started anew")

    def run_end(self, facts: JobFacts) -> float | None:
        return facts.start_time  # each attempt's end is claimed once; a requeued one's run goes on

    def run_spans(self, store: AuditTrail | None, job: str, now: float, period: int) -> tuple[str, list[JobSpan]]:
        """The job's latest run: its attempts linked by cluster, id and restart count, each from its start to its
        end (Stallwatch's stop within it as its stall), the gaps between them in the queue as Slurm held them."""
        attempts = self.jobs.attempts(job)
        if not attempts:
            raise JobNotFoundError(f"no Slurm job {job!r}")
        run = runs(attempts)[-1]
        stops = [s for s in store.stops(job_key(Platform.SLURM, job)) if s.ok is not False] if store else []
        spans = []
        for index, attempt in enumerate(run):
            facts = attempt.facts()
            end = attempt.ended_epoch if attempt.ended_epoch is not None else now
            stop = next((s for s in stops if attempt.start_epoch <= s.at <= end), None)
            spans.append(
                JobSpan(
                    name=job if index == 0 else f"{job} (restart {attempt.restarts})",
                    instance_type=facts.instance_type,
                    hosts=facts.instance_count,
                    created=attempt.start_epoch,
                    ended=end,
                    windows=tuple(windows(self.clients, job, attempt.start_epoch, end, period)),
                    stall=(stop.stall_onset, stop.at) if stop is not None else None,
                    fleet=facts.fleet() if facts.host_types else {},
                    submitted=float(attempt.submit_epoch),
                    held=tuple(
                        (a, b, HELD_CATEGORIES.get(state, Category.OTHER)) for a, b, state in attempt.held_spans(now)
                    ),
                    gap=_gap(run[index - 1], stops) if index else Category.PENDING,
                )
            )
        return job, spans

    def nodes(self, job: str) -> list[Node]:
        raise NotImplementedError("a Slurm job is requeued on healthy nodes, not restarted in place")

    def doctor(self, found: StackFound) -> Iterator[Check]:
        """The rule of deploy/slurm's job events, and the Slurm resources and clusters (`slurm_doctor`)."""
        yield from super().doctor(found)
        yield from slurm_checks(self.clients, found, self.jobs, self._log_group)

    def history(self, job: str) -> JobHistory:
        """The latest attempt from its start; its nodes' streams (one prefix)."""
        current = self.jobs.current(job)
        if current is None:
            raise JobNotFoundError(f"no Slurm job {job!r}")
        facts = current.facts()
        ended = current.ended_epoch
        return JobHistory(
            facts=facts,
            start=current.start_epoch,
            ended=ended,
            changes=((current.start_epoch, RUNNING, None),),
            final=(facts.status, current.state) if ended is not None else None,
            log_selections=({"logGroupName": self._log_group, "logStreamNamePrefix": stream_prefix(job)},),
        )

    # ---- reads ----------------------------------------------------------------------------------------------

    def many_job_signals(
        self,
        job_names: Iterable[str],
        now: float,
        freshness: dict[str, dict[str, float]] | None = None,
        known: dict[str, JobFacts] | None = None,
    ) -> dict[str, JobSignals]:
        """Each job's signals since its attempt began (a requeued job's earlier attempt ran under its name)."""
        found = super().many_job_signals(job_names, now, freshness, known)
        return {name: this_attempt(signals) for name, signals in found.items()}

    def _platform_reads(self, facts: JobFacts, reads: JobReads, hosts_period: int | None) -> JobReads:
        """The CloudWatch agent's series of each node's instance, by name; the sweeper's `LogIdleSeconds`."""
        for host, instance in facts.host_instances.items():
            dims = tuple(host_dimensions(instance).items())
            reads.instances.update({(host, fld): MetricRef(ns, name, dims) for fld, (ns, name) in HOST_METRICS.items()})
        job_dim = ((contract.DIM_JOB, facts.name),)
        idle = agent_search(contract.LOG_IDLE_SECONDS, job_dim, "Maximum", hosts_period)
        return JobReads(
            job=reads.job, agent=reads.agent, platform=reads.platform, instances=reads.instances, log_idle=idle
        )

    def _platform_series(
        self,
        facts: JobFacts,
        host: str,
        reads: JobReads,
        found: dict[MetricQuery, dict[str, Series]],
        per_host: dict[MetricQuery, dict[str, Series]],
    ) -> dict[str, Series]:
        series = {fld: found[ref][""] for (ref_host, fld), ref in reads.instances.items() if ref_host == host}
        if not series:  # no instance of the account: the agent's own series stand in
            return {"gpu_util": Series(), "gpu_mem_util": Series(), "cpu_util": Series()}
        series["gpu_mem_util"] = memory_percent(series.pop("gpu_mem_used"), series.pop("gpu_mem_total"))
        return series

    def _host_logs(
        self,
        facts: JobFacts,
        hosts: list[str],
        per_host: dict[MetricQuery, dict[str, Series]],
        reads: JobReads,
        freshness: dict[str, float],
        now: float,
        stacks_since: float | None = None,
    ) -> dict[str, HostLog]:
        """Each node's newest event as the sweeper last published it (its `LogIdleSeconds`, `_known_freshness`) or
        as the caller knows it, raised by the lines read from the job's streams (one prefix), and the agent's stack
        dumps since `stacks_since`."""
        effective = self.policy.for_job(facts.tags)
        known = self._known_freshness(facts, per_host, reads, freshness, now)
        streams = JobStreams(self._log_group, stream_prefix(facts.name), lambda s, j: SLURM.host_of_stream(s, j, hosts))
        return read_tails(
            self.clients.logs, streams, facts.name, hosts, known, now, effective.line_patterns, stacks_since
        )


ADAPTER = SlurmPlatform


def _gap(before: SlurmJob, stops: list[StopRecord]) -> Category:
    """How the time between an attempt and the next counts: a restart after Stallwatch's stop (its requeue), else
    as Slurm ended the attempt (requeued, preempted)."""
    end = before.ended_epoch if before.ended_epoch is not None else before.start_epoch
    if any(before.start_epoch <= s.at <= end for s in stops):
        return Category.RESTART_GAPS
    return HELD_CATEGORIES.get(before.state, Category.REQUEUED)
