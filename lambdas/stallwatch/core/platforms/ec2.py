"""EC2 jobs as Stallwatch sees them: the instances tagged ``stallwatch:job=<name>`` (or one instance tagged
``stallwatch:monitor=true``, named by its id), hosts named by instance id, GPU metrics from the CloudWatch agent's
``nvidia_smi_*`` aggregated by ``InstanceId`` (per device already), logs in streams named by instance id
(``i-...`` or ``i-.../<file>``) in the job's log group (`ec2_clusters` groups the instances)."""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence

from pydantic import Field

from stallwatch.core.platforms import cloudwatch_agent
from stallwatch.core.platforms import ec2_clusters as clusters
from stallwatch.core.platforms.interface import (
    MetricMath,
    PlatformDescription,
    PlatformSettings,
    SeriesReader,
)
from stallwatch.core.policy import EC2_MONITOR_TAG
from stallwatch.core.signals import JobFacts, Platform, Series
from stallwatch.core.way_back import WayBack

# A job is its `stallwatch:job` tag or an instance id.
JOB_NAME = re.compile(f"(?:{clusters.INSTANCE_ID.pattern})|(?:{clusters.JOB_NAME.pattern})")
# Streams named by instance id (the CloudWatch agent's {instance_id}), optionally with a suffix per file.
EC2_STREAM = re.compile(r"^(?P<host>i-[0-9a-f]{8,17})(?:/.*)?$")


class Ec2Settings(PlatformSettings):
    """`platforms.ec2`."""

    monitor: bool = Field(
        True,
        description="Watch EC2 jobs: instances tagged `stallwatch:job=<name>`, or `stallwatch:monitor=true` alone.",
    )
    log_subscription: bool = Field(True, description="Subscribe `ec2_log_group` (the stack creates it).")


class Ec2Description(PlatformDescription):
    platform = Platform.EC2
    label = "EC2"
    job_kind = "an EC2 job"
    job_name = JOB_NAME
    name_hint = clusters.INSTANCE_ID
    settings = Ec2Settings
    resource = "an EC2 job"
    host_agent_metrics = cloudwatch_agent.AGENT_METRICS_READ
    # and LogIdleSeconds
    host_series_read = len(cloudwatch_agent.AGENT_METRICS_READ) + len(cloudwatch_agent.HOST_METRICS_READ) + 1
    named_hosts = True
    way_back = WayBack.RESTART  # in place on its instances (`aws.platforms.ec2_restart`); resumed after a stop too
    configured_logs = True
    instance_hosts = True

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

    def gpu_utilization(self, facts: JobFacts, host: str) -> MetricMath:
        return cloudwatch_agent.gpu_utilization(host)

    def gpu_memory(self, facts: JobFacts, host: str) -> MetricMath:
        return cloudwatch_agent.gpu_memory(host)

    def host_of_stream(self, stream: str, job: str, hosts: Collection[str]) -> str | None:
        match = EC2_STREAM.match(stream)
        return match["host"] if match is not None and match["host"] in hosts else None

    def log_group(self, nodes_group: str) -> str | None:
        """The deployment's EC2 group (a job's `stallwatch:log-group` tag may name another, which no filter of ours
        subscribes)."""
        return nodes_group

    def host_series(self, facts: JobFacts, host: str, read: SeriesReader) -> dict[str, Series]:
        """The CloudWatch agent's series are per device already; memory is a percentage of the total."""
        return cloudwatch_agent.host_series(host, read)


EC2 = DESCRIPTION = Ec2Description()
