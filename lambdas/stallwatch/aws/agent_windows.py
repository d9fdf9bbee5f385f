"""The agent's windows of a job from CloudWatch, for `core.goodput`: one `Window` per metric period with steps.

windows(clients, "llama-8b", start, end, period=60)   # (Window(start, end, steps, step, in_phase, ...), ...)
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from stallwatch.aws.metric_reads import MetricRef, read_series
from stallwatch.core import contract
from stallwatch.core.goodput import Window

# What each window needs, and the statistic a period of several agent windows is read with.
WINDOW_METRICS = {
    "Steps": "Sum",
    "Step": "Maximum",
    "PhaseBudgetRemaining": "Maximum",
    "TFLOPsPerAccelerator": "Average",
    "TFLOPsPerGPU": "Average",  # its old name: an agent of the release before (contract.RENAMED_METRICS)
    "MFU": "Average",
}


def windows(clients: Any, job: str, start: float, end: float, period: int) -> tuple[Window, ...]:
    """The agent's job metrics over [start, end), one `Window` per period that has a Steps datapoint."""
    dims = ((contract.DIM_JOB, job),)
    refs = {name: MetricRef(contract.NAMESPACE, name, dims, statistic) for name, statistic in WINDOW_METRICS.items()}
    series = read_series(clients.cloudwatch, list(refs.values()), start - period, end + period, period)
    by_time: dict[float, dict[str, float]] = defaultdict(dict)
    for name, ref in refs.items():
        for t, value in series[ref].points:
            by_time[t][name] = value
    return tuple(
        Window(
            start=t,
            end=t + period,
            steps=values["Steps"],
            step=values.get("Step"),
            in_phase=values.get("PhaseBudgetRemaining", 0.0) > 0,
            tflops_per_gpu=values.get("TFLOPsPerAccelerator", values.get("TFLOPsPerGPU")),
            mfu=values.get("MFU"),
        )
        for t, values in sorted(by_time.items())
        if "Steps" in values
    )
