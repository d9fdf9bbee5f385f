"""The CloudWatch agent's GPU vocabulary, for hosts that are EC2 instances running it (an EC2 job's, a Slurm node's):
its ``nvidia_smi_*`` series in ``CWAgent`` by ``InstanceId``, per device already, and what a decision reads of them.

    math = gpu_utilization("i-0abc...")              # MetricMath of nvidia_smi_utilization_gpu
    series = host_series("i-0abc...", read)          # gpu_util, gpu_mem_util (percent of the total), cpu_util, power
"""

from __future__ import annotations

from stallwatch.core import contract
from stallwatch.core.platforms.interface import MetricMath, SeriesReader
from stallwatch.core.reading import HOST_AGENT_METRICS_READ
from stallwatch.core.signals import Series

# Platform metrics per host: HostSignals field (or the two memory series) -> (namespace, metric name).
HOST_METRICS = {
    "gpu_util": (contract.CWAGENT_NAMESPACE, contract.CWAGENT_GPU_UTILIZATION),
    "gpu_mem_used": (contract.CWAGENT_NAMESPACE, contract.CWAGENT_GPU_MEMORY_USED),
    "gpu_mem_total": (contract.CWAGENT_NAMESPACE, contract.CWAGENT_GPU_MEMORY_TOTAL),
    "cpu_util": (contract.EC2_NAMESPACE, "CPUUtilization"),
    "gpu_power": (contract.CWAGENT_NAMESPACE, contract.CWAGENT_GPU_POWER),
}
# The CloudWatch agent's series a decision reads (`cpu_util` is no rule's: SageMaker's is not read either).
HOST_METRICS_READ = ("gpu_util", "gpu_mem_used", "gpu_mem_total", "gpu_power")
# The training agent's own NVML utilization stands in where a host may have no CloudWatch agent.
AGENT_METRICS_READ = (*HOST_AGENT_METRICS_READ, "GPUUtilization")


def host_dimensions(instance: str) -> dict[str, str]:
    return {contract.CWAGENT_DIM_INSTANCE: instance}


def memory_percent(used: Series, total: Series) -> Series:
    """100 x used / total at the timestamps both have."""
    totals = dict(total.points)
    return Series(tuple((t, 100 * v / totals[t]) for t, v in used.points if totals.get(t)))


def gpu_utilization(instance: str) -> MetricMath:
    metric = (*HOST_METRICS["gpu_util"], host_dimensions(instance))
    return MetricMath({"m1": metric}, "m1", "GPU utilization per GPU")


def gpu_memory(instance: str) -> MetricMath:
    used = (*HOST_METRICS["gpu_mem_used"], host_dimensions(instance))
    total = (*HOST_METRICS["gpu_mem_total"], host_dimensions(instance))
    return MetricMath({"m1": used, "m2": total}, "100 * m1 / m2", "GPU memory used per GPU")


def host_series(instance: str, read: SeriesReader) -> dict[str, Series]:
    """The instance's series (per device already); memory is a percentage of the total."""
    dims = host_dimensions(instance)
    series = {name: read(ns, metric, dims, 1.0) for name, (ns, metric) in HOST_METRICS.items()}
    series["gpu_mem_util"] = memory_percent(series.pop("gpu_mem_used"), series.pop("gpu_mem_total"))
    return series
