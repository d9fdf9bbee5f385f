"""SageMaker training jobs as Stallwatch sees them: named by SageMaker, hosts ``algo-1..algo-N``, GPU and CPU
metrics summed over a host's devices in ``/aws/sagemaker/TrainingJobs`` (dimension ``Host=<job>/algo-N``), logs in
streams ``<job>/algo-N-<epoch>``."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from pydantic import Field

from stallwatch.core import contract
from stallwatch.core.platforms.interface import (
    InstanceLayout,
    MetricMath,
    PlatformDescription,
    PlatformSettings,
    SeriesReader,
)
from stallwatch.core.reading import HOST_AGENT_METRICS_READ
from stallwatch.core.signals import JobFacts, Platform, Series
from stallwatch.core.way_back import WayBack

# Platform metrics per host: HostSignals field -> SageMaker's metric name.
HOST_METRICS = {
    "gpu_util": "GPUUtilization",
    "gpu_mem_util": "GPUMemoryUtilization",
    "cpu_util": "CPUUtilization",
}


# CreateTrainingJob's TrainingJobName: its pattern, and at most 63 characters (the pattern alone allows more hyphens).
JOB_NAME = re.compile(r"^(?=.{1,63}\Z)[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}\Z")
SAGEMAKER_STREAM = re.compile(r"^(?P<job>[^/]+)/(?P<host>algo-\d+)-\d+$")


def stream_host(stream: str) -> tuple[str, str] | None:
    """The (job, host) a stream ``<job>/algo-N-<epoch>`` is of; None for another stream."""
    match = SAGEMAKER_STREAM.match(stream)
    return (match["job"], match["host"]) if match else None


def host_dimensions(job: str, host: str) -> dict[str, str]:
    return {"Host": f"{job}/{host}"}


class SageMakerSettings(PlatformSettings):
    """`platforms.sagemaker`."""

    monitor: bool = Field(True, description="Watch SageMaker training jobs.")
    log_subscription: bool = Field(
        True,
        description="Subscribe /aws/sagemaker/TrainingJobs, shared by every training job of the account and region: "
        "created if absent, subscribed where one of its two subscription filter slots is free (a filter that is not "
        "this deployment's is never removed; `stallwatch doctor` says which hold them).",
    )


class SageMakerDescription(PlatformDescription):
    platform = Platform.SAGEMAKER
    label = "SageMaker"
    job_kind = "a SageMaker job"
    job_name = JOB_NAME
    settings = SageMakerSettings
    way_back = WayBack.RESUME  # a new job from the checkpoint, after Stallwatch's stop (`core.resume`)
    resource = "a SageMaker training job"
    host_agent_metrics = HOST_AGENT_METRICS_READ

    def hosts(self, instance_count: int, instance_ids: Sequence[str]) -> list[str]:
        """algo-1..algo-N, across all instance groups of a heterogeneous cluster."""
        return [f"algo-{i}" for i in range(1, instance_count + 1)]

    def gpu_utilization(self, facts: JobFacts, host: str) -> MetricMath:
        return _per_gpu(facts, host, HOST_METRICS["gpu_util"])

    def gpu_memory(self, facts: JobFacts, host: str) -> MetricMath:
        return _per_gpu(facts, host, HOST_METRICS["gpu_mem_util"])

    def host_of_stream(self, stream: str, job: str, hosts: Collection[str]) -> str | None:
        match = SAGEMAKER_STREAM.match(stream)
        ours = match is not None and match["job"] == job and match["host"] in hosts
        return match["host"] if ours else None

    def log_group(self, nodes_group: str) -> str | None:
        """SageMaker's, shared by every training job of the account and region."""
        return contract.SAGEMAKER_LOG_GROUP

    def host_series(self, facts: JobFacts, host: str, read: SeriesReader) -> dict[str, Series]:
        """SageMaker sums a host's devices: GPU fields over its GPUs, CPU over its vCPUs (the host's own type's)."""
        dims, ns = host_dimensions(facts.name, host), contract.SAGEMAKER_NAMESPACE
        gpus, vcpus = facts.gpus_on(host), facts.vcpus_on(host)
        return {
            "gpu_util": read(ns, HOST_METRICS["gpu_util"], dims, gpus),
            "gpu_mem_util": read(ns, HOST_METRICS["gpu_mem_util"], dims, gpus),
            "cpu_util": read(ns, HOST_METRICS["cpu_util"], dims, vcpus),
        }


def sagemaker_layout(resource_config: Mapping[str, Any]) -> InstanceLayout:
    """Hosts algo-1..algo-N of a training job's ResourceConfig: one instance type, or heterogeneous
    ``InstanceGroups`` ([{InstanceGroupName, InstanceType, InstanceCount}]).

    SageMaker numbers hosts across all groups and does not say which algo-N is in which group (its log streams are
    not grouped either); Stallwatch assigns them in the order of ``InstanceGroups``."""
    groups = resource_config.get("InstanceGroups") or []
    if not groups:
        return InstanceLayout(resource_config["InstanceType"], resource_config["InstanceCount"])
    types = [g["InstanceType"] for g in groups for _ in range(g["InstanceCount"])]
    if not types:
        raise ValueError("ResourceConfig.InstanceGroups holds no instance")
    host_types = {f"algo-{i}": t for i, t in enumerate(types, start=1)}
    return InstanceLayout(types[0], len(types), host_types if len(set(types)) > 1 else {})


def _per_gpu(facts: JobFacts, host: str, metric_name: str) -> MetricMath:
    """SageMaker's GPU metrics are 0-100 x GPUs: divided by the host's GPUs (each group's type's)."""
    metric = (contract.SAGEMAKER_NAMESPACE, metric_name, host_dimensions(facts.name, host))
    return MetricMath({"m1": metric}, f"m1 / {facts.gpus_on(host)}", f"{metric_name} per GPU")


SAGEMAKER = DESCRIPTION = SageMakerDescription()
