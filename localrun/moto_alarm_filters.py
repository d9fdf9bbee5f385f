"""A small moto extension: DescribeAlarms applies all its filters together and pages, as CloudWatch does.

    from localrun import moto_alarm_filters
    moto_alarm_filters.install()

moto applies only the first filter given (an `AlarmNamePrefix` drops `StateValue`) and answers every alarm in one
page. The sweeper asks for its prefix's alarms in ALARM, 100 a page: without this, tests and the bench would see
every alarm where CloudWatch answers a few.
"""

from __future__ import annotations

from typing import Any

from moto.cloudwatch.responses import CloudWatchResponse
from moto.core.responses import ActionResult

DEFAULT_MAX_RECORDS = 50  # DescribeAlarms' default page; 100 at most
METRIC_ALARM = "MetricAlarm"
COMPOSITE_ALARM = "CompositeAlarm"

_original: Any = None


def _describe_alarms(self: CloudWatchResponse) -> ActionResult:
    prefix = self._get_param("AlarmNamePrefix")
    names = set(self._get_param("AlarmNames", []))
    state = self._get_param("StateValue")
    action_prefix = self._get_param("ActionPrefix")
    types = set(self._get_param("AlarmTypes", [])) or {METRIC_ALARM}  # metric alarms only, unless asked
    alarms = sorted(self.cloudwatch_backend.describe_alarms(), key=lambda a: a.name)
    matching = [
        alarm
        for alarm in alarms
        if (not prefix or alarm.name.startswith(prefix))
        and (not names or alarm.name in names)
        and (not state or alarm.state_value == state)
        and (not action_prefix or any(a.startswith(action_prefix) for a in alarm.alarm_actions))
        and ((COMPOSITE_ALARM if alarm.rule is not None else METRIC_ALARM) in types)
    ]
    start = int(self._get_param("NextToken") or 0)
    size = int(self._get_param("MaxRecords") or DEFAULT_MAX_RECORDS)
    page = matching[start : start + size]
    result: dict[str, Any] = {
        "MetricAlarms": [a for a in page if a.rule is None],
        "CompositeAlarms": [a for a in page if a.rule is not None],
    }
    if start + size < len(matching):
        result["NextToken"] = str(start + size)
    return ActionResult(result)


def install() -> None:
    global _original
    if _original is None:
        _original = CloudWatchResponse.describe_alarms
        CloudWatchResponse.describe_alarms = _describe_alarms  # type: ignore[method-assign]
