"""Simulated host metrics: what the platform publishes for a training host, driven by what the host does.

SageMaker publishes to namespace ``/aws/sagemaker/TrainingJobs`` with dimension ``Host=<job>/algo-N``;
GPU metrics are summed over the host's devices (0-100 x GPUs) and CPU over its vCPUs (0-100 x vCPUs).
On EC2 the CloudWatch agent publishes ``nvidia_smi_*`` to ``CWAgent`` aggregated by ``InstanceId`` (the mean over the
devices; memory in MiB), and EC2 itself ``CPUUtilization`` to ``AWS/EC2``.

    simulator = HostMetricsSimulator(cloudwatch, "my-job", "algo-1", activity=lambda: HostActivity.TRAINING)
    simulator.publish()   # one sample of every metric
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from localrun.scenarios import GPUS_PER_HOST, VCPUS_PER_HOST, HostActivity
from stallwatch.core.contract import (
    CWAGENT_DIM_INSTANCE,
    CWAGENT_GPU_MEMORY_TOTAL,
    CWAGENT_GPU_MEMORY_USED,
    CWAGENT_GPU_UTILIZATION,
    CWAGENT_NAMESPACE,
    EC2_NAMESPACE,
    SAGEMAKER_NAMESPACE,
)
from stallwatch.core.signals import Platform

GPU_MEMORY_MIB = 40_960  # one A100 40 GB, as nvidia-smi reports memory.total


@dataclass(frozen=True)
class HostLoad:
    """Per-device GPU and per-vCPU CPU load (percent), memory and disk (percent of the host)."""

    gpu: tuple[float, float]  # (mean, jitter)
    gpu_memory: float
    cpu: tuple[float, float]
    memory: float
    disk: float


LOADS: dict[HostActivity, HostLoad] = {
    HostActivity.TRAINING: HostLoad(gpu=(95.0, 3.0), gpu_memory=78.0, cpu=(14.0, 3.0), memory=41.0, disk=22.0),
    HostActivity.HUNG: HostLoad(gpu=(100.0, 0.0), gpu_memory=78.0, cpu=(8.4, 0.2), memory=41.0, disk=22.0),
    HostActivity.IDLE: HostLoad(gpu=(0.5, 0.5), gpu_memory=78.0, cpu=(0.8, 0.3), memory=41.0, disk=22.0),
    HostActivity.CHECKPOINT: HostLoad(gpu=(2.0, 1.5), gpu_memory=78.0, cpu=(6.0, 2.0), memory=52.0, disk=31.0),
    HostActivity.EXITED: HostLoad(gpu=(0.0, 0.0), gpu_memory=0.0, cpu=(0.3, 0.1), memory=6.0, disk=22.0),
}


class HostMetricsSimulator:
    """Publishes one host's SageMaker metrics (high resolution) for the activity `activity()` returns."""

    def __init__(
        self,
        cloudwatch: Any,
        job: str,
        host: str,
        activity: Callable[[], HostActivity],
        seed: int = 0,
        platform: Platform = Platform.SAGEMAKER,
    ) -> None:
        self._cloudwatch = cloudwatch
        self._platform = platform
        self._host = host
        self._dimensions = [{"Name": "Host", "Value": f"{job}/{host}"}]
        self._activity = activity
        self._random = random.Random(seed)
        self.last_gpu_per_device: float | None = None

    def sample(self, activity: HostActivity) -> dict[str, float]:
        """One value per metric, summed over devices the way SageMaker reports them."""
        load = LOADS[activity]
        gpus = [self._jitter(*load.gpu) for _ in range(GPUS_PER_HOST)]
        cpus = [self._jitter(*load.cpu) for _ in range(VCPUS_PER_HOST)]
        return {
            "GPUUtilization": sum(gpus),
            "GPUMemoryUtilization": load.gpu_memory * GPUS_PER_HOST,
            "CPUUtilization": sum(cpus),
            "MemoryUtilization": load.memory,
            "DiskUtilization": load.disk,
        }

    def _jitter(self, mean: float, spread: float) -> float:
        return min(100.0, max(0.0, self._random.gauss(mean, spread))) if spread else mean

    def publish(self) -> None:
        """Put one sample of every host metric."""
        values = self.sample(self._activity())
        self.last_gpu_per_device = values["GPUUtilization"] / GPUS_PER_HOST
        if self._platform is Platform.EC2:
            self._publish_ec2(values)
            return
        self._cloudwatch.put_metric_data(
            Namespace=SAGEMAKER_NAMESPACE,
            MetricData=[_datum(name, self._dimensions, value, "Percent") for name, value in values.items()],
        )

    def _publish_ec2(self, values: dict[str, float]) -> None:
        dims = [{"Name": CWAGENT_DIM_INSTANCE, "Value": self._host}]
        used = values["GPUMemoryUtilization"] / GPUS_PER_HOST / 100 * GPU_MEMORY_MIB
        gpu = {
            CWAGENT_GPU_UTILIZATION: (values["GPUUtilization"] / GPUS_PER_HOST, "Percent"),
            CWAGENT_GPU_MEMORY_USED: (used, "Megabytes"),
            CWAGENT_GPU_MEMORY_TOTAL: (GPU_MEMORY_MIB, "Megabytes"),
        }
        self._cloudwatch.put_metric_data(
            Namespace=CWAGENT_NAMESPACE,
            MetricData=[_datum(name, dims, value, unit) for name, (value, unit) in gpu.items()],
        )
        cpu = values["CPUUtilization"] / VCPUS_PER_HOST
        self._cloudwatch.put_metric_data(
            Namespace=EC2_NAMESPACE, MetricData=[_datum("CPUUtilization", dims, cpu, "Percent")]
        )


def _datum(name: str, dimensions: list[dict[str, str]], value: float, unit: str) -> dict[str, Any]:
    return {
        "MetricName": name,
        "Dimensions": dimensions,
        "Value": round(value, 2),
        "Unit": unit,
        "StorageResolution": 1,
    }
