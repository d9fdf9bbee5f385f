"""Policy -> the per-job CloudWatch alarms: one definition for the Lambdas, the replay and the demo.

    for kwargs in render_alarms(facts, effective_policy, "stallwatch-", [on_alarm_arn]):
        cloudwatch.put_metric_alarm(**kwargs)

Alarm names are ``{prefix}{platform}.{job}.{kind}[.{host}]``; ``.`` never occurs in SageMaker job
names, EC2 instance ids or host names, so `parse_alarm_name` can split them back.

Alarms are triggers, not verdicts: each one only makes the engine look at the job. The progress and GPU alarms fire
after ``crash_confirm_minutes``, the earliest the engine may decide (conclusive evidence: a rank dead with its GPUs,
a vanished host, a collective spinning on every host); the log alarm after ``agreement_fraction`` of its threshold.
Every later rung (signals that agree, a lone signal's full threshold, the warning's grace) is a time the decision
names (``Decision.recheck_at``), and the runtime decides again then. Kinds:

- ``gpu-idle`` (per host): GPU utilization per device below ``idle_gpu_percent`` for ``crash_confirm_minutes``.
- ``gpu-memory`` (per host): GPU memory per device below ``idle_gpu_percent`` for `GPU_MEMORY_PERIODS` periods
  (ALARM): the training process on that host let go of its GPUs (a crashed rank, every process gone after NCCL's
  watchdog tore a hang down: evidence with a fatal line that decides within a minute); or no datapoint at all over
  its evaluation range (INSUFFICIENT_DATA, missing data treated as missing): the host vanished. Its action is
  invoked on both states (`acts_on`). A new alarm starts in INSUFFICIENT_DATA and stays there until the host's first
  datapoint (then OK): a job's start, before its hosts report, invokes nothing; a host that reported and then
  stopped moves OK -> INSUFFICIENT_DATA, which does.
- ``log-idle`` (per host): ``LogIdleSeconds`` (published by the sweeper) above ``agreement_fraction`` x
  ``log_silence_minutes``.
- ``progress`` (job): the agent's ``Steps`` stayed 0 for ``crash_confirm_minutes``; a declared phase within its
  budget (``PhaseBudgetRemaining > 0``) counts as progress, and missing data (a dead agent) counts as no progress.
- ``nonfinite-loss`` (job): the agent saw a NaN/inf loss.
- ``data-starvation`` (job): ``DataWaitFraction`` above ``data_wait_percent`` for ``idle_minutes``.

CPU utilization is read as a signal but not alarmed: a healthy GPU job can sit near 1 % of 96 vCPUs.

Host metrics per platform:

- SageMaker: ``/aws/sagemaker/TrainingJobs``, dimension ``Host=<job>/algo-N``; GPU metrics are 0-100 x GPUs,
  so the alarms divide by the host's GPUs (``facts.gpus_on(host)``: each group's type in a heterogeneous cluster)
  with metric math.
- EC2: the CloudWatch agent's ``nvidia_smi_*`` metrics in ``CWAgent``, configured with
  ``append_dimensions: {"InstanceId": "${aws:InstanceId}"}`` and ``aggregation_dimensions: [["InstanceId"]]``
  so that it also publishes the per-instance mean over GPUs with the single dimension ``InstanceId``.
- A Neuron host (Trainium, on any platform): the agent's ``AcceleratorUtilization`` and
  ``AcceleratorMemoryUtilization`` (``Stallwatch``, ``JobName`` and ``Host``): no platform publishes a NeuronCore's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from stallwatch.core import contract
from stallwatch.core.platforms import describe
from stallwatch.core.platforms.interface import MetricMath
from stallwatch.core.policy import EffectivePolicy, Mode, Thresholds
from stallwatch.core.signals import JobFacts, Platform

GPU_IDLE = "gpu-idle"
GPU_MEMORY = "gpu-memory"
LOG_IDLE = "log-idle"
PROGRESS = "progress"
NONFINITE_LOSS = "nonfinite-loss"
DATA_STARVATION = "data-starvation"
HOST_KINDS = frozenset({GPU_IDLE, GPU_MEMORY, LOG_IDLE})
JOB_KINDS = frozenset({PROGRESS, NONFINITE_LOSS, DATA_STARVATION})

TAG_JOB = "stallwatch:job"
TAG_PLATFORM = "stallwatch:platform"
TAG_KIND = "stallwatch:kind"
TAG_HOST = "stallwatch:host"

# GPU memory let go of for this many periods: the processes left (a training job holds it throughout).
GPU_MEMORY_PERIODS = 2
ALARM_STATE = "ALARM"
INSUFFICIENT_DATA_STATE = "INSUFFICIENT_DATA"
# The states each kind's alarm action is invoked on (the rest: ALARM alone): gpu-memory's data stopping is a lost host.
ACTION_STATES = {GPU_MEMORY: frozenset({ALARM_STATE, INSUFFICIENT_DATA_STATE})}
DEFAULT_ACTION_STATES = frozenset({ALARM_STATE})
ACTING_STATES = DEFAULT_ACTION_STATES.union(*ACTION_STATES.values())  # an alarm of some kind acts on each of these
# CloudWatch refuses alarms whose EvaluationPeriods x Period exceeds one day.
MAX_EVALUATION_SECONDS = 86_400


@dataclass(frozen=True)
class AlarmRef:
    """What an alarm name says: whose alarm it is and what it watches."""

    platform: Platform
    job: str
    kind: str
    host: str | None = None


def job_alarm_prefix(prefix: str, platform: Platform | str, job: str) -> str:
    """The name prefix shared by all of a job's alarms (for DescribeAlarms/DeleteAlarms)."""
    return f"{prefix}{Platform(platform)}.{job}."


def alarm_name(prefix: str, platform: Platform | str, job: str, kind: str, host: str | None = None) -> str:
    """``{prefix}{platform}.{job}.{kind}`` or ``{prefix}{platform}.{job}.{kind}.{host}``."""
    name = f"{job_alarm_prefix(prefix, platform, job)}{kind}"
    return f"{name}.{host}" if host else name


def parse_alarm_name(name: str, prefix: str) -> AlarmRef:
    """The inverse of `alarm_name`; ValueError for an alarm Stallwatch did not name."""
    if not name.startswith(prefix):
        raise ValueError(f"alarm {name!r} does not start with the prefix {prefix!r}")
    parts = name[len(prefix) :].split(".")
    if len(parts) not in (3, 4) or not all(parts):
        raise ValueError(f"alarm {name!r}: expected {prefix}<platform>.<job>.<kind>[.<host>]")
    platform, job, kind, *host = parts
    if platform not in {p.value for p in Platform}:
        raise ValueError(f"alarm {name!r}: unknown platform {platform!r}")
    kinds = HOST_KINDS if host else JOB_KINDS
    if kind not in kinds:
        raise ValueError(f"alarm {name!r}: unknown {'host' if host else 'job'} alarm kind {kind!r}")
    return AlarmRef(platform=Platform(platform), job=job, kind=kind, host=host[0] if host else None)


def acts_on(kind: str, state: str) -> bool:
    """Whether an alarm of `kind` invokes its action (on_alarm) on entering `state`."""
    return state in ACTION_STATES.get(kind, DEFAULT_ACTION_STATES)


def host_names(facts: JobFacts) -> list[str]:
    """The job's hosts as the signals name them (`PlatformDescription.hosts`): algo-1..algo-N on SageMaker, instance
    ids on EC2."""
    return describe(facts.platform).host_names(facts)


def render_alarms(facts: JobFacts, policy: EffectivePolicy, prefix: str, action_arns: list[str]) -> list[dict]:
    """The job's alarms as `PutMetricAlarm` keyword arguments; none when the job's mode is off."""
    if policy.mode is Mode.OFF:
        return []
    renderer = _Renderer(facts, policy.thresholds, prefix, action_arns)
    alarms = []
    for host in host_names(facts):
        if facts.gpus_on(host):  # a CPU-only host (a heterogeneous cluster's data group) has no GPU metrics
            alarms += [renderer.gpu_idle(host), renderer.gpu_memory(host)]
        alarms.append(renderer.log_idle(host))
    alarms += [renderer.progress(), renderer.nonfinite_loss(), renderer.data_starvation()]
    return alarms


def _metric(namespace: str, name: str, dimensions: dict[str, str]) -> dict[str, Any]:
    return {
        "Namespace": namespace,
        "MetricName": name,
        "Dimensions": [{"Name": k, "Value": v} for k, v in dimensions.items()],
    }


def _stat(metric_id: str, metric: dict[str, Any], period: int, stat: str) -> dict[str, Any]:
    return {"Id": metric_id, "MetricStat": {"Metric": metric, "Period": period, "Stat": stat}, "ReturnData": False}


def _expression(expression: str, label: str) -> dict[str, Any]:
    return {"Id": "e1", "Expression": expression, "Label": label, "ReturnData": True}


class _Renderer:
    """Builds one job's alarm definitions; one method per alarm kind."""

    def __init__(self, facts: JobFacts, thresholds: Thresholds, prefix: str, action_arns: list[str]) -> None:
        self.facts = facts
        self.thresholds = thresholds
        self.prefix = prefix
        self.action_arns = list(action_arns)
        self.period = thresholds.alarm_period_seconds
        self.description = describe(facts.platform)

    def _early(self, minutes: float) -> float:
        """When the evidence ladder may first decide on a signal with this threshold (minutes)."""
        return minutes * self.thresholds.agreement_fraction

    def _periods(self, minutes: float) -> int:
        wanted = max(1, math.ceil(round(minutes * 60 / self.period, 6)))
        return min(wanted, MAX_EVALUATION_SECONDS // self.period)

    def _alarm(self, kind: str, host: str | None, description: str, **definition: Any) -> dict[str, Any]:
        tags = {TAG_JOB: self.facts.name, TAG_PLATFORM: str(self.facts.platform), TAG_KIND: kind}
        if host:
            tags[TAG_HOST] = host
        periods = definition.pop("periods")
        where = f" on {host}" if host else ""
        actions = {"AlarmActions": self.action_arns}
        if acts_on(kind, INSUFFICIENT_DATA_STATE):
            actions["InsufficientDataActions"] = self.action_arns
        return {
            "AlarmName": alarm_name(self.prefix, self.facts.platform, self.facts.name, kind, host),
            "AlarmDescription": f"Stallwatch {kind} for {self.facts.name}{where}: {description}",
            "ActionsEnabled": True,
            **actions,
            "EvaluationPeriods": periods,
            "DatapointsToAlarm": periods,
            **definition,
            "Tags": [{"Key": k, "Value": v} for k, v in tags.items()],
        }

    def _host_gpu_metrics(self, math: MetricMath) -> list[dict[str, Any]]:
        """Metric math giving one host's mean per-GPU percentage (the platform's `MetricMath`)."""
        inputs = [_stat(i, _metric(*metric), self.period, "Average") for i, metric in math.inputs.items()]
        return [*inputs, _expression(math.expression, math.label)]

    def gpu_idle(self, host: str) -> dict[str, Any]:
        t = self.thresholds
        return self._alarm(
            GPU_IDLE,
            host,
            f"GPU utilization per device below {t.idle_gpu_percent}% for {t.crash_confirm_minutes:g} min.",
            Metrics=self._host_gpu_metrics(self.description.utilization(self.facts, host)),
            periods=self._periods(t.crash_confirm_minutes),
            Threshold=t.idle_gpu_percent,
            ComparisonOperator="LessThanThreshold",
            TreatMissingData="notBreaching",
        )

    def gpu_memory(self, host: str) -> dict[str, Any]:
        t = self.thresholds
        return self._alarm(
            GPU_MEMORY,
            host,
            f"GPU memory per device below {t.idle_gpu_percent}% for {GPU_MEMORY_PERIODS} periods (the process left "
            "the GPUs), or no datapoint once the host reported (INSUFFICIENT_DATA: the host vanished).",
            Metrics=self._host_gpu_metrics(self.description.memory(self.facts, host)),
            periods=min(GPU_MEMORY_PERIODS, self._periods(t.crash_confirm_minutes)),
            Threshold=t.idle_gpu_percent,
            ComparisonOperator="LessThanThreshold",
            # missing, not breaching: before its first datapoint a host is starting, not lost (INSUFFICIENT_DATA,
            # the alarm's initial state, changes nothing); once it reported, losing every datapoint invokes on_alarm
            TreatMissingData="missing",
        )

    def log_idle(self, host: str) -> dict[str, Any]:
        t = self.thresholds
        # The sweeper publishes every few minutes; between publications the alarm keeps its state.
        return self._alarm(
            LOG_IDLE,
            host,
            f"no log line for more than {self._early(t.log_silence_minutes):g} min.",
            Namespace=contract.NAMESPACE,
            MetricName=contract.LOG_IDLE_SECONDS,
            Dimensions=[
                {"Name": contract.DIM_JOB, "Value": self.facts.name},
                {"Name": contract.DIM_HOST, "Value": host},
            ],
            Statistic="Maximum",
            Period=self.period,
            periods=1,
            Threshold=round(self._early(t.log_silence_minutes) * 60, 3),
            ComparisonOperator="GreaterThanThreshold",
            TreatMissingData="ignore",
        )

    def _job_metric(self, name: str) -> dict[str, Any]:
        return _metric(contract.NAMESPACE, name, {contract.DIM_JOB: self.facts.name})

    def progress(self) -> dict[str, Any]:
        t = self.thresholds
        return self._alarm(
            PROGRESS,
            None,
            f"no training step for {t.crash_confirm_minutes:g} min outside a declared phase, or the agent went silent.",
            Metrics=[
                _stat("m1", self._job_metric("Steps"), self.period, "Sum"),
                _stat("m2", self._job_metric("PhaseBudgetRemaining"), self.period, "Maximum"),
                _expression("IF(FILL(m2, 0) > 0, 1, m1)", "steps, or 1 inside a phase budget"),
            ],
            periods=self._periods(t.crash_confirm_minutes),
            Threshold=1.0,
            ComparisonOperator="LessThanThreshold",
            TreatMissingData="breaching",
        )

    def nonfinite_loss(self) -> dict[str, Any]:
        return self._alarm(
            NONFINITE_LOSS,
            None,
            "the loss was NaN or infinite.",
            Namespace=contract.NAMESPACE,
            MetricName="NonFiniteLoss",
            Dimensions=[{"Name": contract.DIM_JOB, "Value": self.facts.name}],
            Statistic="Sum",
            Period=self.period,
            periods=1,
            Threshold=1.0,
            ComparisonOperator="GreaterThanOrEqualToThreshold",
            TreatMissingData="notBreaching",
        )

    def data_starvation(self) -> dict[str, Any]:
        t = self.thresholds
        return self._alarm(
            DATA_STARVATION,
            None,
            f"more than {t.data_wait_percent}% of the time waiting for data for {t.idle_minutes} min.",
            Namespace=contract.NAMESPACE,
            MetricName="DataWaitFraction",
            Dimensions=[{"Name": contract.DIM_JOB, "Value": self.facts.name}],
            Statistic="Average",
            Period=self.period,
            periods=self._periods(t.idle_minutes),
            Threshold=t.data_wait_percent,
            ComparisonOperator="GreaterThanThreshold",
            TreatMissingData="notBreaching",
        )
