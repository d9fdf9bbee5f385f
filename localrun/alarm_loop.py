"""CloudWatch's alarm evaluation, locally: moto stores alarms and metrics but never evaluates them.

Each `tick` reads the job's alarms as they are in moto (created by on_job_state from `render_alarms`),
reads the metrics they watch with GetMetricData, evaluates them with `stallwatch.core.evaluator.AlarmEvaluator`,
writes each new state back with SetAlarmState, and reports transitions (the caller invokes the alarm action).

    loop = AlarmLoop(cloudwatch, alarm_name_prefix, on_transition=handle)   # handle(alarm, state, previous)
    loop.tick(time.time())
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from localrun.aws_events import AlarmStateRecord
from stallwatch.core.evaluator import AlarmEvaluator, AlarmState, MetricKey, Transition, metric_key

# Datapoints may reach CloudWatch a few seconds after their period ends (agent window + background flush);
# a period is read, and evaluated, only once it ended this long ago.
SETTLE_S = 5.0
# GetMetricData reads this many periods beyond what the longest alarm evaluates.
EXTRA_READ_PERIODS = 4
THRESHOLD_CROSSED = "Threshold Crossed: "  # how CloudWatch's state reasons begin
# The fields of DescribeAlarms' MetricAlarms that define an alarm (what PutMetricAlarm took).
DEFINITION_FIELDS = (
    "AlarmName",
    "AlarmDescription",
    "Metrics",
    "Namespace",
    "MetricName",
    "Dimensions",
    "Statistic",
    "Period",
    "EvaluationPeriods",
    "DatapointsToAlarm",
    "Threshold",
    "ComparisonOperator",
    "TreatMissingData",
)


@dataclass(frozen=True)
class _Query:
    """One metric an alarm reads, with its statistic and period."""

    namespace: str
    name: str
    dimensions: tuple[tuple[str, str], ...]
    stat: str
    period: int

    @property
    def key(self) -> MetricKey:
        return metric_key(self.namespace, self.name, dict(self.dimensions))

    def request(self, query_id: str) -> dict[str, Any]:
        metric = {
            "Namespace": self.namespace,
            "MetricName": self.name,
            "Dimensions": [{"Name": k, "Value": v} for k, v in self.dimensions],
        }
        return {"Id": query_id, "MetricStat": {"Metric": metric, "Period": self.period, "Stat": self.stat}}


def definition(described: dict[str, Any]) -> dict[str, Any]:
    """An alarm from DescribeAlarms as PutMetricAlarm keyword arguments (moto reports empty fields too)."""
    return {k: described[k] for k in DEFINITION_FIELDS if described.get(k) not in (None, [], "")}


def queries(alarm: dict[str, Any]) -> list[_Query]:
    """The metrics an alarm definition reads."""
    if "Metrics" in alarm:
        stats = [m["MetricStat"] for m in alarm["Metrics"] if "MetricStat" in m]
        return [
            _Query(
                s["Metric"]["Namespace"],
                s["Metric"]["MetricName"],
                tuple((d["Name"], d["Value"]) for d in s["Metric"].get("Dimensions", [])),
                s["Stat"],
                int(s["Period"]),
            )
            for s in stats
        ]
    dimensions = tuple((d["Name"], d["Value"]) for d in alarm.get("Dimensions", []))
    return [_Query(alarm["Namespace"], alarm["MetricName"], dimensions, alarm["Statistic"], int(alarm["Period"]))]


class AlarmLoop:
    """Evaluates the alarms under `prefix` as CloudWatch would, and mirrors their states into moto."""

    def __init__(
        self,
        cloudwatch: Any,
        prefix: str,
        on_transition: Callable[[dict[str, Any], AlarmStateRecord, AlarmStateRecord], None],
    ) -> None:
        self._cloudwatch = cloudwatch
        self._prefix = prefix
        self._on_transition = on_transition
        self._evaluator = AlarmEvaluator()
        self._described: dict[str, dict[str, Any]] = {}
        self._queries: dict[_Query, float] = {}  # -> start of the newest period fed to the evaluator
        self.states: dict[str, AlarmStateRecord] = {}

    def tick(self, now: float) -> list[Transition]:
        """One evaluation round at `now`; returns the transitions (already written to moto and reported)."""
        self._sync_alarms(now)
        if not self._described:
            return []
        evaluated_at = now - SETTLE_S
        self._read_metrics(evaluated_at)
        transitions = self._evaluator.evaluate(evaluated_at)
        for transition in transitions:
            self._record(transition, now)
        return transitions

    def _sync_alarms(self, now: float) -> None:
        paginator = self._cloudwatch.get_paginator("describe_alarms")
        found = {
            alarm["AlarmName"]: alarm
            for page in paginator.paginate(AlarmNamePrefix=self._prefix, AlarmTypes=["MetricAlarm"])
            for alarm in page["MetricAlarms"]
        }
        gone = [name for name in self._described if name not in found]
        self._evaluator.delete_alarms(gone)
        for name in gone:
            del self._described[name]
            self.states.pop(name, None)
        wanted = {q for alarm in self._described.values() for q in queries(definition(alarm))}
        self._queries = {q: fed for q, fed in self._queries.items() if q in wanted}
        for name, alarm in found.items():
            if name in self._described:
                continue
            put = definition(alarm)
            self._evaluator.put_alarm(put)
            self._described[name] = alarm
            self.states[name] = AlarmStateRecord(
                AlarmState.INSUFFICIENT_DATA.value, "Unchecked: Initial alarm creation", now
            )
            for query in queries(put):
                self._queries.setdefault(query, 0.0)

    def _read_metrics(self, evaluated_at: float) -> None:
        """Feed the evaluator every period that ended by `evaluated_at` and was not fed yet."""
        longest = max(
            (a["EvaluationPeriods"] + EXTRA_READ_PERIODS) * max(q.period for q in queries(definition(a)))
            for a in self._described.values()
        )
        by_period: dict[int, list[_Query]] = {}
        for query in self._queries:
            by_period.setdefault(query.period, []).append(query)
        for period, group in by_period.items():
            end = math.floor(evaluated_at / period) * period
            start = end - math.ceil(longest / period) * period
            pages = self._cloudwatch.get_paginator("get_metric_data").paginate(
                MetricDataQueries=[q.request(f"q{i}") for i, q in enumerate(group)],
                StartTime=datetime.fromtimestamp(start, UTC),
                EndTime=datetime.fromtimestamp(end, UTC),
                ScanBy="TimestampAscending",
            )
            for result in (result for page in pages for result in page["MetricDataResults"]):
                query = group[int(result["Id"][1:])]
                for ts, value in sorted(zip(result["Timestamps"], result["Values"], strict=True)):
                    t = ts.timestamp()
                    if self._queries[query] < t and t + period <= end:
                        self._evaluator.add_datapoint(query.key, t, value)
                        self._queries[query] = t

    def _record(self, transition: Transition, now: float) -> None:
        alarm = self._described[transition.alarm_name]
        previous = self.states[transition.alarm_name]
        state = AlarmStateRecord(transition.new.value, f"{THRESHOLD_CROSSED}{transition.reason}", now)
        self.states[transition.alarm_name] = state
        self._cloudwatch.set_alarm_state(
            AlarmName=transition.alarm_name,
            StateValue=state.value,
            StateReason=state.reason[:1023],
            StateReasonData=json.dumps({"version": "1.0", "evaluatedAt": now}),
        )
        self._on_transition(alarm, state, previous)
