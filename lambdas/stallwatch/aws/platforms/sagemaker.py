"""SageMaker training jobs: facts from DescribeTrainingJob, host metrics from SageMaker's own, logs from
``/aws/sagemaker/TrainingJobs``, stopped with StopTrainingJob.

A job's reads do not grow with its hosts: each host metric is one SEARCH over all of them (`metric_reads`), each
host's log freshness is the sweeper's `LogIdleSeconds`, and its log tail is at most two pages (`log_reads`).
SageMaker publishes GPU/CPU utilization summed over a host's devices: divided after the read by each host's own
type's devices, as a heterogeneous job's hosts differ (see docs/lambdas.md).
"""

from __future__ import annotations

import re
from dataclasses import replace

from botocore.exceptions import ClientError

from stallwatch.aws.log_reads import HostLog, read_tails
from stallwatch.aws.metric_reads import MetricQuery, SearchRef
from stallwatch.aws.source import AwsSignalSource, JobNotFoundError, JobReads, agent_search
from stallwatch.core import clusters, contract
from stallwatch.core.platforms.interface import StopResult
from stallwatch.core.platforms.sagemaker import HOST_METRICS, SAGEMAKER, host_dimensions
from stallwatch.core.pricing import instance_spec
from stallwatch.core.reading import SAGEMAKER_HOST_METRICS_READ
from stallwatch.core.signals import JobFacts, Platform, Series

HOST_LABEL = "${PROP('Dim.Host')}"  # "<job>/algo-N"
# SageMaker's answer to StopTrainingJob on a job that is not running: "... the training job is in status Stopped."
NOT_RUNNING = re.compile(r"in status (Stopping|Stopped|Completed|Failed)")


class SageMakerPlatform(AwsSignalSource):
    """`PlatformAdapter` of SageMaker training jobs."""

    platform = Platform.SAGEMAKER
    description = SAGEMAKER

    def facts(self, job_name: str) -> JobFacts:
        sagemaker = self.clients.sagemaker
        try:
            job = sagemaker.describe_training_job(TrainingJobName=job_name)
        except sagemaker.exceptions.ClientError as exc:
            if exc.response["Error"]["Code"] in ("ValidationException", "ResourceNotFound"):
                raise JobNotFoundError(f"training job {job_name!r}: {exc.response['Error']['Message']}") from exc
            raise
        tags = sagemaker.list_tags(ResourceArn=job["TrainingJobArn"]).get("Tags", [])
        layout = clusters.sagemaker_layout(job["ResourceConfig"])
        spec = instance_spec(layout.instance_type)
        history = tuple((t["StartTime"].timestamp(), t["Status"]) for t in job.get("SecondaryStatusTransitions", []))
        start = job.get("TrainingStartTime") or job["CreationTime"]
        return JobFacts(
            name=job_name,
            platform=Platform.SAGEMAKER,
            status=job["TrainingJobStatus"],
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
            error = exc.response["Error"]
            if error["Code"] == "ValidationException" and NOT_RUNNING.search(error.get("Message", "")):
                return StopResult(ok=True, detail=f"already not running: {error['Message']}")
            return StopResult(ok=False, detail=f"StopTrainingJob {name}: {error['Code']}: {error.get('Message', '')}")
        return StopResult(ok=True, detail=f"StopTrainingJob {name} accepted")

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
    ) -> dict[str, HostLog]:
        """Each host's newest event as the sweeper last published it (its `LogIdleSeconds`) or as the caller knows
        it, raised by the lines read."""
        if reads.log_idle is None:
            return {}
        effective = self.policy.for_job(facts.tags)
        period = reads.log_idle.period or effective.thresholds.alarm_period_seconds
        known = {
            host: min(t + period - idle, now)  # the datapoint's period holds the publication: its end is an upper bound
            for host, series in per_host[reads.log_idle].items()
            if series.points
            for t, idle in [series.points[-1]]
        }
        for host, t in freshness.items():
            known[host] = max(known.get(host, t), t)
        return read_tails(self.clients.logs, facts.name, hosts, known, now, effective.line_patterns)


def _divisor(facts: JobFacts, host: str, field_name: str) -> int:
    """SageMaker sums a host's devices: GPU fields over its GPUs, CPU over its vCPUs (the host's own type's)."""
    if field_name == "cpu_util":
        return facts.vcpus_on(host)
    return facts.gpus_on(host) or 1  # a CPU-only host (a heterogeneous cluster's data group) has no GPU data


def _divided(series: Series, divisor: float) -> Series:
    return Series(tuple((t, v / divisor) for t, v in series.points))
