"""The metric contract between the agent, the control plane and the dashboards.

One definition on the agent side; ``lambdas/stallwatch/contract.py`` mirrors it and
``tests/test_contract.py`` checks that the two agree.
"""

from __future__ import annotations

NAMESPACE = "Stallwatch"
DIM_JOB = "JobName"
DIM_HOST = "Host"

# Per window, emitted by global rank 0 with dimension JobName: name -> CloudWatch unit.
JOB_METRICS: dict[str, str] = {
    "Steps": "Count",
    "Step": "None",
    "LastStepAge": "Seconds",
    "StepTime": "Seconds",
    "TokensPerSecond": "Count/Second",
    "SamplesPerSecond": "Count/Second",
    "TFLOPsPerGPU": "None",
    "MFU": "Percent",
    "DataWaitFraction": "Percent",
    "Loss": "None",
    "NonFiniteLoss": "Count",
    "PhaseBudgetRemaining": "Seconds",
    "ETA": "Seconds",
}

# Per window, emitted by one process per host with dimensions JobName and Host: liveness, not progress.
HOST_METRICS: dict[str, str] = {
    "Heartbeat": "Count",
    "GPUPowerWatts": "None",
    "GPUUtilization": "Percent",
    "GPUMemoryUtilization": "Percent",
    "StepTime": "Seconds",
}
