"""CloudWatch metric reads: named series (MetricStat) and SEARCH expressions, in as few GetMetricData calls as the
500-query limit allows.

    refs = [MetricRef("Stallwatch", "Steps", (("JobName", "job"),), "Sum")]
    job = (("JobName", "job"),)
    searches = [SearchRef("Stallwatch", "Heartbeat", ("JobName", "Host"), job, "Sum", "${PROP('Dim.Host')}")]
    found = read_metrics(cloudwatch, [*refs, *searches], start, end)   # {ref: {label: Series}}

A SEARCH reads one metric of every host of a job in one query, however many hosts there are (CloudWatch returns
at most 500 series per SEARCH, each labelled by the dynamic label given, here the host).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from stallwatch.core.reading import METRIC_PERIOD_SECONDS
from stallwatch.core.signals import Series

MAX_QUERIES_PER_CALL = 500  # GetMetricData limit
MAX_SERIES_PER_SEARCH = 500  # CloudWatch returns at most this many series from one SEARCH
# "You can have as many as 100 search expressions on one graph" (search expression syntax, limits): held to per call.
MAX_SEARCHES_PER_CALL = 100
# "The maximum search expression query size is 1,024 characters" (CloudWatch search expression syntax, limits:
# https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/search-expression-syntax.html); the whole
# SEARCH(...) is held to it, the stricter reading.
MAX_SEARCH_CHARS = 1024
LONGEST_PERIOD = 86_400  # no read uses a longer period: a SEARCH measured with it fits with any period
# MetricStat.Period: "1, 5, 10, 20, 30, 60, or any multiple of 60" for high-resolution metrics, else a multiple of 60
# (https://docs.aws.amazon.com/AmazonCloudWatch/latest/APIReference/API_MetricStat.html).
HIGH_RESOLUTION_PERIODS = frozenset({1, 5, 10, 20, 30})


@dataclass(frozen=True)
class MetricRef:
    """One series to read: where it lives, how to aggregate it, and what to divide it by."""

    namespace: str
    name: str
    dimensions: tuple[tuple[str, str], ...]
    statistic: str = "Average"
    divisor: float = 1.0
    period: int | None = None  # its own period, instead of the read's

    def query(self, query_id: str, period: int) -> dict[str, Any]:
        metric = {
            "Namespace": self.namespace,
            "MetricName": self.name,
            "Dimensions": [{"Name": k, "Value": v} for k, v in self.dimensions],
        }
        stat = {"Metric": metric, "Period": self.period or period, "Stat": self.statistic}
        return {"Id": query_id, "MetricStat": stat}


@dataclass(frozen=True)
class SearchRef:
    """Every series of one metric (or of any of `names`, with it) whose dimensions are `dimension_names` and match
    `exact` (plus, optionally, a `phrase` found in a dimension value, and one of the phrases `any_of`), each labelled
    by the dynamic `label`."""

    namespace: str
    name: str
    dimension_names: tuple[str, ...]
    exact: tuple[tuple[str, str], ...]
    statistic: str
    label: str
    phrase: str | None = None
    divisor: float = 1.0
    period: int | None = None  # its own period, instead of the read's
    excluded: tuple[tuple[str, str], ...] = ()  # series left out (dimension, value): read by name instead
    names: tuple[str, ...] = ()  # more metric names, any of them (the label then names the metric)
    any_of: tuple[str, ...] = ()  # dimension values (exact phrases), any of them: the hosts of one part of a job

    def query(self, query_id: str, period: int) -> dict[str, Any]:
        return {"Id": query_id, "Expression": self.expression(period), "Label": self.label, "ReturnData": True}

    def expression(self, period: int) -> str:
        names = [f'MetricName="{name}"' for name in (self.name, *self.names)]
        terms = [names[0] if len(names) == 1 else f"({' OR '.join(names)})", *(f'{k}="{v}"' for k, v in self.exact)]
        if self.phrase:
            terms.append(f'"{self.phrase}"')
        if self.any_of:
            terms.append("(" + " OR ".join(f'"{value}"' for value in self.any_of) + ")")
        if self.excluded:
            terms.append("NOT (" + " OR ".join(f'{k}="{v}"' for k, v in self.excluded) + ")")
        schema = ",".join((self.namespace, *self.dimension_names))
        return f"SEARCH('{{{schema}}} {' '.join(terms)}', '{self.statistic}', {self.period or period})"

    def fits(self) -> bool:
        """Whether the expression is within CloudWatch's `MAX_SEARCH_CHARS`, whatever the read's period."""
        return len(self.expression(LONGEST_PERIOD)) <= MAX_SEARCH_CHARS

    def named(self, dimensions: tuple[tuple[str, str], ...]) -> MetricRef:
        """The one series of this metric with `dimensions`, read by name."""
        return MetricRef(self.namespace, self.name, dimensions, self.statistic, self.divisor, self.period)


MetricQuery = MetricRef | SearchRef
Point = tuple[float, float]


def read_metrics(
    cloudwatch: Any, wanted: list[MetricQuery], start: float, end: float, period: int = METRIC_PERIOD_SECONDS
) -> dict[MetricQuery, dict[str, Series]]:
    """Datapoints of every query, oldest first, per result label (a `MetricRef` has one, ``""``), divided by the
    query's divisor; 500 queries (100 of them SEARCHes) per GetMetricData call, every page read."""
    out: dict[MetricQuery, dict[str, Series]] = {}
    unique = list(dict.fromkeys(wanted))
    for given in {period, *(q.period for q in unique if q.period)}:
        check_period(given)
    for chunk in _calls(unique):
        points: dict[str, dict[str, list[Point]]] = {f"q{i}": defaultdict(list) for i in range(len(chunk))}
        request = {
            "MetricDataQueries": [q.query(f"q{i}", period) for i, q in enumerate(chunk)],
            "StartTime": datetime.fromtimestamp(start, UTC),
            "EndTime": datetime.fromtimestamp(end, UTC),
            "ScanBy": "TimestampAscending",
        }
        for response in cloudwatch.get_paginator("get_metric_data").paginate(**request):  # one call a page
            for result in response["MetricDataResults"]:
                label = result.get("Label", "") if isinstance(chunk[int(result["Id"][1:])], SearchRef) else ""
                points[result["Id"]][label].extend(
                    (ts.timestamp(), value) for ts, value in zip(result["Timestamps"], result["Values"], strict=True)
                )
        for i, query in enumerate(chunk):
            found = points[f"q{i}"]
            if isinstance(query, MetricRef):
                found.setdefault("", [])
            out[query] = {label: _series(series, query.divisor) for label, series in found.items()}
    return out


def _calls(queries: list[MetricQuery]) -> Iterator[list[MetricQuery]]:
    """The queries in GetMetricData calls: at most `MAX_QUERIES_PER_CALL`, `MAX_SEARCHES_PER_CALL` of them SEARCHes."""
    chunk: list[MetricQuery] = []
    searches = 0
    for query in queries:
        search = isinstance(query, SearchRef)
        if len(chunk) == MAX_QUERIES_PER_CALL or (search and searches == MAX_SEARCHES_PER_CALL):
            yield chunk
            chunk, searches = [], 0
        chunk.append(query)
        searches += search
    if chunk:
        yield chunk


def check_period(period: int) -> None:
    """`ValueError` for a period CloudWatch refuses (`HIGH_RESOLUTION_PERIODS`, or a multiple of 60)."""
    if period not in HIGH_RESOLUTION_PERIODS and (period <= 0 or period % 60):
        raise ValueError(f"period {period} s: CloudWatch takes 1, 5, 10, 20, 30 or a multiple of 60")


def _series(points: list[Point], divisor: float) -> Series:
    return Series(tuple((t, v / divisor) for t, v in sorted(points)))


def read_series(
    cloudwatch: Any, refs: list[MetricRef], start: float, end: float, period: int = METRIC_PERIOD_SECONDS
) -> dict[MetricRef, Series]:
    """Datapoints of every named series, oldest first."""
    return {ref: found[""] for ref, found in read_metrics(cloudwatch, list(refs), start, end, period).items()}
