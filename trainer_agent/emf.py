"""The stdout line: one CloudWatch Embedded Metric Format document per window, and SageMaker regexes for it.

{"_aws": {"Timestamp": ..., "CloudWatchMetrics": [{"Namespace": "Stallwatch", "Dimensions": [["JobName"]],
 "Metrics": [{"Name": "Steps", "Unit": "Count", "StorageResolution": 1}, ...]}]},
 "Scope": "job", "JobName": "my-job", "Steps": 12.0, ...}

estimator = PyTorch(..., metric_definitions=metric_definitions())
"""

from __future__ import annotations

from trainer_agent.contract import (
    DIM_HOST,
    DIM_JOB,
    HIGH_RESOLUTION_S,
    HOST_METRICS,
    JOB_METRICS,
    NAMESPACE,
    SCOPE_JOB,
    STANDARD_RESOLUTION_S,
)
from trainer_agent.window import Window

SCOPE_KEY = "Scope"
NUMBER_PATTERN = r"(-?[0-9.]+(?:[eE][-+]?[0-9]+)?)"
# The job line carries `"Scope": "job"` before its metrics, so a regex anchored on it never reads the host line.
_JOB_LINE_PREFIX = f'"{SCOPE_KEY}": "{SCOPE_JOB}"'


def storage_resolution(interval_s: float) -> int:
    """1 (high resolution) when windows are shorter than a minute, so 10 s/30 s alarms can use them."""
    return HIGH_RESOLUTION_S if interval_s < STANDARD_RESOLUTION_S else STANDARD_RESOLUTION_S


def emf_document(window: Window) -> dict[str, object]:
    """The EMF document of a window: the metrics with their contract units, under the window's dimensions."""
    units = JOB_METRICS if window.scope == SCOPE_JOB else HOST_METRICS
    dimensions = [DIM_JOB] if window.scope == SCOPE_JOB else [DIM_JOB, DIM_HOST]
    resolution = storage_resolution(window.interval_s)
    directive = {
        "Namespace": NAMESPACE,
        "Dimensions": [dimensions],
        "Metrics": [{"Name": name, "Unit": units[name], "StorageResolution": resolution} for name in window.metrics],
    }
    document: dict[str, object] = {"_aws": {"Timestamp": int(window.t * 1000), "CloudWatchMetrics": [directive]}}
    document |= {SCOPE_KEY: window.scope, DIM_JOB: window.job, DIM_HOST: window.host, "Rank": window.rank}
    if window.phase is not None:
        document["Phase"] = window.phase
    return document | window.metrics


def metric_definitions(prefix: str = "stallwatch:") -> list[dict[str, str]]:
    """SageMaker estimator `metric_definitions` reading the job metrics from the stdout line."""
    return [
        {"Name": f"{prefix}{name}", "Regex": f'{_JOB_LINE_PREFIX}.*"{name}": {NUMBER_PATTERN}'} for name in JOB_METRICS
    ]
