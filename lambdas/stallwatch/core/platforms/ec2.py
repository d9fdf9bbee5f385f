"""EC2 jobs as Stallwatch sees them: the instances tagged ``stallwatch:job=<name>`` (or one instance tagged
``stallwatch:monitor=true``, named by its id), hosts named by instance id, GPU metrics from the CloudWatch agent's
``nvidia_smi_*`` aggregated by ``InstanceId`` (per device already), logs in streams named by instance id
(``i-...`` or ``i-.../<file>``) in the job's log group (`core.clusters` groups the instances)."""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence

from stallwatch.core import clusters, contract
from stallwatch.core.config import StallwatchConfig
from stallwatch.core.platforms.interface import HostMove, MetricMath, PlatformDescription, SeriesReader
from stallwatch.core.policy import EC2_MONITOR_TAG, RECOVER_RESTART, RECOVER_TAG, STOP_OPT_IN_TAG, STOP_OPT_IN_VALUE
from stallwatch.core.reading import EC2_HOST_AGENT_METRICS_READ, EC2_STREAM
from stallwatch.core.recovery import TagError, recovers_in_place
from stallwatch.core.signals import JobFacts, Platform, Series

# Platform metrics per host: HostSignals field (or the two memory series) -> (namespace, metric name).
HOST_METRICS = {
    "gpu_util": (contract.CWAGENT_NAMESPACE, contract.CWAGENT_GPU_UTILIZATION),
    "gpu_mem_used": (contract.CWAGENT_NAMESPACE, contract.CWAGENT_GPU_MEMORY_USED),
    "gpu_mem_total": (contract.CWAGENT_NAMESPACE, contract.CWAGENT_GPU_MEMORY_TOTAL),
    "cpu_util": (contract.EC2_NAMESPACE, "CPUUtilization"),
    "gpu_power": (contract.CWAGENT_NAMESPACE, contract.CWAGENT_GPU_POWER),
}
# The CloudWatch agent's series a decision reads (`cpu_util` is no rule's: SageMaker's is not read either).
HOST_METRICS_READ = ("gpu_util", "gpu_mem_used", "gpu_mem_total", "gpu_power")
# A job is its `stallwatch:job` tag or an instance id.
JOB_NAME = re.compile(f"(?:{clusters.INSTANCE_ID.pattern})|(?:{clusters.JOB_NAME.pattern})")


def host_dimensions(host: str) -> dict[str, str]:
    return {contract.CWAGENT_DIM_INSTANCE: host}


def memory_percent(used: Series, total: Series) -> Series:
    """100 x used / total at the timestamps both have."""
    totals = dict(total.points)
    return Series(tuple((t, 100 * v / totals[t]) for t, v in used.points if totals.get(t)))


class Ec2Description(PlatformDescription):
    platform = Platform.EC2
    label = "EC2"
    job_kind = "an EC2 job"
    job_name = JOB_NAME
    name_hint = clusters.INSTANCE_ID
    monitor_setting = "monitor_ec2"
    resource = "an EC2 job"
    host_agent_metrics = EC2_HOST_AGENT_METRICS_READ
    host_series_read = len(EC2_HOST_AGENT_METRICS_READ) + len(HOST_METRICS_READ) + 1  # and LogIdleSeconds
    named_hosts = True
    restarts_in_place = True
    configured_logs = True
    agent_power = True
    instance_hosts = True
    host_move = HostMove.RESTART
    host_move_tags = f"{STOP_OPT_IN_TAG}={STOP_OPT_IN_VALUE} and {RECOVER_TAG}={RECOVER_RESTART}"

    def unwatched(self, facts: JobFacts) -> str | None:
        """A job is its instances' `stallwatch:job` tag, or a lone instance tagged `stallwatch:monitor=true`."""
        if clusters.job_of(facts.tags, facts.name) == facts.name:
            return None
        return f"not tagged {clusters.JOB_TAG}={facts.name} or {EC2_MONITOR_TAG}=true"

    def hosts(self, instance_count: int, instance_ids: Sequence[str]) -> list[str]:
        """Instance ids: every instance of the job's group."""
        return list(instance_ids)

    def host_of_instance(self, facts: JobFacts, instance: str) -> str | None:
        """Its hosts are its instances."""
        return instance if instance in facts.instance_ids else None

    def moves_off_hosts(self, facts: JobFacts) -> bool:
        """`stallwatch:recover=restart`: the job is restarted in place without the host (a bad tag value: not)."""
        try:
            return recovers_in_place(facts.tags)
        except TagError:
            return False

    def gpu_utilization(self, facts: JobFacts, host: str) -> MetricMath:
        metric = (*HOST_METRICS["gpu_util"], host_dimensions(host))
        return MetricMath({"m1": metric}, "m1", "GPU utilization per GPU")

    def gpu_memory(self, facts: JobFacts, host: str) -> MetricMath:
        used = (*HOST_METRICS["gpu_mem_used"], host_dimensions(host))
        total = (*HOST_METRICS["gpu_mem_total"], host_dimensions(host))
        return MetricMath({"m1": used, "m2": total}, "100 * m1 / m2", "GPU memory used per GPU")

    def host_of_stream(self, stream: str, job: str, hosts: Collection[str]) -> str | None:
        match = EC2_STREAM.match(stream)
        return match["host"] if match is not None and match["host"] in hosts else None

    def log_group(self, config: StallwatchConfig) -> str | None:
        """The deployment's EC2 group (a job's `stallwatch:log-group` tag may name another, which no filter of ours
        subscribes)."""
        return config.ec2_log_group

    def host_series(self, facts: JobFacts, host: str, read: SeriesReader) -> dict[str, Series]:
        """The CloudWatch agent's series are per device already; memory is a percentage of the total."""
        dims = host_dimensions(host)
        series = {name: read(ns, metric, dims, 1.0) for name, (ns, metric) in HOST_METRICS.items()}
        series["gpu_mem_util"] = memory_percent(series.pop("gpu_mem_used"), series.pop("gpu_mem_total"))
        return series


EC2 = Ec2Description()
