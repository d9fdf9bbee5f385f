"""What every signal source reads, so the trace source shows the engine what the AWS source would.

The lookback and period of the metric reads, the statistic per agent metric, how many log lines a host's tail
keeps, and SageMaker's log stream names.
"""

from __future__ import annotations

import re

LOOKBACK_SECONDS = 3 * 3600  # history the engine sees: baselines before the stall and the stall itself
METRIC_PERIOD_SECONDS = 60
LOG_LINES_PER_HOST = 20
ERROR_LINES_PER_HOST = 10
# Statistic per agent metric: counts are summed, markers take the maximum, the rest are averaged.
AGENT_STATISTICS = {
    "Steps": "Sum",
    "NonFiniteLoss": "Sum",
    "Heartbeat": "Sum",
    "Step": "Maximum",
    "LastStepAge": "Maximum",
}
# The per-host series a decision reads from AWS: what `core.measures` uses (per-device GPU utilization, the
# agent's where the platform has none, and GPU power). A decision's datapoints grow with hosts times these (at
# 180 points a series, GetMetricData answers 100,800 a call): add a name here when the engine reads a new one.
HOST_AGENT_METRICS_READ = ("GPUUtilization", "GPUPowerWatts")
SAGEMAKER_HOST_METRICS_READ = ("gpu_util",)  # HostSignals fields, from SageMaker's per-host metrics
SAGEMAKER_STREAM = re.compile(r"^(?P<job>[^/]+)/(?P<host>algo-\d+)-\d+$")
