"""EC2 jobs: the instances tagged ``stallwatch:job=<name>`` (or one tagged ``stallwatch:monitor=true``, named by its
id), read with DescribeInstances, their CloudWatch agent metrics by SEARCHes over parts of the job's instances, their
logs from their instance-id streams in the job's log group (read as a whole); stopped with StopInstances, resumed by
starting the same instances again (StartInstances: the user's launch script resumes from the checkpoint), restarted
in place on them (its way back, `ec2_restart`), a run being each start of the group (`ec2_goodput`). A decision's reads
do not grow with the nodes (docs/lambdas.md, "Scale").

The CloudWatch agent's ``nvidia_smi_*`` metrics are aggregated by InstanceId, per device already (see docs/lambdas.md).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from botocore.exceptions import BotoCoreError, ClientError

from stallwatch.aws import autoscaling
from stallwatch.aws.api_errors import api_error
from stallwatch.aws.log_reads import WHOLE_GROUP, HostLog, JobStreams, read_tails
from stallwatch.aws.metric_reads import MetricQuery, SearchRef
from stallwatch.aws.observability import logger, metrics
from stallwatch.aws.platforms import ec2_restart
from stallwatch.aws.platforms.ec2_events import InstanceStateChange
from stallwatch.aws.platforms.ec2_goodput import ec2_run_spans, stop_time
from stallwatch.aws.resume import failure
from stallwatch.aws.source import AwsSignalSource, JobNotFoundError, JobReads, agent_search, host_parts
from stallwatch.aws.store import Store, job_key
from stallwatch.core import alarms, contract
from stallwatch.core import resume as planning
from stallwatch.core.contract import CWAGENT_DIM_INSTANCE, CWAGENT_GPU_POWER, CWAGENT_NAMESPACE
from stallwatch.core.doctor_checks import PROBE_INSTANCE, RESUMING_ROLES, Check, Probe, StackFound, Status, stop_probes
from stallwatch.core.goodput import JobSpan
from stallwatch.core.platforms import ec2_clusters as clusters
from stallwatch.core.platforms.cloudwatch_agent import HOST_METRICS, HOST_METRICS_READ, memory_percent
from stallwatch.core.platforms.ec2 import EC2, EC2_STREAM
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
    Teller,
    WayBackAttempt,
    WayBackResult,
)
from stallwatch.core.policy import EC2_MONITOR_TAG
from stallwatch.core.pricing import instance_spec, neuron
from stallwatch.core.reading import FILTER_STREAMS_LIMIT
from stallwatch.core.resume import NoResume, ResumePlan, StopRecord
from stallwatch.core.signals import JobFacts, JobStatus, Platform, Series

INSTANCES_PAGE = 1000  # DescribeInstances MaxResults: 5 to 1,000 (not with InstanceIds)
RECENT_STREAM_PAGES = 2  # pages of a log group's most recently written streams read before asking per host
# The instances a sweep looks at: running, and tagged with a job or the monitor tag (EC2 filters match tag values
# exactly, so the values are matched in code, as `clusters.job_of` does).
WATCHED_FILTERS = [
    {"Name": "tag-key", "Values": [clusters.JOB_TAG, EC2_MONITOR_TAG]},
    {"Name": "instance-state-name", "Values": ["running"]},
]
NOT_RUNNING_CODES = frozenset({"IncorrectInstanceState"})
RUNNING = "running"
ENDED = frozenset({"stopping", "stopped", "shutting-down", "terminated"})
STOPPED = "stopped"  # where a resume may follow Stallwatch's stop
RUN_ENDS = frozenset({STOPPED, "terminated"})  # an EC2 job's run may end (resume or summary)
STOP_INSTANCES, START_INSTANCES = "ec2:StopInstances", "ec2:StartInstances"
GPU_POWER_FIX = (
    "add \"power_draw\" to nvidia_gpu's measurement in the CloudWatch agent's configuration (deploy/ec2/"
    "cloudwatch-agent.json, the Ec2AgentConfigParameter) and restart the agent: with GPU power the engine "
    "decides a silent hang sooner"
)


class Ec2Platform(AwsSignalSource):
    """`PlatformAdapter` of EC2 jobs (instance groups)."""

    platform = Platform.EC2
    description = EC2
    state_event = InstanceStateChange
    state_rule = "EC2 instance states rule"

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

    def _job_of_stream(self, stream: str) -> str | None:
        """A stream is named by its instance's id (one DescribeInstances): the job its tags name, if watched."""
        match = EC2_STREAM.match(stream)
        if match is None:
            return None
        try:
            instance = self.instance(match["host"])
        except JobNotFoundError:
            return None
        return clusters.job_of(_tags(instance), instance["InstanceId"])

    def running_jobs(self, now: float) -> dict[str, JobFacts | None]:
        """Every watched EC2 job with a running instance, from one paginated DescribeInstances."""
        groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for instance in self._describe_instances(Filters=WATCHED_FILTERS):
            name = clusters.job_of(_tags(instance), instance["InstanceId"])
            if name is not None:
                groups[name].append(instance)
        return {name: self._group_facts(name, instances) for name, instances in sorted(groups.items())}

    def newest_log_lines(self, jobs: dict[str, JobFacts | None], now: float) -> list[tuple[str, str, float]]:
        """Each host's newest log line from its instance-id streams in the job's log group (one DescribeLogStreams a
        job when every node logs); one job's failure costs its log idleness, not the sweep."""
        found = []
        for job, facts in jobs.items():
            if facts is None:
                continue
            try:
                freshness = self.log_freshness(facts)
            except Exception:
                logger.exception("could not read an EC2 job's log streams", extra={"job": job})
                metrics.add_metric(name=contract.SWEEP_ERRORS, unit=MetricUnit.Count, value=1)
                continue
            found += [(job, host, t) for host, t in sorted(freshness.items())]
        return found

    def job_change(self, event: InstanceStateChange) -> JobChange:
        """An instance's state change concerns its job (`clusters.job_of`): an instance that starts or stops updates
        the job's alarms (one set per instance), and the job ends when its last instance stops or terminates."""
        instance, state = event.detail.instance_id, event.detail.state
        if state not in (RUNNING, *ENDED):
            return JobChange(Change.IGNORED, instance, state, reason=f"state {state}")
        try:
            tags = _tags(self.instance(instance))
        except JobNotFoundError:  # gone already (or never was): only a one-instance job's alarms and state can be its
            return JobChange(Change.RETIRED, instance, state, gone=True)
        job = clusters.job_of(tags, instance)
        if job is None and state in ENDED:  # untagged since: whatever alarms it had go
            return JobChange(Change.RETIRED, instance, state)
        if job is None:
            reason = clusters.job_tag_error(tags) or f"not tagged {clusters.JOB_TAG} or {EC2_MONITOR_TAG}=true"
            return JobChange(Change.IGNORED, instance, state, reason=reason)
        if state == RUNNING:
            return JobChange(Change.STARTED, job, state)
        return JobChange(
            Change.HOST_ENDED, job, state, host=instance, stopped=state == STOPPED, run_may_end=state in RUN_ENDS
        )

    def plan_resume(self, name: str, stop: StopRecord, max_restarts: int, history: RestartHistory) -> ResumeVerdict:
        """An EC2 job restarts under its own name: its restarts are its earlier claims and restarts in place, its
        best step the one its earlier stalls had reached. EC2 moves LaunchTime on every start: the stopped
        attempt's start is kept for the goodput report."""
        facts = self.facts(name)
        tags = facts.tags
        done, earlier = history(stop.at)
        audit = {planning.LAUNCHED_FIELD: facts.start_time}
        verdict = planning.next_attempt(tags, stop, max_restarts, done, max(earlier, default=None))
        if isinstance(verdict, NoResume):
            return ResumeVerdict(verdict, audit)
        if not planning.has_checkpoint({}, tags):  # an instance has no CheckpointConfig: the tag names it
            refusal = NoResume(f"cannot resume: no checkpoint (no {planning.CHECKPOINT_TAG} tag)", alert=True)
            return ResumeVerdict(refusal, audit)
        attempt, allowed = verdict
        best = max([*earlier, *([stop.step] if stop.step is not None else [])], default=None)
        request = {"InstanceIds": list(facts.instance_ids)}
        return ResumeVerdict(ResumePlan(name, attempt, allowed, request, best_step=best), audit)

    def start_attempt(self, plan: ResumePlan) -> ResumeResult:
        return start_instances(self.clients, tuple(plan.request["InstanceIds"]))

    def run_end(self, facts: JobFacts) -> float | None:
        return facts.start_time  # the group's latest start: each start of it is an attempt of the job's run

    def run_spans(self, store: AuditTrail | None, job: str, now: float, period: int) -> tuple[str, list[JobSpan]]:
        return ec2_run_spans(self.clients, self.instances(job), store, job, now, period)

    def nodes(self, job: str) -> list[Node]:
        """The job's instances, each with its Auto Scaling group (one that replaces it when marked unhealthy)."""
        return [
            Node(i["InstanceId"], i["State"]["Name"] == RUNNING, autoscaling.group_of(i)) for i in self.instances(job)
        ]

    def way_back(self, attempt: WayBackAttempt, teller: Teller) -> WayBackResult:
        """Restart in place (`ec2_restart`): the health check, or a move's hosts taken out, then the restart."""
        return ec2_restart.begin(self._restarts(teller), attempt)

    def continue_way_back(self, now: float, teller: Teller) -> list[dict[str, Any]]:
        return ec2_restart.continue_recoveries(self._restarts(teller), now)

    def way_back_under_way(self, job: str) -> bool:
        return ec2_restart.under_way(self._store, job_key(self.platform, job))

    def _restarts(self, teller: Teller) -> ec2_restart.RestartContext:
        return ec2_restart.RestartContext(self, self.clients, self.config, self._store, self.documents, teller)

    @property
    def _store(self) -> Store:
        if self.store is None:
            raise ValueError("recovery in place keeps its steps in the deployment's table: no table given")
        return self.store

    def iam_probes(self, region: str, account: str) -> list[Probe]:
        """Stops only of instances tagged to be stopped (unless the policy allows any); starts (a resume) only of
        instances tagged for resume."""
        instance = f"arn:aws:ec2:{region}:{account}:instance/{PROBE_INSTANCE}"
        resume = {f"aws:ResourceTag/{planning.RESUME_TAG}": "2"}
        return [
            *stop_probes(STOP_INSTANCES, instance, self.policy.stop_requires_tag),
            *(
                probe
                for role in RESUMING_ROLES
                for probe in (
                    Probe(role, START_INSTANCES, instance, resume, True),
                    Probe(role, START_INSTANCES, instance, {}, False),
                )
            ),
        ]

    def doctor(self, found: StackFound) -> Iterator[Check]:
        """The rule of its instances' state changes, and each running job's GPU power."""
        yield from super().doctor(found)
        yield from self._gpu_power()

    def _gpu_power(self) -> Iterator[Check]:
        """Each running job's GPU instances publish GPU power (the CloudWatch agent's `nvidia_smi_power_draw`): without
        the training agent, power is what tells a hung collective (busy GPUs drawing less, logs silent) from work, so
        the engine decides a silent hang sooner with it than from the job's history of silences alone. A Neuron
        instance (Trainium) has no NVIDIA power to publish: its power is the training agent's."""
        jobs = {name: facts or self.facts(name) for name, facts in self.running_jobs(self.clock()).items()}
        if not jobs:
            yield Check("EC2 GPU power", Status.OK, "no EC2 job is running")
            return
        powered = self._instances_publishing(CWAGENT_GPU_POWER)
        for name, facts in jobs.items():
            hosts = [
                h
                for h in self.description.host_names(facts)
                if not neuron(facts.host_types.get(h, facts.instance_type))
            ]
            silent = [i for i in hosts if i not in powered]
            if not hosts:
                yield Check(f"EC2 GPU power {name}", Status.OK, "no GPU instance: Neuron power is the training agent's")
            elif silent:
                detail = (
                    f"{len(silent)} of {len(hosts)} instances publish no {CWAGENT_GPU_POWER} "
                    f"({', '.join(silent[:3])}{', ...' if len(silent) > 3 else ''})"
                )
                yield Check(f"EC2 GPU power {name}", Status.WARN, detail, GPU_POWER_FIX)
            else:
                yield Check(f"EC2 GPU power {name}", Status.OK, f"{len(hosts)} instances publish it")

    def _instances_publishing(self, metric: str) -> set[str]:
        """The instances the CloudWatch agent published `metric` for in the last 3 hours (ListMetrics, 500 a page)."""
        pages = self.clients.cloudwatch.get_paginator("list_metrics").paginate(
            Namespace=CWAGENT_NAMESPACE, MetricName=metric, RecentlyActive="PT3H"
        )
        return {
            dimension["Value"]
            for page in pages
            for found in page["Metrics"]
            for dimension in found.get("Dimensions", [])
            if dimension["Name"] == CWAGENT_DIM_INSTANCE
        }

    def history(self, job: str) -> JobHistory:
        """From the first LaunchTime (t = 0) to the latest stop time once none runs; its hosts' streams."""
        facts = self.facts(job)
        ended = None
        if (
            facts.status is not JobStatus.RUNNING
        ):  # only a stopped job needs its stop time, which the facts do not carry
            stops = [stop_time(self.instance(i)) for i in facts.instance_ids]
            ended = max(stops) if stops and None not in stops else None  # type: ignore[type-var]
        group = facts.log_group or self.config.ec2_log_group
        streams = [s["logStreamName"] for s in self.log_streams(facts)]
        selections = tuple(
            {"logGroupName": group, "logStreamNames": streams[offset : offset + FILTER_STREAMS_LIMIT]}
            for offset in range(0, len(streams), FILTER_STREAMS_LIMIT)
        )
        return JobHistory(
            facts=facts,
            start=facts.start_time,
            ended=ended,
            changes=((facts.start_time, JobStatus.RUNNING, None),),
            final=(facts.status, None) if facts.status is not JobStatus.RUNNING else None,
            log_selections=selections,
        )

    def _describe_instances(self, **request: Any) -> list[dict[str, Any]]:
        """Every page; a filtered request asks `INSTANCES_PAGE` a page (AWS's most), a job of 1,000 nodes one call."""
        paging = {} if "InstanceIds" in request else {"PaginationConfig": {"PageSize": INSTANCES_PAGE}}
        pages = self.clients.ec2.get_paginator("describe_instances").paginate(**request, **paging)
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
        stacks_since: float | None = None,
    ) -> dict[str, HostLog]:
        """The hosts' tails from their log group as a whole (`log_reads.read_tails`: a job's instance-id streams
        share no prefix, and naming them is 100 streams a call), each line's stream telling its host; their newest
        events as the sweeper last published them (`LogIdleSeconds`) or the caller knows them."""
        known = self._known_freshness(facts, per_host, reads, freshness, now)
        instances = set(facts.instance_ids)
        group = facts.log_group or self.config.ec2_log_group
        streams = JobStreams(group, WHOLE_GROUP, lambda stream, _: _host_of(stream, instances))
        patterns = self.policy.for_job(facts.tags).line_patterns
        return read_tails(self.clients.logs, streams, facts.name, hosts, known, now, patterns, stacks_since)

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
            error = api_error(exc)
            return error.code, error.message
        return None

    def _platform_reads(self, facts: JobFacts, reads: JobReads, hosts_period: int | None) -> JobReads:
        """The CloudWatch agent's series by InstanceId, labelled "job host" as the agent's are, and the sweeper's
        `LogIdleSeconds`; every host series read by SEARCHes over parts of the job's instances (`host_parts`),
        as the CloudWatch agent's series carry no job: a job of 1,000 instances is one GetMetricData call."""
        label = f"{facts.name} ${{PROP('Dim.{contract.CWAGENT_DIM_INSTANCE}')}}"
        platform = {
            fld: SearchRef(ns, name, (contract.CWAGENT_DIM_INSTANCE,), (), "Average", label, period=hosts_period)
            for fld, (ns, name) in HOST_METRICS.items()
            if fld in HOST_METRICS_READ
        }
        idle = agent_search(contract.LOG_IDLE_SECONDS, ((contract.DIM_JOB, facts.name),), "Maximum", hosts_period)
        reads = replace(reads, platform=platform, log_idle=idle)
        return replace(reads, parts=host_parts(reads.searches(), alarms.host_names(facts)))

    def _platform_series(
        self,
        facts: JobFacts,
        host: str,
        reads: JobReads,
        found: dict[MetricQuery, dict[str, Series]],
        per_host: dict[MetricQuery, dict[str, Series]],
    ) -> dict[str, Series]:
        series = {fld: per_host[search].get(host, Series()) for fld, search in reads.platform.items()}
        memory = memory_percent(series.pop("gpu_mem_used"), series.pop("gpu_mem_total"))
        return series | {"gpu_mem_util": memory, "cpu_util": Series()}  # cpu_util: no rule reads it


ADAPTER = Ec2Platform


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


def start_instances(clients: Any, instance_ids: tuple[str, ...]) -> ResumeResult:
    """StartInstances of the stopped group; the user's launch script resumes training from the checkpoint."""
    if not instance_ids:
        raise ValueError("instance_ids is empty: an EC2 job needs the instances to start")
    try:
        response = clients.ec2.start_instances(InstanceIds=list(instance_ids))
    except (ClientError, BotoCoreError) as exc:
        return failure(f"StartInstances {list(instance_ids)}", exc)
    states = {i["InstanceId"]: i["CurrentState"]["Name"] for i in response.get("StartingInstances", [])}
    return ResumeResult(ok=True, detail=f"StartInstances: {states}")
