"""EC2 jobs: the instances tagged ``stallwatch:job=<name>`` (or one tagged ``stallwatch:monitor=true``, named by its
id), read with DescribeInstances, their CloudWatch agent metrics read per instance by name, their logs from their
instance-id streams in the job's log group; stopped with StopInstances.

The CloudWatch agent's ``nvidia_smi_*`` metrics are aggregated by InstanceId, per device already (see docs/lambdas.md).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from botocore.exceptions import ClientError

from stallwatch.aws.log_reads import HostLog
from stallwatch.aws.metric_reads import MetricQuery, MetricRef
from stallwatch.aws.source import AwsSignalSource, JobNotFoundError, JobReads
from stallwatch.core import alarms, clusters, log_patterns
from stallwatch.core.platforms.ec2 import EC2, HOST_METRICS, host_dimensions, memory_percent
from stallwatch.core.platforms.interface import StopResult
from stallwatch.core.policy import EC2_MONITOR_TAG
from stallwatch.core.pricing import instance_spec
from stallwatch.core.reading import FILTER_STREAMS_LIMIT, LOG_TAIL_SECONDS, LOOKBACK_SECONDS
from stallwatch.core.signals import JobFacts, LogLine, Platform, Series

LOG_TAIL_PAGES = 2  # FilterLogEvents pages of a job's streams
RECENT_STREAM_PAGES = 2  # pages of a log group's most recently written streams read before asking per host
# The instances a sweep looks at: running, and tagged with a job or the monitor tag (EC2 filters match tag values
# exactly, so the values are matched in code, as `clusters.job_of` does).
WATCHED_FILTERS = [
    {"Name": "tag-key", "Values": [clusters.JOB_TAG, EC2_MONITOR_TAG]},
    {"Name": "instance-state-name", "Values": ["running"]},
]
NOT_RUNNING_CODES = frozenset({"IncorrectInstanceState"})


class Ec2Platform(AwsSignalSource):
    """`PlatformAdapter` of EC2 jobs (instance groups)."""

    platform = Platform.EC2
    description = EC2

    def facts(self, job_name: str) -> JobFacts:
        return self._group_facts(job_name, self.instances(job_name))

    def instances(self, job_name: str) -> list[dict[str, Any]]:
        """An EC2 job's instances (DescribeInstances): those tagged `stallwatch:job=<job_name>`, or the untagged
        instance `job_name`; `JobNotFoundError` if there are none."""
        if not clusters.INSTANCE_ID.match(job_name):
            instances = self._describe_instances(Filters=[{"Name": f"tag:{clusters.JOB_TAG}", "Values": [job_name]}])
            if not instances:
                raise JobNotFoundError(f"no EC2 instance is tagged {clusters.JOB_TAG}={job_name!r}")
            return instances
        instance = self.instance(job_name)
        owner = clusters.job_of(_tags(instance), job_name)
        if owner not in (None, job_name):
            raise JobNotFoundError(f"EC2 instance {job_name!r} belongs to job {owner!r}")
        return [instance]

    def instance(self, instance_id: str) -> dict[str, Any]:
        """DescribeInstances of one instance; `JobNotFoundError` if EC2 does not know it."""
        ec2 = self.clients.ec2
        try:
            instances = self._describe_instances(InstanceIds=[instance_id])
        except ec2.exceptions.ClientError as exc:
            if exc.response["Error"]["Code"].startswith("InvalidInstanceID"):
                raise JobNotFoundError(f"EC2 instance {instance_id!r}: {exc.response['Error']['Message']}") from exc
            raise
        if not instances:
            raise JobNotFoundError(f"EC2 instance {instance_id!r} not found")
        return instances[0]

    def watched_jobs(self) -> dict[str, JobFacts]:
        """Every watched EC2 job with a running instance, from one paginated DescribeInstances."""
        groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for instance in self._describe_instances(Filters=WATCHED_FILTERS):
            name = clusters.job_of(_tags(instance), instance["InstanceId"])
            if name is not None:
                groups[name].append(instance)
        return {name: self._group_facts(name, instances) for name, instances in sorted(groups.items())}

    def _describe_instances(self, **request: Any) -> list[dict[str, Any]]:
        pages = self.clients.ec2.get_paginator("describe_instances").paginate(**request)
        return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]

    def _group_facts(self, name: str, instances: list[dict[str, Any]]) -> JobFacts:
        """The job's facts from its instances: hosts, types, status, and one tag set (disagreements reported)."""
        states = {i["InstanceId"]: i["State"]["Name"] for i in instances}
        hosts = clusters.ec2_hosts(states)
        members = [i for i in instances if i["InstanceId"] in hosts]
        layout = clusters.ec2_layout({i["InstanceId"]: i["InstanceType"] for i in members})
        merged = clusters.merge_instance_tags([_tags(i) for i in members], self.policy)
        log_group, log_group_error = clusters.log_group_of(merged.tags, self.config.ec2_log_group)
        errors = [*merged.errors, *filter(None, [clusters.job_tag_error(merged.tags), log_group_error])]
        spec = instance_spec(layout.instance_type)
        return JobFacts(
            name=name,
            platform=Platform.EC2,
            status=clusters.ec2_status(states.values()),
            secondary_status=None,
            start_time=min(i["LaunchTime"].timestamp() for i in members),
            instance_type=layout.instance_type,
            instance_count=layout.instance_count,
            gpus_per_host=spec.devices,
            vcpus_per_host=spec.vcpus,
            tags=merged.tags,
            instance_ids=tuple(hosts),
            host_types=layout.host_types,
            tag_errors=tuple(errors),
            log_group=log_group,
        )

    def log_freshness(self, facts: JobFacts) -> dict[str, float]:
        """Each host's newest log event time, from its streams (named by instance id) in the job's log group."""
        hosts = set(facts.instance_ids)
        return _newest(self.log_streams(facts), lambda stream: _host_of(stream, hosts))

    def log_streams(self, facts: JobFacts) -> list[dict[str, Any]]:
        """The job's hosts' log streams (``i-...`` or ``i-.../<file>``) in its log group.

        The group's most recently written streams first (one call for a job whose hosts log), then one call by prefix
        for each host not among them (quiet for long, never logged, or a group shared by many busy jobs): a group
        that keeps the streams of instances long gone is never listed whole."""
        hosts = set(facts.instance_ids)
        group = facts.log_group or self.config.ec2_log_group
        logs = self.clients.logs
        request: dict[str, Any] = {"logGroupName": group, "orderBy": "LastEventTime", "descending": True}
        found: list[dict[str, Any]] = []
        try:
            for _ in range(RECENT_STREAM_PAGES):
                page = logs.describe_log_streams(**request)
                found += [s for s in page["logStreams"] if _host_of(s["logStreamName"], hosts)]
                if not page.get("nextToken") or hosts <= {_host_of(s["logStreamName"], hosts) for s in found}:
                    break
                request["nextToken"] = page["nextToken"]
        except logs.exceptions.ResourceNotFoundException:
            return []
        missing = hosts - {_host_of(s["logStreamName"], hosts) for s in found}
        streams = [s for host in sorted(missing) for s in self._streams(group, host)]
        return found + [s for s in streams if _host_of(s["logStreamName"], hosts)]

    def _streams(self, log_group: str, prefix: str | None) -> list[dict[str, Any]]:
        paginator = self.clients.logs.get_paginator("describe_log_streams")
        request = {"logGroupName": log_group} | ({"logStreamNamePrefix": prefix} if prefix else {})
        try:
            return [s for page in paginator.paginate(**request) for s in page["logStreams"]]
        except self.clients.logs.exceptions.ResourceNotFoundException:
            return []

    def _host_logs(
        self,
        facts: JobFacts,
        hosts: list[str],
        per_host: dict[MetricQuery, dict[str, Series]],
        reads: JobReads,
        freshness: dict[str, float],
        now: float,
    ) -> dict[str, HostLog]:
        """The hosts' newest event times (their streams) and the lines around the quietest host's last event."""
        instances = set(facts.instance_ids)
        host_of = lambda stream: _host_of(stream, instances)  # noqa: E731 - one line, used twice
        group = facts.log_group or self.config.ec2_log_group
        found = self.log_streams(facts)
        newest = _newest(found, host_of)
        if not newest:
            return {}
        streams = [s["logStreamName"] for s in found]
        window = {
            "startTime": max(int((min(newest.values()) - LOG_TAIL_SECONDS) * 1000), 0),
            "endTime": int(now * 1000),
        }
        logs = {host: HostLog(last_t=t) for host, t in newest.items()}
        patterns = self.policy.for_job(facts.tags).line_patterns
        lookback = {"startTime": max(int((now - LOOKBACK_SECONDS) * 1000), 0), "endTime": int(now * 1000)}
        for i in range(0, len(streams), FILTER_STREAMS_LIMIT):
            selection = {"logGroupName": group, "logStreamNames": streams[i : i + FILTER_STREAMS_LIMIT]}
            if not self._read_lines(selection | window, host_of, logs, LOG_TAIL_PAGES, patterns):
                for pattern in patterns.filter_patterns:  # the pages did not reach now: the notable lines alone
                    self._read_lines(selection | lookback | {"filterPattern": pattern}, host_of, logs, 1, patterns)
        for log in logs.values():
            log.lines.sort(key=lambda line: line.t)
            log.notable.sort(key=lambda line: line.t)
        return logs

    def _read_lines(
        self,
        request: dict[str, Any],
        host_of: Callable[[str], str | None],
        logs: dict[str, HostLog],
        pages: int,
        patterns: log_patterns.LinePatterns,
    ) -> bool:
        """FilterLogEvents pages into each host's lines, or, with a `filterPattern`, its notable lines; whether they
        held the whole window."""
        for _ in range(pages):
            response = self.clients.logs.filter_log_events(**request)
            for event in response.get("events", []):
                host = host_of(event["logStreamName"])
                if host not in logs:
                    continue
                message = event["message"].rstrip("\n")
                line = LogLine.read(event["timestamp"] / 1000, event["logStreamName"], message, patterns)
                log = logs[host]
                if "filterPattern" not in request:
                    log.lines.append(line)
                elif line.pattern or line.marker:
                    log.notable.append(line)
                log.last_t = max(log.last_t or line.t, line.t)
            if not response.get("nextToken"):
                return True
            request["nextToken"] = response["nextToken"]
        return False

    def stop(self, facts: JobFacts) -> StopResult:
        """One StopInstances for all of the job's instances. If it is refused (one instance not tagged for stopping,
        or in a state that cannot stop, refuses the whole call), each instance is stopped on its own, so the others
        stop and the refusals are named; the result is ok only when every instance is stopping."""
        instance_ids = facts.instance_ids
        if not instance_ids:
            return StopResult(ok=True, detail="no instance left to stop", stopped=0, targets=0)
        error = self._stop_call(list(instance_ids))
        refused: dict[str, str] = {}
        if error is not None and len(instance_ids) == 1:
            refused = {} if error[0] in NOT_RUNNING_CODES else {instance_ids[0]: f"{error[0]}: {error[1]}"}
        elif error is not None:
            for instance_id in instance_ids:
                own = self._stop_call([instance_id])
                if own is not None and own[0] not in NOT_RUNNING_CODES:
                    refused[instance_id] = f"{own[0]}: {own[1]}"
        stopped = len(instance_ids) - len(refused)
        detail = f"StopInstances: {stopped} of {len(instance_ids)} instances stopping"
        if refused:
            detail += "; refused: " + "; ".join(f"{i}: {why}" for i, why in sorted(refused.items()))
        return StopResult(ok=not refused, detail=detail, stopped=stopped, targets=len(instance_ids))

    def _stop_call(self, instance_ids: list[str]) -> tuple[str, str] | None:
        """StopInstances for `instance_ids`: None when accepted, else the error's code and message (already stopping
        or stopped instances are accepted; one that is neither yet cannot stop answers IncorrectInstanceState)."""
        try:
            self.clients.ec2.stop_instances(InstanceIds=instance_ids)
        except ClientError as exc:
            error = exc.response["Error"]
            return error["Code"], error.get("Message", "")
        return None

    def _platform_reads(self, facts: JobFacts, reads: JobReads, hosts_period: int | None) -> JobReads:
        for host in alarms.host_names(facts):
            dims = tuple(host_dimensions(host).items())
            reads.instances.update({(host, fld): MetricRef(ns, name, dims) for fld, (ns, name) in HOST_METRICS.items()})
        return reads

    def _platform_series(
        self,
        facts: JobFacts,
        host: str,
        reads: JobReads,
        found: dict[MetricQuery, dict[str, Series]],
        per_host: dict[MetricQuery, dict[str, Series]],
    ) -> dict[str, Series]:
        series = {fld: found[ref][""] for (ref_host, fld), ref in reads.instances.items() if ref_host == host}
        series["gpu_mem_util"] = memory_percent(series.pop("gpu_mem_used"), series.pop("gpu_mem_total"))
        return series


def _host_of(stream: str, hosts: set[str]) -> str | None:
    return EC2.host_of_stream(stream, "", hosts)


def _newest(streams: list[dict[str, Any]], host_of: Callable[[str], str | None]) -> dict[str, float]:
    """Per host, the newest event time of its streams (epoch seconds)."""
    newest: dict[str, float] = {}
    for stream in streams:
        host = host_of(stream["logStreamName"])
        last_ms = stream.get("lastEventTimestamp") or stream.get("lastIngestionTime")
        if host and last_ms:
            newest[host] = max(newest.get(host, 0.0), last_ms / 1000)
    return newest


def _tags(instance: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
