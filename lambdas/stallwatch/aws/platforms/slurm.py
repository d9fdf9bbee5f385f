"""Slurm jobs (ParallelCluster, PCS, HyperPod's Slurm): known from deploy/slurm's start and end events (kept in the
table, `slurm_jobs`) and reconciled with their controller's view on the sweeper's schedule; their nodes' EC2
instances found in the controller's VPC by address (DescribeInstances), or HyperPod's through SageMaker's cluster-node
APIs; their logs one stream per node named by its instance; stopped and requeued by the cluster's runner
(deploy/slurm/stallwatch-runner, through the table: `slurm_runner`), whose answers the sweeper reads back.

An instance is never stopped: the job is the unit (`scancel`), and its way back (`stallwatch:recover=requeue`, within
the run's budget: `core.way_back`) drains the nodes a hardware signal blames and requeues it, which Slurm starts again
on healthy nodes from the job's checkpoint; on HyperPod the drained nodes are replaced through
BatchReplaceClusterNodes. A node HyperPod acts on is left to it: never drained, requeued off or replaced too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from botocore.exceptions import BotoCoreError, ClientError

from stallwatch.aws.agent_windows import windows
from stallwatch.aws.log_reads import WHOLE_GROUP, HostLog, JobStreams, read_tails
from stallwatch.aws.metric_reads import MetricQuery, MetricRef
from stallwatch.aws.observability import logger, metrics
from stallwatch.aws.platforms import hyperpod_nodes
from stallwatch.aws.platforms.slurm_doctor import slurm_checks
from stallwatch.aws.platforms.slurm_events import HyperPodNodeHealth, SlurmEvent
from stallwatch.aws.platforms.slurm_instances import node_instances
from stallwatch.aws.platforms.slurm_jobs import SlurmJobs, Started, runs
from stallwatch.aws.platforms.slurm_reconcile import reconcile
from stallwatch.aws.platforms.slurm_runner import Runners
from stallwatch.aws.source import AwsSignalSource, JobNotFoundError, JobReads, agent_search
from stallwatch.aws.store import job_key
from stallwatch.core import contract
from stallwatch.core.contract import SLURM_EVENT_SOURCE
from stallwatch.core.doctor_checks import Check, StackFound, rule_check
from stallwatch.core.goodput import Category, JobSpan
from stallwatch.core.platforms import hyperpod, slurm_runner
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
    CLUSTER,
    HELD_CATEGORIES,
    HYPERPOD,
    JOB_ID,
    RUNNING,
    SLURM,
    SSM_TARGET,
    SUBMIT_EPOCH,
    SUBMIT_TIME,
    SlurmJob,
    end_state,
    hyperpod_cluster,
    job_streams,
    metric_instance,
    node_of_stream,
    slurm_log_group,
    this_attempt,
)
from stallwatch.core.platforms.slurm_names import parse_stream
from stallwatch.core.resume import NoResume, ResumePlan, StopRecord
from stallwatch.core.signals import JobFacts, JobSignals, Platform, Series
from stallwatch.core.way_back import REQUEUED

# The runner answers within its poll (5 s) and the cancel's wait (60 s); one not answered by then is the stop's failure
# (the runner is down: `stallwatch doctor` says so), given back to the engine.
ANSWER_WAIT_S = 600
RECENT_STREAM_PAGES = 2  # pages of the Slurm group's most recently written streams read before asking per node


class SlurmPlatform(AwsSignalSource):
    """`PlatformAdapter` of Slurm jobs."""

    platform = Platform.SLURM
    description = SLURM
    state_event = SlurmEvent
    state_rule = "Slurm job events rule"

    @property
    def jobs(self) -> SlurmJobs:
        if self.store is None:
            raise JobNotFoundError("Slurm jobs are known from their events, kept in the deployment's table: none given")
        return SlurmJobs(self.store)

    @property
    def runners(self) -> Runners:
        if self.store is None:
            raise JobNotFoundError("Slurm commands go through the deployment's table: none given")
        return Runners(self.store)

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
        """The running job whose node's own instance wrote `stream` (its log key, one of its nodes, that node's
        instance: `node_of_stream`); a stream that names a node not the job's, or another instance, is none."""
        found = parse_stream(stream)
        if found is None:
            return None
        now = self.clock()
        for name, job in sorted(self.jobs.running().items()):
            if job.log_key == found.key and node_of_stream(job.facts(now), stream) is not None:
                return name
        return None

    # ---- events ---------------------------------------------------------------------------------------------

    def job_change(self, event: SlurmEvent) -> JobChange:
        """deploy/slurm's start event: the attempt kept (its nodes mapped to their instances) and its alarms put,
        once (a repeated start rewrites nothing); its end: the attempt it names ended, its alarms gone. A requeued
        attempt's run goes on: the next attempt's start event follows under the same name. HyperPod's node health
        event: what HyperPod does about the node, kept with the jobs that run on it."""
        if isinstance(event, HyperPodNodeHealth):
            return self._node_health(event)
        detail, at = event.detail, event.time.timestamp()
        job = SlurmJob.of_event(detail)
        name = job.job_name
        if detail.state == "started":
            started = self.jobs.start(job.with_instances(node_instances(self.clients, job)), at)
            if started is Started.ENDED:
                return JobChange(Change.IGNORED, name, job.state, reason="a late start of an attempt that has ended")
            if started is Started.ALREADY:
                return JobChange(Change.IGNORED, name, job.state, reason="a repeated start of a running attempt")
            return JobChange(Change.STARTED, name, job.state, tags=job.settings)
        state = end_state(detail.job_state, detail.reason, detail.exit_code)
        ended = self.jobs.end(job, state, at, detail.reason)
        if ended is None:
            return JobChange(Change.IGNORED, name, state, reason="an end of no attempt that was heard to run")
        goes_on = not ended.status.ended  # requeued: its next attempt starts under its name
        return JobChange(Change.ENDED, name, state, tags=ended.settings, run_goes_on=goes_on)

    def _node_health(self, event: HyperPodNodeHealth) -> JobChange:
        """HyperPod's word on an instance, kept with each running job of its cluster that runs on it."""
        detail = event.detail.model_dump(by_alias=True)
        found = hyperpod.health_event(detail, event.time.timestamp())
        instance, cluster = event.detail.instance_id, event.detail.cluster_arn.rsplit("/", 1)[-1]
        if found is None:
            return JobChange(Change.IGNORED, instance, "Healthy", reason="a healthy node")
        kept = []
        for name, job in self.jobs.running().items():
            nodes = [n.name for n in job.nodes if n.instance == instance]
            if nodes and hyperpod_cluster(job.ssm_target) == cluster:
                self.jobs.record_hyperpod(name, job.submit_epoch, replace(found, node=nodes[0]))
                kept.append(name)
        reason = f"recorded for {', '.join(sorted(kept))}: {found.note()}" if kept else "no running job on it"
        return JobChange(Change.IGNORED, instance, found.action, reason=reason)

    # ---- the sweep ------------------------------------------------------------------------------------------

    def running_jobs(self, now: float) -> dict[str, JobFacts | None]:
        """The attempts whose start was heard and whose end was not (one Query)."""
        return {name: job.facts(now) for name, job in sorted(self.jobs.running().items())}

    def newest_log_lines(self, jobs: dict[str, JobFacts | None], now: float) -> list[tuple[str, str, float]]:
        """Each node's newest log line, from its own stream in the Slurm log group: the group's most recently
        written streams first, then one DescribeLogStreams for each node not among them; a failed read costs the
        jobs' log idleness, not the sweep."""
        wanted = {
            stream: (job, node)
            for job, facts in jobs.items()
            if facts is not None
            for stream in job_streams(facts)
            if (node := node_of_stream(facts, stream)) is not None
        }
        try:
            found = self._recent_streams(set(wanted))
            for stream in sorted(set(wanted) - set(found)):
                found |= {s["logStreamName"]: s for s in self._streams(stream) if s["logStreamName"] == stream}
        except (ClientError, BotoCoreError):
            logger.exception("could not read the Slurm jobs' log streams")
            metrics.add_metric(name=contract.SWEEP_ERRORS, unit=MetricUnit.Count, value=1)
            return []
        lines = []
        for stream, described in found.items():
            last_ms = described.get("lastEventTimestamp") or described.get("lastIngestionTime")
            if last_ms:
                lines.append((*wanted[stream], last_ms / 1000))
        return sorted(lines)

    def _recent_streams(self, wanted: set[str]) -> dict[str, dict[str, Any]]:
        logs = self.clients.logs
        request: dict[str, Any] = {
            "logGroupName": self._log_group,
            "orderBy": "LastEventTime",
            "descending": True,
        }
        found: dict[str, dict[str, Any]] = {}
        try:
            for _ in range(RECENT_STREAM_PAGES):
                page = logs.describe_log_streams(**request)
                found |= {s["logStreamName"]: s for s in page["logStreams"] if s["logStreamName"] in wanted}
                if not page.get("nextToken") or wanted <= set(found):
                    break
                request["nextToken"] = page["nextToken"]
        except logs.exceptions.ResourceNotFoundException:
            return {}
        return found

    def _streams(self, prefix: str) -> list[dict[str, Any]]:
        pages = self.clients.logs.get_paginator("describe_log_streams").paginate(
            logGroupName=self._log_group, logStreamNamePrefix=prefix
        )
        try:
            return [s for page in pages for s in page["logStreams"]]
        except self.clients.logs.exceptions.ResourceNotFoundException:
            return []

    def reconcile(self, now: float) -> list[JobChange]:
        """The table's running jobs checked against each cluster's controller (`slurm_reconcile`)."""
        return reconcile(self.jobs, self.runners, now)

    # ---- actions --------------------------------------------------------------------------------------------

    def stop(self, facts: JobFacts) -> StopResult:
        """`scancel` by the cluster's runner. Asynchronous: `ok` says the command was queued for the runner; the stop
        is done once the controller says so (`stop_outcome`)."""
        ids = facts.platform_ids
        return self._send(facts, lambda: slurm_runner.cancel(ids[CLUSTER], ids[JOB_ID], ids[SUBMIT_TIME]))

    def way_back(self, attempt: WayBackAttempt, teller: Teller) -> WayBackResult:
        """The requeue, as the stop, by the cluster's runner: the nodes a hardware signal blames (`attempt.blamed`: a
        hardware Xid, a vanished host, HyperPod's health agent's hardware verdict, an AWS Health event's instance;
        never a rank's application error) drained with Stallwatch's reason, then the job requeued, which Slurm starts
        again on healthy nodes (on HyperPod, the drained nodes then replaced: `stop_outcome`). A node HyperPod acts on
        is left to it. Asynchronous, as the stop: its answer is read by the sweeper."""
        if attempt.refused is not None:
            return WayBackResult(audited={"status": "not_recovered", "reason": attempt.refused}, reason=attempt.refused)
        facts, ids = attempt.facts, attempt.facts.platform_ids
        acting = self._hyperpod_acting(facts.name, self.clock())
        drained = tuple(sorted(set(attempt.blamed) - acting))[: slurm_runner.NODES_MAX]
        why = "moved off before a scheduled event" if attempt.moving else "stalled"
        reason = f"{facts.name} {why}" + (f" on {','.join(drained)}" if drained else "")
        stopped = self._send(
            facts, lambda: slurm_runner.requeue(ids[CLUSTER], ids[JOB_ID], ids[SUBMIT_TIME], drained, reason)
        )
        audited = {"status": REQUEUED, "attempt": attempt.attempt, "allowed": attempt.allowed, "drained": list(drained)}
        if left := sorted(set(attempt.blamed) & acting):
            audited["left_to_hyperpod"] = left
        return WayBackResult(audited=audited, stop=stopped)

    def _send(self, facts: JobFacts, command: Callable[[], slurm_runner.Command]) -> StopResult:
        """The runner's command (`command` builds it: a bad id is refused before anything is queued), queued in the
        table for the job's cluster."""
        ids = facts.platform_ids
        try:
            sent = command()
            ref = self.runners.send(sent, self.clock())
        except slurm_runner.CommandError as exc:
            return StopResult(ok=False, detail=f"not a command the runner takes: {exc}")
        except (ClientError, BotoCoreError) as exc:
            return StopResult(ok=False, detail=f"could not queue the command: {exc}")
        what = "requeue" if sent.kind == slurm_runner.REQUEUE else "scancel"
        drained = f", {','.join(sent.nodes)} drained first" if sent.nodes else ""
        detail = f"{what} of Slurm job {ids[JOB_ID]} sent to the runner of cluster {ids[CLUSTER]}{drained}"
        return StopResult(ok=True, detail=detail, commands=(ref,))

    def _hyperpod_acting(self, name: str, now: float) -> set[str]:
        """The job's nodes HyperPod reboots or replaces now (what it said, kept with the attempt)."""
        job = self.jobs.current(name)
        return {a.node for a in (job.hyperpod if job else ()) if a.node and a.acting_at(now)}

    def stop_outcome(self, facts: JobFacts, result: StopResult, sent_at: float, now: float) -> StopOutcome | None:
        """The runner's answer: the job cancelled or requeued (the controller no longer runs it), left alone in a
        state that is not a stall (kept: the job is not judged while it is so), or the failure; none past
        `ANSWER_WAIT_S`. On HyperPod, the drained nodes are then replaced through SageMaker (unless HyperPod already
        acts on them)."""
        runners = self.runners
        answer = next((a for a in (runners.answer(ref) for ref in result.commands) if a is not None), None)
        if answer is None:
            if now - sent_at <= ANSWER_WAIT_S:
                return None
            cluster = facts.platform_ids.get(CLUSTER, "")
            return StopOutcome(
                ok=False,
                detail=f"no answer from the runner of cluster {cluster} within {ANSWER_WAIT_S / 60:.0f} min "
                "(is deploy/slurm/stallwatch-runner running? stallwatch doctor)",
            )
        for ref in result.commands:
            runners.forget(ref)
        outcome = slurm_runner.stop_outcome(answer)
        if outcome.held:
            self.jobs.hold(facts.name, int(facts.platform_ids[SUBMIT_EPOCH]), outcome.state, now)
        drained = [str(n) for n in answer.get("drained") or []]
        if outcome.ok and drained and facts.platform_ids.get("flavor") == HYPERPOD:
            outcome = replace(outcome, detail=f"{outcome.detail}; {self._replace_nodes(facts, drained, now)}")
        return outcome

    def _replace_nodes(self, facts: JobFacts, nodes: list[str], now: float) -> str:
        """HyperPod's replacement of the drained nodes (BatchReplaceClusterNodes), except those HyperPod already
        reboots or replaces: a node is never acted on twice."""
        acting = self._hyperpod_acting(facts.name, now)
        cluster = hyperpod_cluster(facts.platform_ids.get(SSM_TARGET, ""))
        ours = [facts.host_instances[n] for n in nodes if n in facts.host_instances and n not in acting]
        left = sorted(set(nodes) & acting)
        said = [f"left to HyperPod: {','.join(left)}"] if left else []
        if cluster is None or not ours:
            return "; ".join(said) or "no node to replace (no HyperPod instance known)"
        done = hyperpod_nodes.replace_nodes(self.clients, cluster, ours)
        return "; ".join([f"BatchReplaceClusterNodes: {done.detail}", *said])

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
        """The rule of deploy/slurm's job events (on the Slurm bus), and the runners, log group and jobs
        (`slurm_doctor`)."""
        yield rule_check(found, self.state_rule, SLURM_EVENT_SOURCE)
        yield from slurm_checks(self.clients, self.runners, self.jobs, self._log_group)

    def history(self, job: str) -> JobHistory:
        """The latest attempt from its start; its nodes' own streams (each by its name, as a prefix)."""
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
            log_selections=tuple(
                {"logGroupName": self._log_group, "logStreamNamePrefix": stream} for stream in job_streams(facts)
            ),
        )

    # ---- reads ----------------------------------------------------------------------------------------------

    def many_job_signals(
        self,
        job_names: Iterable[str],
        now: float,
        freshness: dict[str, dict[str, float]] | None = None,
        known: dict[str, JobFacts] | None = None,
    ) -> dict[str, JobSignals]:
        """Each job's signals since its attempt began (a requeued job's earlier attempt ran under its name); on
        HyperPod, with what HyperPod says it does about the job's nodes (`_with_hyperpod`)."""
        found = super().many_job_signals(job_names, now, freshness, known)
        return {name: self._with_hyperpod(this_attempt(signals), now) for name, signals in found.items()}

    def _with_hyperpod(self, signals: JobSignals, now: float) -> JobSignals:
        """A HyperPod job's signals with its health agent's detections on the job's instances and its auto-resume's
        lines since the attempt began, kept with the attempt: a node HyperPod reboots or replaces, or a step its
        auto-resume retries, leaves the job to HyperPod (its facts Paused), and HyperPod's verdict is in the facts'
        notes (the alert's and the decision's)."""
        facts = signals.facts
        cluster = hyperpod_cluster(facts.platform_ids.get(SSM_TARGET, ""))
        if cluster is None:
            return signals
        submit_epoch = int(facts.platform_ids[SUBMIT_EPOCH])
        instances = {instance: node for node, instance in facts.host_instances.items()}
        try:
            findings = hyperpod_nodes.agent_findings(self.clients, cluster, set(instances), facts.start_time, now)
        except (ClientError, BotoCoreError):
            logger.exception("could not read HyperPod's health agent", extra={"job": facts.name})
            findings = []
        findings = [replace(f, node=instances.get(f.instance, "")) for f in findings]
        for host in signals.hosts.values():
            for line in (*host.log_tail, *host.error_lines):
                retry = hyperpod.auto_resume(line.message, facts.platform_ids[JOB_ID], line.t)
                if retry is not None:
                    findings.append(retry)
        job = None
        for finding in findings:
            job = self.jobs.record_hyperpod(facts.name, submit_epoch, finding) or job
        return signals if job is None else replace(signals, facts=job.facts(now))

    def _platform_reads(self, facts: JobFacts, reads: JobReads, hosts_period: int | None) -> JobReads:
        """The CloudWatch agent's series of each node's instance, by name; the sweeper's `LogIdleSeconds`."""
        for host in facts.host_instances:
            instance = metric_instance(facts, host)
            if instance is None:
                continue
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
        as the caller knows it, raised by the lines read from the Slurm group (`log_reads.read_tails`: a job's streams
        share no prefix, each named by its node's instance), a line taken only from a node's own stream
        (`node_of_stream`), and the agent's stack dumps since `stacks_since`."""
        effective = self.policy.for_job(facts.tags)
        known = self._known_freshness(facts, per_host, reads, freshness, now)
        streams = JobStreams(self._log_group, WHOLE_GROUP, lambda stream, _: node_of_stream(facts, stream))
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
