"""A small moto extension: SEARCH expressions in GetMetricData, with dynamic labels (moto 5.2.5 has neither).

    from localrun import moto_metric_search
    moto_metric_search.install()
    cloudwatch.get_metric_data(MetricDataQueries=[{
        "Id": "s1",
        "Expression": "SEARCH('{Stallwatch,JobName,Host} MetricName=\"Heartbeat\" JobName=\"my-job\"', 'Sum', 60)",
        "Label": "${PROP('Dim.Host')}",
    }], ...)                       # one result per matching series, each with Id "s1" and its host as label

The subset Stallwatch uses, as CloudWatch documents it: a schema ``{Namespace,Dim1,...}`` (metrics with exactly
those dimensions), ``Name="value"`` terms (the metric name or a dimension value, matched exactly), quoted phrases
(matched anywhere in the metric name or a dimension value), at most `MAX_SERIES_PER_SEARCH` series, and the
dynamic labels ``${PROP('Dim.<name>')}`` and ``${PROP('MetricName')}``, one ``NOT (Name="v" OR ...)`` of exact
terms, and groups ``(term OR term ...)`` of which one term must match. Each matching series is read by moto's
own MetricStat code (whatever `get_metric_data` is installed when this is), so the values are moto's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from moto.cloudwatch.models import CloudWatchBackend

MAX_SERIES_PER_SEARCH = 500  # CloudWatch's limit on the series one SEARCH returns
_SEARCH = re.compile(r"^SEARCH\('\{(?P<schema>[^}]*)\}(?P<terms>[^']*)',\s*'(?P<stat>\w+)',\s*(?P<period>\d+)\)$")
_TERM = re.compile(r'(?:(?P<key>[\w.:/-]+)=)?"(?P<value>[^"]*)"')
_NOT = re.compile(r"NOT \(([^)]*)\)")
_ANY = re.compile(r"\(([^)]*)\)")
_LABEL = re.compile(r"\$\{PROP\('(?P<prop>[\w.]+)'\)\}")

_inner: Any = None


def _series(backend: CloudWatchBackend) -> list[tuple[str, str, dict[str, str]]]:
    """Each series the backend holds, once, in the order its first datapoint came: (namespace, name, dimensions)."""
    seen: dict[tuple[str, str, tuple[tuple[str, str], ...]], None] = {}
    for datum in backend.get_all_metrics():
        seen.setdefault((datum.namespace, datum.name, tuple((d.name, d.value) for d in datum.dimensions)))
    return [(namespace, name, dict(dims)) for namespace, name, dims in seen]


def _matching(
    held: list[tuple[str, str, dict[str, str]]], schema: list[str], terms: str
) -> list[tuple[str, dict[str, str]]]:
    namespace, dim_names = schema[0], set(schema[1:])
    excluded_text = _NOT.search(terms)
    excluded = _Group(_TERM.finditer(excluded_text[1])) if excluded_text else None
    rest = _NOT.sub("", terms)
    groups = [_Group(_TERM.finditer(group)) for group in _ANY.findall(rest)]
    groups += [_Group([m]) for m in _TERM.finditer(_ANY.sub("", rest))]
    found: dict[tuple[str, frozenset[tuple[str, str]]], dict[str, str]] = {}
    for series_namespace, name, dims in held:  # dimensions in the order published: moto compares them in order
        if series_namespace != namespace or set(dims) != dim_names:
            continue
        props = {"MetricName": name, **dims}
        if excluded is not None and excluded.exact_match(props):
            continue
        if all(group.matches(props) for group in groups):
            found.setdefault((name, frozenset(dims.items())), dims)
    return [(name, dims) for (name, _), dims in found.items()][:MAX_SERIES_PER_SEARCH]


class _Group:
    """Terms of which one must match: ``Name="value"`` terms (looked up by name) and quoted phrases (found anywhere in
    the metric name or a dimension value)."""

    def __init__(self, terms: Iterable[re.Match[str]]) -> None:
        self.values: dict[str, set[str]] = {}
        self.phrases: list[str] = []
        for term in terms:
            if term["key"]:
                self.values.setdefault(term["key"], set()).add(term["value"])
            else:
                self.phrases.append(term["value"])

    def exact_match(self, props: dict[str, str]) -> bool:
        return any(props.get(key) in values for key, values in self.values.items())

    def matches(self, props: dict[str, str]) -> bool:
        return self.exact_match(props) or any(phrase in p for phrase in self.phrases for p in props.values())


def _label(template: str, name: str, dims: dict[str, str]) -> str:
    props = {"MetricName": name, **{f"Dim.{k}": v for k, v in dims.items()}}
    return _LABEL.sub(lambda m: props.get(m["prop"], ""), template)


def _with_search(
    self: CloudWatchBackend,
    queries: list[dict[str, Any]],
    start_time: datetime,
    end_time: datetime,
    scan_by: str = "TimestampAscending",
) -> list[dict[str, Any]]:
    searches = [q for q in queries if _SEARCH.match(q.get("Expression", "").strip())]
    others = [q for q in queries if q not in searches]
    results = _inner(self, others, start_time, end_time, scan_by) if others else []
    held = _series(self) if searches else []
    stats: list[dict[str, Any]] = []
    labelled: list[tuple[dict[str, Any], str, dict[str, str]]] = []  # each stat's search query, series name and dims
    for query in searches:
        match = _SEARCH.match(query["Expression"].strip())
        assert match is not None
        schema = [part.strip() for part in match["schema"].split(",")]
        series = _matching(held, schema, match["terms"])
        labelled += [(query, name, dims) for name, dims in series]
        stats += [
            {
                "Id": f"{query['Id']}_{i}",
                "MetricStat": {
                    "Metric": {
                        "Namespace": schema[0],
                        "MetricName": name,
                        "Dimensions": [{"Name": k, "Value": v} for k, v in dims.items()],
                    },
                    "Period": int(match["period"]),
                    "Stat": match["stat"],
                },
            }
            for i, (name, dims) in enumerate(series)
        ]
    found = _inner(self, stats, start_time, end_time, scan_by) if stats else []  # one read for every search
    for result, (query, name, dims) in zip(found, labelled, strict=True):
        label = _label(query.get("Label", ""), name, dims) or name
        results.append(result | {"id": query["Id"], "label": label})
    return results


def install() -> None:
    """Wrap the installed GetMetricData (moto's, or an indexed one installed before); again after another patch
    replaced it."""
    global _inner
    current = CloudWatchBackend.get_metric_data
    if current is not _with_search:
        _inner = current
        CloudWatchBackend.get_metric_data = _with_search  # type: ignore[method-assign]
