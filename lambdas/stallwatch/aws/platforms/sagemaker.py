"""SageMaker training jobs: facts from DescribeTrainingJob, host metrics from SageMaker's own, logs from
``/aws/sagemaker/TrainingJobs``, stopped with StopTrainingJob, resumed as a new job cloned from the stopped one
(CreateTrainingJob), its run the chain of those jobs (`sagemaker_goodput`).

A job's reads do not grow with its hosts: each host metric is one SEARCH over all of them (`metric_reads`), each
host's log freshness is the sweeper's `LogIdleSeconds`, and its log tail is at most two pages (`log_reads`).
SageMaker publishes GPU/CPU utilization summed over a host's devices: divided after the read by each host's own
type's devices, as a heterogeneous job's hosts differ (see docs/lambdas.md).
"""

from __future__ import annotations

import re
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from botocore.exceptions import BotoCoreError, ClientError

from stallwatch.aws.api_errors import api_error
from stallwatch.aws.log_reads import HostLog, JobStreams, LogQueryError, newest_events, read_tails
from stallwatch.aws.metric_reads import MetricQuery, SearchRef
from stallwatch.aws.observability import logger, metrics
from stallwatch.aws.platforms.sagemaker_events import TrainingJobStateChange
from stallwatch.aws.platforms.sagemaker_goodput import describe_training_job, sagemaker_run_spans
from stallwatch.aws.resume import failure
from stallwatch.aws.source import AwsSignalSource, JobNotFoundError, JobReads, agent_search
from stallwatch.core import contract
from stallwatch.core import resume as planning
from stallwatch.core.doctor_checks import PROBE_JOB, RESUMING_ROLES, Probe, stop_probes
from stallwatch.core.goodput import JobSpan
from stallwatch.core.platforms.interface import (
    AuditTrail,
    Change,
    JobChange,
    JobHistory,
    Node,
    RestartHistory,
    ResumeResult,
    ResumeVerdict,
    StopResult,
)
from stallwatch.core.platforms.sagemaker import (
    HOST_METRICS,
    SAGEMAKER,
    SAGEMAKER_STREAM,
    host_dimensions,
    sagemaker_layout,
    stream_host,
)
from stallwatch.core.pricing import instance_spec
from stallwatch.core.reading import LOOKBACK_SECONDS, SAGEMAKER_HOST_METRICS_READ
from stallwatch.core.resume import ATTEMPT_TAG, RESUME_TAG, RESUMED_FROM_TAG, ResumePlan, StopRecord
from stallwatch.core.signals import JobFacts, JobStatus, Platform, Series

HOST_LABEL = "${PROP('Dim.Host')}"  # "<job>/algo-N"
STOP_TRAINING_JOB = "sagemaker:StopTrainingJob"
CREATE_TRAINING_JOB = "sagemaker:CreateTrainingJob"
# SageMaker's answer to StopTrainingJob on a job that is not running: "... the training job is in status Stopped."
NOT_RUNNING = re.compile(r"in status (Stopping|Stopped|Completed|Failed)")
MAX_RUNTIME_SECONDS = 28 * 86_400  # a training job's longest MaxRuntimeInSeconds: older ones have ended
NAME_IN_USE = "ResourceInUse"
ALREADY_EXISTS = "already exists"  # SageMaker's message for a name in use
# Secondary statuses that end the job; an exported trace carries the job's final status once, at its end.
FINAL_SECONDARY = frozenset({"Completed", "Failed", "Stopping", "Stopped", "MaxRuntimeExceeded", "MaxWaitTimeExceeded"})

# The training jobs' streams, ``<job>/algo-N-<epoch>``, under one log group.
STREAMS = JobStreams(
    contract.SAGEMAKER_LOG_GROUP,
    None,
    lambda stream, job: host[1] if (host := stream_host(stream)) is not None and host[0] == job else None,
)


class SageMakerPlatform(AwsSignalSource):
    """`PlatformAdapter` of SageMaker training jobs."""

    platform = Platform.SAGEMAKER
    description = SAGEMAKER
    state_event = TrainingJobStateChange
    state_rule = "SageMaker job states rule"

    def facts(self, job_name: str) -> JobFacts:
        sagemaker = self.clients.sagemaker
        try:
            job = sagemaker.describe_training_job(TrainingJobName=job_name)
        except sagemaker.exceptions.ClientError as exc:
            if exc.response["Error"]["Code"] in ("ValidationException", "ResourceNotFound"):
                raise JobNotFoundError(f"training job {job_name!r}: {exc.response['Error']['Message']}") from exc
            raise
        tags = sagemaker.list_tags(ResourceArn=job["TrainingJobArn"]).get("Tags", [])
        layout = sagemaker_layout(job["ResourceConfig"])
        spec = instance_spec(layout.instance_type)
        history = tuple((t["StartTime"].timestamp(), t["Status"]) for t in job.get("SecondaryStatusTransitions", []))
        start = job.get("TrainingStartTime") or job["CreationTime"]
        return JobFacts(
            name=job_name,
            platform=Platform.SAGEMAKER,
            status=JobStatus(job["TrainingJobStatus"]),
            secondary_status=job.get("SecondaryStatus"),
            start_time=start.timestamp(),
            instance_type=layout.instance_type,
            instance_count=layout.instance_count,
            gpus_per_host=spec.devices,
            vcpus_per_host=spec.vcpus,
            tags={t["Key"]: t["Value"] for t in tags},
            status_history=history,
            host_types=layout.host_types,
        )

    def stop(self, facts: JobFacts) -> StopResult:
        """StopTrainingJob by the job's exact name; a job that is not running counts as stopped."""
        name = facts.name
        try:
            self.clients.sagemaker.stop_training_job(TrainingJobName=name)
        except ClientError as exc:
            error = api_error(exc)
            if error.code == "ValidationException" and NOT_RUNNING.search(error.message):
                return StopResult(ok=True, detail=f"already not running: {error.message}")
            return StopResult(ok=False, detail=f"StopTrainingJob {name}: {error}")
        return StopResult(ok=True, detail=f"StopTrainingJob {name} accepted")

    def _job_of_stream(self, stream: str) -> str | None:
        """A stream ``<job>/algo-N-<epoch>`` names its job."""
        match = SAGEMAKER_STREAM.match(stream)
        return match["job"] if match is not None and self.description.names_job(match["job"]) else None

    def running_jobs(self, now: float) -> dict[str, JobFacts | None]:
        """The InProgress training jobs, filtered by status and bounded to the jobs that can still be running (created
        in the last 28 days): never the account's whole history."""
        created_after = datetime.fromtimestamp(now, UTC) - timedelta(seconds=MAX_RUNTIME_SECONDS)
        pages = self.clients.sagemaker.get_paginator("list_training_jobs").paginate(
            StatusEquals="InProgress", CreationTimeAfter=created_after, PaginationConfig={"PageSize": 100}
        )
        return {j["TrainingJobName"]: None for page in pages for j in page["TrainingJobSummaries"]}

    def newest_log_lines(self, jobs: dict[str, JobFacts | None], now: float) -> list[tuple[str, str, float]]:
        """Every running host's newest log line from one Logs Insights query over the training jobs' log group; a
        query that fails costs this sweep's log idleness (decisions fall back on the last published
        `LogIdleSeconds` and their own tail)."""
        if not jobs:
            return []
        try:
            newest = newest_events(
                self.clients.logs, contract.SAGEMAKER_LOG_GROUP, stream_host, now - LOOKBACK_SECONDS, now, time.sleep
            )
        except LogQueryError:
            logger.exception("the log freshness query failed; no log idleness published this sweep")
            metrics.add_metric(name=contract.SWEEP_ERRORS, unit=MetricUnit.Count, value=1)
            return []
        return [(job, host, t) for (job, host), t in sorted(newest.items()) if job in jobs]

    def job_change(self, event: TrainingJobStateChange) -> JobChange:
        detail = event.detail
        name, status = detail.training_job_name, JobStatus(detail.training_job_status)
        if status is JobStatus.RUNNING:
            return JobChange(Change.STARTED, name, status)
        if status.ended:  # a resume may follow Stallwatch's stop where it ended Stopped
            return JobChange(Change.ENDED, name, status, stopped=status is JobStatus.STOPPED, tags=detail.tags)
        return JobChange(Change.IGNORED, name, status, reason=f"status {status}")

    def plan_resume(self, name: str, stop: StopRecord, max_restarts: int, history: RestartHistory) -> ResumeVerdict:
        """A new job cloned from the stopped one, named for its attempt (the run's chain is in the jobs' tags)."""
        described, tags = describe_training_job(self.clients, name)
        return ResumeVerdict(planning.plan_resume(described, tags, stop, max_restarts))

    def start_attempt(self, plan: ResumePlan) -> ResumeResult:
        return create_training_job(self.clients, plan.request)

    def run_end(self, facts: JobFacts) -> float | None:
        return None  # each attempt is a job of its own name

    def run_spans(self, store: AuditTrail | None, job: str, now: float, period: int) -> tuple[str, list[JobSpan]]:
        return sagemaker_run_spans(self.clients, store, job, now, period)

    def nodes(self, job: str) -> list[Node]:
        raise NotImplementedError("a SageMaker training job is not restarted in place: it is resumed as a new job")

    def iam_probes(self, region: str, account: str) -> list[Probe]:
        """Stops only of jobs tagged to be stopped (unless the policy allows any); resumes only as a resume chain's job,
        passing only roles tagged for resume, to SageMaker."""
        job = f"arn:aws:sagemaker:{region}:{account}:training-job/{PROBE_JOB}"
        role_arn = f"arn:aws:iam::{account}:role/{PROBE_JOB}"
        passed = {"iam:PassedToService": "sagemaker.amazonaws.com"}
        return [
            *stop_probes(STOP_TRAINING_JOB, job, self.policy.stop_requires_tag),
            *(
                probe
                for role in RESUMING_ROLES
                for probe in (
                    Probe(role, CREATE_TRAINING_JOB, job, {f"aws:RequestTag/{RESUMED_FROM_TAG}": PROBE_JOB}, True),
                    Probe(role, CREATE_TRAINING_JOB, job, {}, False),
                    Probe(role, "iam:PassRole", role_arn, passed | {f"aws:ResourceTag/{RESUME_TAG}": "2"}, True),
                    Probe(role, "iam:PassRole", role_arn, passed, False),
                )
            ),
        ]

    def history(self, job: str) -> JobHistory:
        """Its status history, from its creation (DescribeTrainingJob), and its streams ``<job>/algo-N-<epoch>``."""
        try:
            described, tags = describe_training_job(self.clients, job)
        except ClientError as exc:
            raise JobNotFoundError(f"training job {job!r}: {exc.response['Error']['Message']}") from exc
        layout = sagemaker_layout(described["ResourceConfig"])
        spec = instance_spec(layout.instance_type)
        status = JobStatus(described["TrainingJobStatus"])
        facts = JobFacts(
            name=job,
            platform=Platform.SAGEMAKER,
            status=status,
            secondary_status=described.get("SecondaryStatus"),
            start_time=described["CreationTime"].timestamp(),
            instance_type=layout.instance_type,
            instance_count=layout.instance_count,
            gpus_per_host=spec.devices,
            vcpus_per_host=spec.vcpus,
            tags=tags,
            host_types=layout.host_types,
        )
        end = described.get("TrainingEndTime")
        ended = end.timestamp() if end is not None and status is not JobStatus.RUNNING else None
        changes = tuple(
            (transition["StartTime"].timestamp(), JobStatus.RUNNING, transition["Status"])
            for transition in described.get("SecondaryStatusTransitions", [])
            if transition["Status"] not in FINAL_SECONDARY
        )
        return JobHistory(
            facts=facts,
            start=facts.start_time,
            ended=ended,
            changes=changes,
            final=(status, described.get("SecondaryStatus")) if ended is not None else None,
            log_selections=({"logGroupName": contract.SAGEMAKER_LOG_GROUP, "logStreamNamePrefix": f"{job}/"},),
        )

    def _platform_reads(self, facts: JobFacts, reads: JobReads, hosts_period: int | None) -> JobReads:
        # Undivided: `_platform_series` divides each host by its own devices (a heterogeneous job's hosts differ).
        reads.platform.update(
            {
                fld: SearchRef(
                    contract.SAGEMAKER_NAMESPACE,
                    name,
                    ("Host",),
                    (),
                    "Average",
                    HOST_LABEL,
                    phrase=f"{facts.name}/",
                    period=hosts_period,
                )
                for fld, name in HOST_METRICS.items()
                if fld in SAGEMAKER_HOST_METRICS_READ
            }
        )
        job_dim = ((contract.DIM_JOB, facts.name),)
        idle = agent_search(contract.LOG_IDLE_SECONDS, job_dim, "Maximum", hosts_period)
        return self._beyond_one_search(replace(reads, log_idle=idle), facts)

    def _platform_host_dimensions(self, job: str, host: str) -> tuple[tuple[str, str], ...]:
        return tuple(host_dimensions(job, host).items())

    def _platform_series(
        self,
        facts: JobFacts,
        host: str,
        reads: JobReads,
        found: dict[MetricQuery, dict[str, Series]],
        per_host: dict[MetricQuery, dict[str, Series]],
    ) -> dict[str, Series]:
        # only what the engine reads (core.reading): the other fields stay empty
        series = dict.fromkeys(HOST_METRICS, Series())
        return series | {
            fld: _divided(per_host[search].get(host, Series()), _divisor(facts, host, fld))
            for fld, search in reads.platform.items()
        }

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
        """Each host's newest event as the sweeper last published it (its `LogIdleSeconds`) or as the caller knows
        it, raised by the lines read."""
        if reads.log_idle is None:
            return {}
        known = self._known_freshness(facts, per_host, reads, freshness, now)
        patterns = self.policy.for_job(facts.tags).line_patterns
        return read_tails(self.clients.logs, STREAMS, facts.name, hosts, known, now, patterns, stacks_since)


ADAPTER = SageMakerPlatform


def _divisor(facts: JobFacts, host: str, field_name: str) -> int:
    """SageMaker sums a host's devices: GPU fields over its GPUs, CPU over its vCPUs (the host's own type's)."""
    if field_name == "cpu_util":
        return facts.vcpus_on(host)
    return facts.gpus_on(host) or 1  # a CPU-only host (a heterogeneous cluster's data group) has no GPU data


def _divided(series: Series, divisor: float) -> Series:
    return Series(tuple((t, v / divisor) for t, v in series.points))


def create_training_job(clients: Any, request: dict[str, Any]) -> ResumeResult:
    """CreateTrainingJob of the next attempt. A job of that name that carries this attempt's chain tags was created
    by an earlier call whose answer was lost (a timeout, a 5xx after SageMaker took it): started, not failed."""
    name = request["TrainingJobName"]
    try:
        arn = clients.sagemaker.create_training_job(**request)["TrainingJobArn"]
    except (ClientError, BotoCoreError) as exc:
        failed = failure(f"CreateTrainingJob {name}", exc)
        if (failed.code == NAME_IN_USE or ALREADY_EXISTS in failed.detail) and _created_by(clients, request):
            return ResumeResult(ok=True, detail=f"CreateTrainingJob {name}: created by an earlier try ({failed.code})")
        return failed
    return ResumeResult(ok=True, detail=f"CreateTrainingJob {arn}")


def _created_by(clients: Any, request: dict[str, Any]) -> bool:
    """Whether the existing job named in `request` is the one `request` creates (the same chain tags)."""
    wanted = {t["Key"]: t["Value"] for t in request.get("Tags", []) if t["Key"] in (RESUMED_FROM_TAG, ATTEMPT_TAG)}
    try:
        _, tags = describe_training_job(clients, request["TrainingJobName"])
    except (ClientError, BotoCoreError):
        return False
    return len(wanted) == 2 and all(tags.get(k) == v for k, v in wanted.items())
