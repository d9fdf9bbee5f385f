"""The local evaluator reproduces CloudWatch's alarm semantics for the alarms Stallwatch renders."""

from __future__ import annotations

import pytest

from stallwatch.core import alarms
from stallwatch.core.evaluator import AlarmEvaluator, AlarmState, metric_key
from stallwatch.core.policy import Policy
from stallwatch.core.signals import JobFacts, Platform

T0 = 1_700_000_040.0  # a minute boundary
STEPS = metric_key("Stallwatch", "Steps", {"JobName": "j"})
PHASE = metric_key("Stallwatch", "PhaseBudgetRemaining", {"JobName": "j"})


def simple_alarm(treat: str = "missing", n: int = 3, m: int = 3, stat: str = "Average") -> dict:
    return {
        "AlarmName": "a",
        "Namespace": "Stallwatch",
        "MetricName": "Steps",
        "Dimensions": [{"Name": "JobName", "Value": "j"}],
        "Statistic": stat,
        "Period": 60,
        "EvaluationPeriods": n,
        "DatapointsToAlarm": m,
        "Threshold": 1.0,
        "ComparisonOperator": "LessThanThreshold",
        "TreatMissingData": treat,
    }


def feed(evaluator: AlarmEvaluator, values: list[float | None], key=STEPS) -> None:
    """One datapoint per minute from T0 (None: none that minute)."""
    for i, value in enumerate(values):
        if value is not None:
            evaluator.add_datapoint(key, T0 + 60 * i + 5, value)


def state_after(alarm: dict, values: list[float | None]) -> AlarmState:
    evaluator = AlarmEvaluator([alarm])
    feed(evaluator, values)
    evaluator.evaluate(T0 + 60 * len(values))
    return evaluator.state("a")


def test_alarm_fires_when_the_last_n_periods_breach() -> None:
    # Given a 3-of-3 alarm on Steps < 1
    evaluator = AlarmEvaluator([simple_alarm()])
    feed(evaluator, [5, 4, 0, 0])

    # When evaluated after two zero minutes, then after the third
    first = evaluator.evaluate(T0 + 240)
    feed(evaluator, [None] * 4 + [0])
    second = evaluator.evaluate(T0 + 300)

    # Then it goes OK first, then ALARM once three periods breach
    assert [(t.old, t.new) for t in first] == [(AlarmState.INSUFFICIENT_DATA, AlarmState.OK)]
    assert [(t.new, t.at) for t in second] == [(AlarmState.ALARM, T0 + 300)]


def test_m_of_n_counts_breaching_datapoints() -> None:
    assert state_after(simple_alarm(n=3, m=2), [0, 5, 0]) is AlarmState.ALARM
    assert state_after(simple_alarm(n=3, m=2), [0, 5, 5]) is AlarmState.OK


def test_a_period_counts_only_once_it_has_ended() -> None:
    # Given three zero minutes, the last one still running at evaluation time
    evaluator = AlarmEvaluator([simple_alarm("notBreaching")])
    feed(evaluator, [0, 0, 0])

    # When evaluated 30 s into the third minute
    evaluator.evaluate(T0 + 150)

    # Then only two periods count and the alarm does not fire yet
    assert evaluator.state("a") is AlarmState.OK


@pytest.mark.parametrize(
    ("treat", "expected"),
    [
        ("missing", AlarmState.INSUFFICIENT_DATA),
        ("ignore", AlarmState.INSUFFICIENT_DATA),  # the initial state, kept
        ("breaching", AlarmState.ALARM),
        ("notBreaching", AlarmState.OK),
    ],
)
def test_no_data_at_all_follows_treat_missing_data(treat: str, expected: AlarmState) -> None:
    assert state_after(simple_alarm(treat), [None, None, None]) is expected


@pytest.mark.parametrize(
    ("treat", "expected"),
    [
        ("missing", AlarmState.ALARM),  # the only real datapoint decides
        ("breaching", AlarmState.ALARM),
        ("notBreaching", AlarmState.OK),
    ],
)
def test_one_breaching_datapoint_among_missing_ones(treat: str, expected: AlarmState) -> None:
    assert state_after(simple_alarm(treat), [None, None, None, 0]) is expected


def test_missing_data_is_filled_as_few_times_as_possible() -> None:
    # Given a 3-of-3 breaching-on-missing alarm and two fine datapoints before the gap
    # When only one period is missing
    # Then the real fine datapoints keep it OK (CloudWatch looks further back before filling)
    assert state_after(simple_alarm("breaching"), [5, 5, None]) is AlarmState.OK


def test_ignore_keeps_the_state_until_enough_real_datapoints_decide() -> None:
    # Given an ALARM state on a treat-as-ignore alarm
    evaluator = AlarmEvaluator([simple_alarm("ignore")])
    feed(evaluator, [0, 0, 0])
    evaluator.evaluate(T0 + 180)
    assert evaluator.state("a") is AlarmState.ALARM

    # When datapoints stop for a while
    transitions = evaluator.evaluate(T0 + 180 + 60 * 10)

    # Then the state is kept
    assert transitions == []
    assert evaluator.state("a") is AlarmState.ALARM


@pytest.mark.parametrize(("stat", "expected"), [("Sum", AlarmState.OK), ("Average", AlarmState.ALARM)])
def test_statistic_aggregates_datapoints_within_a_period(stat: str, expected: AlarmState) -> None:
    # Given two datapoints of 0.6 in each minute: Sum 1.2 (not < 1), Average 0.6 (< 1)
    evaluator = AlarmEvaluator([simple_alarm(stat=stat)])
    for minute in range(3):
        evaluator.add_datapoint(STEPS, T0 + 60 * minute + 10, 0.6)
        evaluator.add_datapoint(STEPS, T0 + 60 * minute + 40, 0.6)
    evaluator.evaluate(T0 + 180)
    assert evaluator.state("a") is expected


def progress_alarm() -> dict:
    facts = JobFacts(
        name="j",
        platform=Platform.SAGEMAKER,
        status="InProgress",
        secondary_status="Training",
        start_time=T0,
        instance_type="ml.p4d.24xlarge",
        instance_count=1,
        gpus_per_host=8,
        vcpus_per_host=96,
    )
    policy = Policy(thresholds={"stall_minutes": 5}).for_job({})
    rendered = alarms.render_alarms(facts, policy, "sw-", [])
    return next(d for d in rendered if d["AlarmName"].endswith(".progress"))


def test_progress_math_treats_a_phase_within_budget_as_progress() -> None:
    # Given the rendered progress alarm, 5 minutes without steps, but inside a declared phase
    evaluator = AlarmEvaluator([progress_alarm()])
    feed(evaluator, [0] * 5, STEPS)
    feed(evaluator, [600, 540, 480, 420, 360], PHASE)

    # When evaluated
    evaluator.evaluate(T0 + 300)

    # Then the alarm stays OK
    assert evaluator.state("sw-sagemaker.j.progress") is AlarmState.OK


def test_progress_math_alarms_after_the_phase_budget_is_spent() -> None:
    evaluator = AlarmEvaluator([progress_alarm()])
    feed(evaluator, [0] * 5, STEPS)
    feed(evaluator, [0] * 5, PHASE)
    evaluator.evaluate(T0 + 300)
    assert evaluator.state("sw-sagemaker.j.progress") is AlarmState.ALARM


def test_progress_alarm_fires_when_the_agent_goes_silent() -> None:
    # Given steps every minute, then nothing at all (the agent died with the job's processes)
    evaluator = AlarmEvaluator([progress_alarm()])
    feed(evaluator, [10] * 5, STEPS)
    evaluator.evaluate(T0 + 300)
    assert evaluator.state("sw-sagemaker.j.progress") is AlarmState.OK

    # When the evaluation range no longer holds any real datapoint
    evaluator.evaluate(T0 + 300 + 60 * 7)

    # Then missing data counts as breaching and the alarm fires
    assert evaluator.state("sw-sagemaker.j.progress") is AlarmState.ALARM


def test_sagemaker_gpu_idle_math_divides_by_devices() -> None:
    # Given a p4d host summing 8 GPUs at 4 % each (32 in SageMaker's units) for the idle window
    facts = JobFacts(
        name="j",
        platform=Platform.SAGEMAKER,
        status="InProgress",
        secondary_status="Training",
        start_time=T0,
        instance_type="ml.p4d.24xlarge",
        instance_count=1,
        gpus_per_host=8,
        vcpus_per_host=96,
    )
    policy = Policy(thresholds={"idle_minutes": 3}).for_job({})
    evaluator = AlarmEvaluator(alarms.render_alarms(facts, policy, "sw-", []))
    points = [(T0 + 60 * minute + 5, 32.0) for minute in range(3)]
    evaluator.add_datapoints("/aws/sagemaker/TrainingJobs", "GPUUtilization", {"Host": "j/algo-1"}, points)

    # When evaluated
    evaluator.evaluate(T0 + 180)

    # Then 4 % per device is below the 5 % idle threshold
    assert evaluator.state("sw-sagemaker.j.gpu-idle.algo-1") is AlarmState.ALARM


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"ComparisonOperator": "GreaterThanUpperThreshold"}, "unsupported ComparisonOperator"),
        ({"TreatMissingData": "sometimes"}, "unsupported TreatMissingData"),
        ({"DatapointsToAlarm": 5}, "DatapointsToAlarm must be 1..EvaluationPeriods"),
    ],
)
def test_invalid_definitions_are_rejected_naming_the_field(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AlarmEvaluator([{**simple_alarm(), **change}])


def test_unsupported_metric_math_is_rejected() -> None:
    alarm = {**progress_alarm()}
    alarm["Metrics"] = [
        *alarm["Metrics"][:2],
        {"Id": "e1", "Expression": "ANOMALY_DETECTION_BAND(m1)", "ReturnData": True},
    ]
    with pytest.raises(ValueError, match="unsupported function 'ANOMALY_DETECTION_BAND'"):
        AlarmEvaluator([alarm])


def math_alarm(name: str, expression: str, operator: str, threshold: float) -> dict:
    def stat(metric_id: str, metric_name: str) -> dict:
        metric = {"Namespace": "CWAgent", "MetricName": metric_name}
        return {"Id": metric_id, "MetricStat": {"Metric": metric, "Period": 60, "Stat": "Average"}, "ReturnData": False}

    return {
        "AlarmName": name,
        "Metrics": [
            stat("m1", "used"),
            stat("m2", "total"),
            {"Id": "e1", "Expression": expression, "ReturnData": True},
        ],
        "EvaluationPeriods": 1,
        "Threshold": threshold,
        "ComparisonOperator": operator,
        "TreatMissingData": "missing",
    }


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("100 * m1 / m2", 50.0),
        ("(m1 + m2) / 2 - 1", 149.0),
        ("-m1 + m2", 100.0),
        ("IF(m1 >= m2, 1, 0)", 0.0),
    ],
)
def test_metric_math_evaluates_per_period(expression: str, expected: float) -> None:
    # Given metrics at 100 and 200 in one period, and alarms at ">= expected" and "> expected" on an expression
    evaluator = AlarmEvaluator(
        [
            math_alarm("ge", expression, "GreaterThanOrEqualToThreshold", expected),
            math_alarm("gt", expression, "GreaterThanThreshold", expected),
        ]
    )
    evaluator.add_datapoint(metric_key("CWAgent", "used", {}), T0 + 5, 100.0)
    evaluator.add_datapoint(metric_key("CWAgent", "total", {}), T0 + 5, 200.0)

    # When evaluated
    evaluator.evaluate(T0 + 60)

    # Then the expression's value is exactly `expected`
    assert (evaluator.state("ge"), evaluator.state("gt")) == (AlarmState.ALARM, AlarmState.OK)


def test_fill_stands_in_for_a_missing_metric() -> None:
    # Given only m1 has data; m2 (the phase budget, say) has none
    evaluator = AlarmEvaluator([math_alarm("a", "IF(FILL(m2, 0) > 0, 1, m1)", "GreaterThanOrEqualToThreshold", 100.0)])
    evaluator.add_datapoint(metric_key("CWAgent", "used", {}), T0 + 5, 100.0)

    # When evaluated: Then FILL makes m2 zero, so the expression is m1
    evaluator.evaluate(T0 + 60)
    assert evaluator.state("a") is AlarmState.ALARM


def test_metric_math_division_by_zero_has_no_datapoint() -> None:
    evaluator = AlarmEvaluator([math_alarm("a", "m1 / (m2 - m2)", "GreaterThanThreshold", 0.0)])
    evaluator.add_datapoint(metric_key("CWAgent", "used", {}), T0 + 5, 100.0)
    evaluator.add_datapoint(metric_key("CWAgent", "total", {}), T0 + 5, 200.0)
    evaluator.evaluate(T0 + 60)
    assert evaluator.state("a") is AlarmState.INSUFFICIENT_DATA


def test_percentile_statistic_takes_the_nearest_rank() -> None:
    # Given ten datapoints 0..9 in each of three minutes, and an alarm on p90 < 9
    alarm = {**simple_alarm(stat="p90"), "Threshold": 9.0}
    evaluator = AlarmEvaluator([alarm])
    for minute in range(3):
        for i in range(10):
            evaluator.add_datapoint(STEPS, T0 + 60 * minute + i, float(i))

    # When evaluated: Then p90 of 0..9 is 8, below 9, so it alarms
    evaluator.evaluate(T0 + 180)
    assert evaluator.state("a") is AlarmState.ALARM


def test_a_late_datapoint_in_a_period_already_read_is_counted() -> None:
    # Given a 3-of-3 alarm (missing data not breaching) evaluated each minute over steps, one minute missing
    evaluator = AlarmEvaluator([simple_alarm(treat="notBreaching", n=3, m=3)])
    feed(evaluator, [5, 0, None, 0])
    evaluator.evaluate(T0 + 180)
    evaluator.evaluate(T0 + 240)
    assert evaluator.state("a") is AlarmState.OK

    # When the missing minute's datapoint arrives late, with the next minute's, and it is evaluated again
    evaluator.add_datapoint(STEPS, T0 + 60 * 2 + 5, 0)
    evaluator.add_datapoint(STEPS, T0 + 60 * 4 + 5, 0)
    evaluator.evaluate(T0 + 300)

    # Then it counts, as for an evaluator that had it all along: three breaching minutes
    assert evaluator.state("a") is AlarmState.ALARM
    assert state_after(simple_alarm(treat="notBreaching", n=3, m=3), [5, 0, 0, 0, 0]) is AlarmState.ALARM


def test_shared_datapoints_beyond_now_are_not_seen_and_never_written() -> None:
    # Given an alarm reading a caller's datapoints, which already hold the future (a steady 5, then zeros)
    times = [T0 + 60 * i + 5 for i in range(10)]
    values = [5.0] * 3 + [0.0] * 7
    evaluator = AlarmEvaluator([simple_alarm(n=3, m=3)])
    evaluator.share_series(STEPS, times, values)

    # When it is evaluated minute by minute, and a datapoint is then added to that metric
    states = []
    for minute in range(1, 9):
        evaluator.evaluate(T0 + 60 * minute)
        states.append(evaluator.state("a"))
    evaluator.add_datapoint(STEPS, T0 + 60 * 20, 1.0)

    # Then it alarms only once three ended minutes breach, and the caller's lists are untouched
    assert states.index(AlarmState.ALARM) == 5
    assert len(times) == len(values) == 10
