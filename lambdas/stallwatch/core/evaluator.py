"""CloudWatch alarm semantics, locally: for the replay and the demo.

    evaluator = AlarmEvaluator(render_alarms(facts, policy, "stallwatch-", []))
    evaluator.add_datapoint(metric_key("Stallwatch", "Steps", {"JobName": "j"}), t=1_700_000_060, value=0)
    for transition in evaluator.evaluate(now=1_700_001_300):
        print(transition.alarm_name, transition.new)

What it reproduces, for the definitions `alarms.render_alarms` produces:

- periods aligned on multiples of ``Period`` since the epoch; a period counts once it has ended;
- the statistics Average, Sum, Minimum, Maximum, SampleCount and pNN;
- "M out of N": ``DatapointsToAlarm`` breaching among ``EvaluationPeriods``;
- missing data as CloudWatch documents it: the evaluation range reaches a little further back than N periods;
  with at least N real datapoints the newest N decide; with fewer, every real datapoint counts and the
  shortfall is filled per ``TreatMissingData`` (breaching, notBreaching), or the real ones alone decide
  (missing: ALARM once all of them, up to M, breach; ignore: the state changes only when M breach, or when too
  many are fine for M to be reachable); with none, missing -> INSUFFICIENT_DATA, ignore -> unchanged;
- metric math: numbers, metric ids, ``+ - * /``, comparisons, ``IF(c, a, b)`` and ``FILL(m, value)``.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

# CloudWatch looks back this many periods beyond EvaluationPeriods when datapoints are missing.
EXTRA_EVALUATION_PERIODS = 2

MetricKey = tuple[str, str, tuple[tuple[str, str], ...]]


def metric_key(namespace: str, name: str, dimensions: Mapping[str, str]) -> MetricKey:
    """The identity of one CloudWatch metric: namespace, name and its (sorted) dimensions."""
    return (namespace, name, tuple(sorted(dimensions.items())))


class AlarmState(StrEnum):
    OK = "OK"
    ALARM = "ALARM"
    INSUFFICIENT_DATA = "INSUFFICIENT_DATA"


@dataclass(frozen=True)
class Transition:
    """An alarm changed state at `at` (epoch seconds)."""

    alarm_name: str
    old: AlarmState
    new: AlarmState
    at: float
    reason: str


_COMPARISONS = {
    "GreaterThanThreshold": lambda v, t: v > t,
    "GreaterThanOrEqualToThreshold": lambda v, t: v >= t,
    "LessThanThreshold": lambda v, t: v < t,
    "LessThanOrEqualToThreshold": lambda v, t: v <= t,
}
_TREATMENTS = frozenset({"missing", "ignore", "breaching", "notBreaching"})


def _aggregate(values: list[float], stat: str) -> float:
    if stat == "Average":
        return sum(values) / len(values)
    if stat == "Sum":
        return sum(values)
    if stat == "Minimum":
        return min(values)
    if stat == "Maximum":
        return max(values)
    if stat == "SampleCount":
        return float(len(values))
    match = re.fullmatch(r"p(\d+(?:\.\d+)?)", stat)
    if match:
        ordered = sorted(values)
        rank = max(0, math.ceil(float(match.group(1)) / 100 * len(ordered)) - 1)
        return ordered[rank]
    raise ValueError(f"unsupported statistic {stat!r}")


class _Series:
    """One metric's raw datapoints, kept sorted by time, and the aggregates of periods already read (a period's
    aggregate is kept until a datapoint arrives before the end of one kept: replays read each period many times)."""

    CACHE_LIMIT = 4096  # kept aggregates; all forgotten at once beyond it

    def __init__(self, times: list[float] | None = None, values: list[float] | None = None) -> None:
        self.times: list[float] = times if times is not None else []
        self.values: list[float] = values if values is not None else []
        self._cache: dict[tuple[float, float, str], float | None] = {}
        self._cached_until = -math.inf
        self.generation = 0  # counts the times a datapoint arrived before the end of a period already read

    def add(self, t: float, value: float) -> None:
        if t < self._cached_until:
            self._cache.clear()
            self._cached_until = -math.inf
            self.generation += 1
        if not self.times or t >= self.times[-1]:
            self.times.append(t)
            self.values.append(value)
            return
        i = bisect.bisect_right(self.times, t)
        self.times.insert(i, t)
        self.values.insert(i, value)

    def aggregate(self, start: float, end: float, stat: str) -> float | None:
        key = (start, end, stat)
        if key in self._cache:
            return self._cache[key]
        lo = bisect.bisect_left(self.times, start)
        hi = bisect.bisect_left(self.times, end)
        value = _aggregate(self.values[lo:hi], stat) if hi > lo else None
        self._cached_until = max(self._cached_until, end)
        if len(self._cache) >= self.CACHE_LIMIT:
            self._cache.clear()
        self._cache[key] = value
        return value


# --- metric math -------------------------------------------------------------------------------------------------

_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d*)?|\.\d+)|([A-Za-z_][A-Za-z0-9_]*)|(>=|<=|==|!=|[-+*/(),<>]))")
Vector = list[float | None]


def _tokenize(expression: str) -> list[str]:
    tokens, pos = [], 0
    while pos < len(expression.rstrip()):
        match = _TOKEN.match(expression, pos)
        if not match:
            raise ValueError(f"metric math {expression!r}: cannot read {expression[pos:]!r}")
        tokens.append(next(g for g in match.groups() if g is not None))
        pos = match.end()
    return tokens


class _Expression:
    """A parsed metric-math expression, evaluated over aligned per-period vectors (None = missing)."""

    def __init__(self, expression: str) -> None:
        self.text = expression
        self.tokens = _tokenize(expression)
        self.pos = 0
        self.tree = self._comparison()
        if self.pos != len(self.tokens):
            raise ValueError(f"metric math {expression!r}: unexpected {self.tokens[self.pos]!r}")

    def _peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _take(self, expected: str | None = None) -> str:
        token = self._peek()
        if token is None or (expected is not None and token != expected):
            raise ValueError(f"metric math {self.text!r}: expected {expected or 'more'} at token {self.pos}")
        self.pos += 1
        return token

    def _comparison(self) -> Any:
        left = self._sum()
        while self._peek() in (">", "<", ">=", "<=", "==", "!="):
            left = (self._take(), left, self._sum())
        return left

    def _sum(self) -> Any:
        left = self._product()
        while self._peek() in ("+", "-"):
            left = (self._take(), left, self._product())
        return left

    def _product(self) -> Any:
        left = self._unary()
        while self._peek() in ("*", "/"):
            left = (self._take(), left, self._unary())
        return left

    def _unary(self) -> Any:
        if self._peek() == "-":
            self._take()
            return ("neg", self._unary())
        return self._atom()

    def _atom(self) -> Any:
        token = self._take()
        if token == "(":
            inner = self._comparison()
            self._take(")")
            return inner
        if token[0].isdigit() or token[0] == ".":
            return ("num", float(token))
        if token[0].isalpha() or token[0] == "_":
            if self._peek() != "(":
                return ("id", token)
            self._take("(")
            args = [self._comparison()]
            while self._peek() == ",":
                self._take(",")
                args.append(self._comparison())
            self._take(")")
            name = token.upper()
            arity = {"IF": 3, "FILL": 2}.get(name)
            if arity is None:
                raise ValueError(f"metric math {self.text!r}: unsupported function {token!r}")
            if len(args) != arity:
                raise ValueError(f"metric math {self.text!r}: {name} takes {arity} arguments, got {len(args)}")
            return (name, *args)
        raise ValueError(f"metric math {self.text!r}: unexpected {token!r}")

    def evaluate(self, vectors: Mapping[str, Vector], length: int) -> Vector:
        return self._eval(self.tree, vectors, length)

    def _eval(self, node: Any, vectors: Mapping[str, Vector], n: int) -> Vector:
        op = node[0]
        if op == "num":
            return [node[1]] * n
        if op == "id":
            if node[1] not in vectors:
                raise ValueError(f"metric math {self.text!r}: unknown id {node[1]!r}")
            return vectors[node[1]]
        if op == "neg":
            return [None if v is None else -v for v in self._eval(node[1], vectors, n)]
        if op == "FILL":
            series, fill = self._eval(node[1], vectors, n), self._eval(node[2], vectors, n)
            return [f if v is None else v for v, f in zip(series, fill, strict=True)]
        if op == "IF":
            cond, then, other = (self._eval(arg, vectors, n) for arg in node[1:])
            return [None if c is None else (a if c else b) for c, a, b in zip(cond, then, other, strict=True)]
        left, right = self._eval(node[1], vectors, n), self._eval(node[2], vectors, n)
        return [_binary(op, a, b) for a, b in zip(left, right, strict=True)]


def _binary(op: str, a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return None
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        return None if b == 0 else a / b
    return float({">": a > b, "<": a < b, ">=": a >= b, "<=": a <= b, "==": a == b, "!=": a != b}[op])


# --- alarms ------------------------------------------------------------------------------------------------------


def _dimensions(raw: Iterable[Mapping[str, str]]) -> dict[str, str]:
    return {d["Name"]: d["Value"] for d in raw}


@dataclass(frozen=True)
class _Query:
    """One `MetricStat` of an alarm."""

    key: MetricKey
    stat: str


class _Alarm:
    """One alarm definition (PutMetricAlarm kwargs) and its current state."""

    def __init__(self, definition: Mapping[str, Any]) -> None:
        name = definition.get("AlarmName")
        if not name:
            raise ValueError("alarm definition without AlarmName")
        self.name: str = name
        self.state = AlarmState.INSUFFICIENT_DATA
        self.evaluation_periods = int(definition["EvaluationPeriods"])
        self.datapoints_to_alarm = int(definition.get("DatapointsToAlarm", self.evaluation_periods))
        if not 1 <= self.datapoints_to_alarm <= self.evaluation_periods:
            raise ValueError(f"alarm {name}: DatapointsToAlarm must be 1..EvaluationPeriods")
        self.threshold = float(definition["Threshold"])
        operator = definition["ComparisonOperator"]
        if operator not in _COMPARISONS:
            raise ValueError(f"alarm {name}: unsupported ComparisonOperator {operator!r}")
        self.breaches = _COMPARISONS[operator]
        self.operator = operator
        self.treat_missing = definition.get("TreatMissingData", "missing")
        if self.treat_missing not in _TREATMENTS:
            raise ValueError(f"alarm {name}: unsupported TreatMissingData {self.treat_missing!r}")
        self.queries: dict[str, _Query] = {}
        self.expression: _Expression | None = None
        # The per-query vectors of the last evaluation, its last period's end, and the series they were read from
        # (each with its generation): a minute later only the newest period needs reading.
        self._last: tuple[float, dict[str, Vector], dict[str, tuple[int, int] | None]] | None = None
        if "Metrics" in definition:
            self._read_metrics(definition["Metrics"])
        else:
            key = metric_key(
                definition["Namespace"], definition["MetricName"], _dimensions(definition.get("Dimensions", []))
            )
            self.queries["m1"] = _Query(key, definition["Statistic"])
            self.period = int(definition["Period"])
            self.output = "m1"

    def _read_metrics(self, metrics: list[Mapping[str, Any]]) -> None:
        outputs = [m["Id"] for m in metrics if m.get("ReturnData", True)]
        if len(outputs) != 1:
            raise ValueError(f"alarm {self.name}: exactly one metric must have ReturnData, got {outputs}")
        self.output = outputs[0]
        periods = set()
        for m in metrics:
            if "MetricStat" in m:
                stat = m["MetricStat"]
                metric = stat["Metric"]
                key = metric_key(metric["Namespace"], metric["MetricName"], _dimensions(metric.get("Dimensions", [])))
                self.queries[m["Id"]] = _Query(key, stat["Stat"])
                periods.add(int(stat["Period"]))
            elif m["Id"] == self.output:
                self.expression = _Expression(m["Expression"])
            else:
                raise ValueError(f"alarm {self.name}: only the returned metric may be an expression ({m['Id']})")
        if len(periods) != 1:
            raise ValueError(f"alarm {self.name}: all metrics need one Period, got {sorted(periods)}")
        self.period = periods.pop()

    def values(self, series: Mapping[MetricKey, _Series], now: float) -> Vector:
        """The alarm's per-period values over its evaluation range, oldest first (None = missing)."""
        count = self.evaluation_periods + EXTRA_EVALUATION_PERIODS
        last_end = math.floor(now / self.period) * self.period
        starts = [last_end - (count - i) * self.period for i in range(count)]
        read = {metric_id: series.get(query.key) for metric_id, query in self.queries.items()}
        seen = {metric_id: (id(data), data.generation) if data else None for metric_id, data in read.items()}
        slide = self._last is not None and self._last[0] == last_end - self.period and self._last[2] == seen
        vectors: dict[str, Vector] = {}
        for metric_id, query in self.queries.items():
            data = read[metric_id]
            if slide:  # the older periods are as they were: read the newest only
                assert self._last is not None
                newest = data.aggregate(starts[-1], last_end, query.stat) if data else None
                vectors[metric_id] = [*self._last[1][metric_id][1:], newest]
            else:
                vectors[metric_id] = [data.aggregate(s, s + self.period, query.stat) if data else None for s in starts]
        self._last = (last_end, vectors, seen)
        if self.expression is None:
            return vectors[self.output]
        # An expression has a datapoint only where one of its metrics has one.
        present = [any(v[i] is not None for v in vectors.values()) for i in range(count)]
        result = self.expression.evaluate(vectors, count)
        return [v if p else None for v, p in zip(result, present, strict=True)]

    def next_state(self, values: Vector) -> tuple[AlarmState, str]:
        real = [v for v in values if v is not None]
        n, m = self.evaluation_periods, self.datapoints_to_alarm
        if len(real) >= n:
            breaching = sum(self.breaches(v, self.threshold) for v in real[-n:])
            evaluated = n
        elif not real:
            if self.treat_missing == "missing":
                return AlarmState.INSUFFICIENT_DATA, "no datapoints in the evaluation range"
            if self.treat_missing == "ignore":
                return self.state, "no datapoints in the evaluation range; state kept"
            breaching = n if self.treat_missing == "breaching" else 0
            evaluated = n
        else:
            breaching = sum(self.breaches(v, self.threshold) for v in real)
            evaluated = len(real)
            if self.treat_missing == "breaching":
                breaching, evaluated = breaching + n - len(real), n
            elif self.treat_missing == "notBreaching":
                evaluated = n
            elif self.treat_missing == "missing":
                m = min(m, len(real))  # CloudWatch: the few real datapoints decide
            elif breaching < m and len(real) - breaching <= n - m:
                return (
                    self.state,
                    f"{breaching} of {len(real)} real datapoints breaching; too few to decide, state kept",
                )
        state = AlarmState.ALARM if breaching >= m else AlarmState.OK
        verb = "breaching" if state is AlarmState.ALARM else "not enough breaching"
        return state, f"{breaching} of {evaluated} datapoints {verb} ({self.operator} {self.threshold:g}, need {m})"


class AlarmEvaluator:
    """Alarm definitions, the datapoints they read, and their states as time goes on."""

    def __init__(self, alarms: Iterable[Mapping[str, Any]] = ()) -> None:
        self._alarms: dict[str, _Alarm] = {}
        self._series: dict[MetricKey, _Series] = {}
        self._shared: set[MetricKey] = set()
        for definition in alarms:
            self.put_alarm(definition)

    def put_alarm(self, definition: Mapping[str, Any]) -> None:
        """Create or replace an alarm from its PutMetricAlarm kwargs; it starts in INSUFFICIENT_DATA."""
        alarm = _Alarm(definition)
        self._alarms[alarm.name] = alarm

    def delete_alarms(self, names: Iterable[str]) -> None:
        for name in names:
            self._alarms.pop(name, None)

    def add_datapoint(self, key: MetricKey, t: float, value: float) -> None:
        """Record one datapoint of a metric at epoch seconds `t`."""
        if key in self._shared:  # never write into a caller's lists
            series = self._series[key]
            self._series[key] = _Series(list(series.times), list(series.values))
            self._shared.discard(key)
        self._series.setdefault(key, _Series()).add(t, value)

    def share_series(self, key: MetricKey, times: list[float], values: list[float]) -> None:
        """Read a metric's datapoints from the caller's sorted lists, without copying them (a replay's trace
        holds its whole future: alarms read only periods that have ended by `now`, so they see no more than if
        each datapoint had been added at its time). The caller must only append to them."""
        self._series[key] = _Series(times, values)
        self._shared.add(key)

    def add_datapoints(
        self, namespace: str, name: str, dimensions: Mapping[str, str], points: Iterable[tuple[float, float]]
    ) -> None:
        key = metric_key(namespace, name, dimensions)
        for t, value in points:
            self.add_datapoint(key, t, value)

    def alarm_names(self) -> list[str]:
        return list(self._alarms)

    def state(self, name: str) -> AlarmState:
        return self._alarms[name].state

    def evaluate(self, now: float) -> list[Transition]:
        """Evaluate every alarm as CloudWatch would at `now`; return the state changes."""
        transitions = []
        for alarm in self._alarms.values():
            new, reason = alarm.next_state(alarm.values(self._series, now))
            if new is not alarm.state:
                transitions.append(Transition(alarm.name, alarm.state, new, now, reason))
                alarm.state = new
        return transitions
