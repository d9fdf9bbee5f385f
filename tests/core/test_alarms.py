"""Alarm rendering: names round-trip, definitions follow the policy and the platform, off renders nothing."""

from __future__ import annotations

import pytest

from stallwatch.core import alarms, contract
from stallwatch.core.evaluator import AlarmEvaluator, metric_key
from stallwatch.core.policy import Policy
from stallwatch.core.pricing import accelerated, instance_spec
from stallwatch.core.signals import JobFacts, Platform

PREFIX = "stallwatch-"
T0 = 1_764_496_800.0  # a whole hour: the alarms' periods start on it
ARN = "arn:aws:lambda:us-east-1:123456789012:function:on-alarm"


def sagemaker_job(hosts: int = 2, **overrides: object) -> JobFacts:
    fields = dict(
        name="llm-pretrain-7b",
        platform=Platform.SAGEMAKER,
        status="InProgress",
        secondary_status="Training",
        start_time=1_700_000_000.0,
        instance_type="ml.p4d.24xlarge",
        instance_count=hosts,
        gpus_per_host=8,
        vcpus_per_host=96,
    )
    fields.update(overrides)
    return JobFacts(**fields)


def ec2_job() -> JobFacts:
    return JobFacts(
        name="i-0abc123",
        platform=Platform.EC2,
        status="InProgress",
        secondary_status=None,
        start_time=1_700_000_000.0,
        instance_type="p4d.24xlarge",
        instance_count=1,
        gpus_per_host=8,
        vcpus_per_host=96,
        instance_ids=("i-0abc123",),
    )


def by_name(definitions: list[dict]) -> dict[str, dict]:
    return {d["AlarmName"]: d for d in definitions}


def test_alarm_names_round_trip_for_job_and_host_alarms() -> None:
    # Given a host alarm and a job alarm name
    host_alarm = alarms.alarm_name(PREFIX, Platform.SAGEMAKER, "my-job", alarms.GPU_IDLE, "algo-3")
    job_alarm = alarms.alarm_name(PREFIX, "ec2", "i-0abc", alarms.PROGRESS)

    # When they are parsed back
    # Then the parts come back, and both start with the job's prefix
    assert host_alarm == "stallwatch-sagemaker.my-job.gpu-idle.algo-3"
    assert alarms.parse_alarm_name(host_alarm, PREFIX) == alarms.AlarmRef(
        Platform.SAGEMAKER, "my-job", alarms.GPU_IDLE, "algo-3"
    )
    assert alarms.parse_alarm_name(job_alarm, PREFIX) == alarms.AlarmRef(Platform.EC2, "i-0abc", alarms.PROGRESS)
    assert host_alarm.startswith(alarms.job_alarm_prefix(PREFIX, "sagemaker", "my-job"))


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("other-sagemaker.j.progress", "does not start with the prefix"),
        ("stallwatch-gke.j.progress", "unknown platform 'gke'"),
        ("stallwatch-sagemaker.j.bogus", "unknown job alarm kind 'bogus'"),
        ("stallwatch-sagemaker.j.progress.algo-1", "unknown host alarm kind 'progress'"),
        ("stallwatch-sagemaker.j", "expected stallwatch-<platform>"),
    ],
)
def test_foreign_alarm_names_are_rejected(name: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        alarms.parse_alarm_name(name, PREFIX)


def test_sagemaker_job_gets_host_alarms_per_host_and_job_alarms() -> None:
    # Given a 3-host SageMaker job under the default policy
    facts = sagemaker_job(hosts=3)

    # When its alarms are rendered
    rendered = alarms.render_alarms(facts, Policy(mode="enforce").for_job({}), PREFIX, [ARN])

    # Then each host has gpu-idle, gpu-memory and log-idle, and the job has its three alarms
    refs = [alarms.parse_alarm_name(d["AlarmName"], PREFIX) for d in rendered]
    assert sorted((r.kind, r.host) for r in refs if r.host) == sorted(
        (kind, f"algo-{i}") for kind in alarms.HOST_KINDS for i in (1, 2, 3)
    )
    assert sorted(r.kind for r in refs if not r.host) == sorted(alarms.JOB_KINDS)
    for d in rendered:
        assert d["AlarmActions"] == [ARN]
        assert "OKActions" not in d
        assert {"Key": alarms.TAG_JOB, "Value": "llm-pretrain-7b"} in d["Tags"]


def test_a_cpu_only_group_gets_log_alarms_and_no_gpu_alarms() -> None:
    # Given a heterogeneous job: 2 p4d hosts and a c5 data host (a type the price table does not list)
    host_types = {"algo-1": "ml.p4d.24xlarge", "algo-2": "ml.p4d.24xlarge", "algo-3": "ml.c5.18xlarge"}
    facts = sagemaker_job(hosts=3, host_types=host_types)

    # When its alarms are rendered
    rendered = alarms.render_alarms(facts, Policy(mode="enforce").for_job({}), PREFIX, [ARN])

    # Then the data host has its log alarm only, and the GPU hosts' GPU alarms divide by their 8 GPUs
    refs = [alarms.parse_alarm_name(d["AlarmName"], PREFIX) for d in rendered]
    assert sorted(r.kind for r in refs if r.host == "algo-3") == ["log-idle"]
    assert sorted(r.kind for r in refs if r.host == "algo-1") == sorted(alarms.HOST_KINDS)
    assert facts.gpu_host_count() == 2


@pytest.mark.parametrize(
    ("instance_type", "expected"),
    [("ml.c5.18xlarge", False), ("m7i.48xlarge", False), ("ml.p3.16xlarge", True), ("gr6.4xlarge", True)],
)
def test_accelerated_families_are_told_by_name_and_unlisted_types_count_one_device(instance_type, expected) -> None:
    assert accelerated(instance_type) is expected
    assert instance_spec(instance_type).devices == 1  # a homogeneous job of any unlisted type is watched as before


@pytest.mark.parametrize(("confirm", "periods"), [(3.0, 3), (4.5, 5)])
def test_sagemaker_gpu_idle_normalizes_by_gpu_count_and_fires_when_evidence_may_first_decide(
    confirm: float, periods: int
) -> None:
    # Given a p4d job (8 GPUs), idle at 5 % per device, 60 s periods; conclusive evidence (a dead rank's GPUs going
    # idle while the others spin) decides after `crash_confirm_minutes`
    thresholds = {"idle_minutes": 20, "idle_gpu_percent": 5, "crash_confirm_minutes": confirm}
    policy = Policy(thresholds=thresholds).for_job({})

    # When the gpu-idle alarm of algo-2 is rendered
    alarm = by_name(alarms.render_alarms(sagemaker_job(), policy, PREFIX, []))[
        "stallwatch-sagemaker.llm-pretrain-7b.gpu-idle.algo-2"
    ]

    # Then it divides the host's summed utilization by 8 and fires after `crash_confirm_minutes` of low minutes
    # (rounded up to whole periods); the engine names the later rungs itself (`Decision.recheck_at`)
    stat, expression = alarm["Metrics"]
    assert stat["MetricStat"]["Metric"] == {
        "Namespace": contract.SAGEMAKER_NAMESPACE,
        "MetricName": "GPUUtilization",
        "Dimensions": [{"Name": "Host", "Value": "llm-pretrain-7b/algo-2"}],
    }
    assert stat["MetricStat"]["Period"] == 60
    assert expression["Expression"] == "m1 / 8"
    assert expression["ReturnData"] is True
    assert (alarm["EvaluationPeriods"], alarm["DatapointsToAlarm"]) == (periods, periods)
    assert (alarm["Threshold"], alarm["ComparisonOperator"]) == (5.0, "LessThanThreshold")


def _gpu_memory_states(points: list[tuple[float, float]], until: float) -> list[str]:
    """The states a SageMaker host's gpu-memory alarm enters whose action is invoked (`acts_on`), evaluated each
    minute up to `until`, with the host's GPUMemoryUtilization `points` ((t, percent of 8 GPUs))."""
    facts = sagemaker_job()
    [alarm] = [
        a
        for a in alarms.render_alarms(facts, Policy().for_job({}), PREFIX, ["arn:on-alarm"])
        if a["AlarmName"].endswith("gpu-memory.algo-2")
    ]
    evaluator = AlarmEvaluator([alarm])
    key = metric_key(contract.SAGEMAKER_NAMESPACE, "GPUMemoryUtilization", {"Host": f"{facts.name}/algo-2"})
    for t, value in points:
        evaluator.add_datapoint(key, T0 + t, value)
    acted = []
    for minute in range(1, int(until // 60) + 1):
        for transition in evaluator.evaluate(T0 + minute * 60):
            if alarms.acts_on(alarms.GPU_MEMORY, transition.new.value):
                acted.append(transition.new.value)
    return acted


def test_a_hosts_gpu_memory_alarm_invokes_nothing_before_the_host_reports() -> None:
    # Given a job whose host reports its first GPU memory 4 minutes after its alarms were put
    points = [(t, 600.0) for t in range(240, 900, 60)]

    # Then its gpu-memory alarm invokes on_alarm never: starting is not vanishing
    assert _gpu_memory_states(points, until=900) == []
    # And a host that never reports invokes nothing either
    assert _gpu_memory_states([], until=900) == []


def test_a_host_that_reported_and_vanished_or_let_go_of_its_gpus_still_invokes_on_alarm() -> None:
    # Given a host that held its GPUs for 10 minutes, then vanished (no datapoint since)
    vanished = _gpu_memory_states([(t, 600.0) for t in range(0, 600, 60)], until=1500)
    # Then its alarm's data stopping invokes on_alarm, once (INSUFFICIENT_DATA, the lost host)
    assert vanished == ["INSUFFICIENT_DATA"]
    # And a host whose processes let go of their GPU memory invokes it too (ALARM, as before)
    released = [(t, 600.0) for t in range(0, 600, 60)] + [(t, 0.0) for t in range(600, 1200, 60)]
    assert _gpu_memory_states(released, until=1200) == ["ALARM"]


def test_the_gpu_memory_alarm_treats_missing_data_as_missing_and_acts_on_insufficient_data() -> None:
    alarm = by_name(alarms.render_alarms(sagemaker_job(), Policy().for_job({}), PREFIX, ["arn:on-alarm"]))[
        "stallwatch-sagemaker.llm-pretrain-7b.gpu-memory.algo-2"
    ]
    assert alarm["TreatMissingData"] == "missing"
    assert alarm["InsufficientDataActions"] == alarm["AlarmActions"] == ["arn:on-alarm"]
    assert alarm["EvaluationPeriods"] == alarms.GPU_MEMORY_PERIODS
    # And no other kind acts on INSUFFICIENT_DATA
    rendered = alarms.render_alarms(sagemaker_job(), Policy().for_job({}), PREFIX, ["arn"])
    assert {a["AlarmName"].split(".")[2] for a in rendered if "InsufficientDataActions" in a} == {alarms.GPU_MEMORY}


def test_progress_alarm_is_phase_aware_and_counts_a_dead_agent() -> None:
    # Given a job tagged with a 45-minute stall threshold and 30 s high-resolution periods
    policy = Policy(thresholds={"alarm_period_seconds": 30}).for_job({"stallwatch:stall-minutes": "45"})

    # When its progress alarm is rendered
    alarm = by_name(alarms.render_alarms(sagemaker_job(), policy, PREFIX, []))[
        "stallwatch-sagemaker.llm-pretrain-7b.progress"
    ]

    # Then Steps and PhaseBudgetRemaining feed one expression, missing data breaches, over 6 periods (the 3 minutes
    # of `crash_confirm_minutes`, when conclusive evidence may first decide; the engine names each later rung, the
    # 45-minute stall threshold too, as a recheck)
    metrics = {m["Id"]: m for m in alarm["Metrics"]}
    assert metrics["m1"]["MetricStat"]["Metric"]["MetricName"] == "Steps"
    assert metrics["m1"]["MetricStat"]["Stat"] == "Sum"
    assert metrics["m2"]["MetricStat"]["Metric"]["MetricName"] == "PhaseBudgetRemaining"
    assert metrics["e1"]["Expression"] == "IF(FILL(m2, 0) > 0, 1, m1)"
    assert alarm["TreatMissingData"] == "breaching"
    assert alarm["EvaluationPeriods"] == 6
    assert metrics["m1"]["MetricStat"]["Period"] == 30


def test_ec2_alarms_read_the_cloudwatch_agent_per_instance() -> None:
    # Given an EC2 instance watched as a job
    rendered = by_name(alarms.render_alarms(ec2_job(), Policy().for_job({}), PREFIX, []))

    # When its GPU alarms are inspected
    idle = rendered["stallwatch-ec2.i-0abc123.gpu-idle.i-0abc123"]
    memory = rendered["stallwatch-ec2.i-0abc123.gpu-memory.i-0abc123"]

    # Then they read the agent's nvidia_smi metrics by InstanceId, memory as used / total
    assert idle["Metrics"][0]["MetricStat"]["Metric"] == {
        "Namespace": contract.CWAGENT_NAMESPACE,
        "MetricName": contract.CWAGENT_GPU_UTILIZATION,
        "Dimensions": [{"Name": "InstanceId", "Value": "i-0abc123"}],
    }
    assert memory["Metrics"][-1]["Expression"] == "100 * m1 / m2"
    assert "stallwatch-ec2.i-0abc123.log-idle.i-0abc123" in rendered


def test_log_idle_alarm_reads_the_sweepers_metric_and_keeps_state_between_publications() -> None:
    alarm = by_name(alarms.render_alarms(sagemaker_job(), Policy().for_job({}), PREFIX, []))[
        "stallwatch-sagemaker.llm-pretrain-7b.log-idle.algo-1"
    ]
    assert alarm["MetricName"] == contract.LOG_IDLE_SECONDS
    assert alarm["Dimensions"] == [
        {"Name": contract.DIM_JOB, "Value": "llm-pretrain-7b"},
        {"Name": contract.DIM_HOST, "Value": "algo-1"},
    ]
    thresholds = Policy().thresholds
    assert alarm["Threshold"] == pytest.approx(thresholds.agreement_fraction * thresholds.log_silence_minutes * 60)
    assert alarm["TreatMissingData"] == "ignore"


def test_mode_off_renders_no_alarms() -> None:
    policy = Policy(mode="notify").for_job({"stallwatch:mode": "off"})
    assert alarms.render_alarms(sagemaker_job(), policy, PREFIX, [ARN]) == []


def test_evaluation_window_is_capped_at_one_day() -> None:
    # Given a confirmation of two days (by tag)
    policy = Policy().for_job({"stallwatch:crash-confirm-minutes": "2880"})

    # When the gpu-idle alarm is rendered
    alarm = by_name(alarms.render_alarms(sagemaker_job(hosts=1), policy, PREFIX, []))[
        "stallwatch-sagemaker.llm-pretrain-7b.gpu-idle.algo-1"
    ]

    # Then it spans at most CloudWatch's one-day limit
    assert alarm["EvaluationPeriods"] * 60 == alarms.MAX_EVALUATION_SECONDS
