"""What every signal source reads, so the trace source shows the engine what the AWS source would.

The lookback and period of the metric reads, the statistic per agent metric, how many log lines a host's tail
keeps.
"""

from __future__ import annotations

from stallwatch.core import contract

LOOKBACK_SECONDS = 3 * 3600  # history the engine sees: baselines before the stall and the stall itself
METRIC_PERIOD_SECONDS = 60
LOG_LINES_PER_HOST = 20
LOG_TAIL_SECONDS = 600  # log lines read before the quietest host's last event
ERROR_LINES_PER_HOST = 10
# Statistic per agent metric: counts are summed, markers take the maximum, the rest are averaged. A declared phase's
# budget left is a marker, as its alarm reads it: a period's average of an agent publishing several windows a period
# is diluted by the windows after the phase ended (one window's 590 s read as 98), and the phase looks overrun.
AGENT_STATISTICS = {
    "Steps": "Sum",
    "NonFiniteLoss": "Sum",
    "Heartbeat": "Sum",
    "Step": "Maximum",
    "LastStepAge": "Maximum",
    "PhaseBudgetRemaining": "Maximum",
    contract.LOG_IDLE_SECONDS: "Maximum",
}
# The per-host series a decision reads from AWS: what `core.measures` uses (per-device GPU utilization, the
# agent's where the platform has none, and GPU power). A decision's datapoints grow with hosts times these (at
# 180 points a series, GetMetricData answers 100,800 a call): add a name here when the engine reads a new one.
# A GPU job's agent series go by their GPU names, which this release's agent writes beside the accelerator names
# and the last release's agent alone (contract.RENAMED_METRICS): `HostSignals.agent_series` reads either.
HOST_AGENT_METRICS_READ = ("GPUPowerWatts", "StepTime")  # StepTime: the straggler check
# A Neuron job's (Trainium): no platform publishes a NeuronCore's utilization, memory or power (SageMaker's host
# metrics and the CloudWatch agent's nvidia_smi_* are NVIDIA's, and their SEARCHes find nothing on a Neuron host), so
# the agent's, from neuron-monitor and the Neuron driver, are its witnesses; as many series as a GPU host's at most.
NEURON_AGENT_METRICS_READ = (
    "AcceleratorUtilization",
    "AcceleratorMemoryUtilization",
    "AcceleratorPowerPercent",
    "StepTime",
)
# HostSignals fields, from SageMaker's per-host metrics: memory says whether a host's processes still hold its GPUs
SAGEMAKER_HOST_METRICS_READ = ("gpu_util", "gpu_mem_util")
HOST_SERIES_READ = len(HOST_AGENT_METRICS_READ) + len(SAGEMAKER_HOST_METRICS_READ) + 1  # and LogIdleSeconds
DATAPOINTS_PER_ANSWER = 100_800  # GetMetricData answers at most this many datapoints a call, and pages the rest


def host_period(hosts: int, period: int, series: int = HOST_SERIES_READ) -> int:
    """The period of a job's per-host series (`series` a host: its platform's `host_series_read`): the job's own
    (`period`), or, for a job of so many hosts that one GetMetricData answer would not hold them (above 109 hosts
    at 60 s), the smallest multiple of it that does (512 hosts: 300 s). The job's own series keep `period`."""
    room = DATAPOINTS_PER_ANSWER - len(contract.JOB_METRICS) * (LOOKBACK_SECONDS // period)
    multiple = 1
    while hosts * series * (LOOKBACK_SECONDS // (period * multiple)) > room:
        multiple += 1
    return period * multiple


FILTER_STREAMS_LIMIT = 100  # FilterLogEvents' logStreamNames per call
