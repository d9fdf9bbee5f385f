"""Accelerated instance types: devices, vCPUs and on-demand list price (us-east-1, USD per hour).

Used to normalize platform metrics per device and to estimate what a stall burns:

    burn(InstanceSpec lookup) = hosts x price x stalled hours
    estimate_burn("ml.p5.48xlarge", hosts=8, seconds=3600).dollars  # 904.56

Prices are public on-demand list prices (SageMaker Training and EC2 Linux, us-east-1) as published in 2025;
they exclude discounts, Savings Plans and spot. Unknown types cost nothing and count one device per host; beside
accelerated hosts (a heterogeneous cluster's data loaders on c5, m7i, ...), `accelerated` tells a CPU-only group.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class InstanceSpec:
    """One instance type: accelerator devices per host, vCPUs, and on-demand USD per hour."""

    devices: int
    vcpus: int
    usd_per_hour: float


# GPU/Trainium counts and vCPUs per instance family size, shared by EC2 and SageMaker (ml.) types.
_G_SIZES = {  # g5 / g6: size -> (GPUs, vCPUs)
    "xlarge": (1, 4),
    "2xlarge": (1, 8),
    "4xlarge": (1, 16),
    "8xlarge": (1, 32),
    "12xlarge": (4, 48),
    "16xlarge": (1, 64),
    "24xlarge": (4, 96),
    "48xlarge": (8, 192),
}
_G5_EC2 = {"xlarge": 1.006, "2xlarge": 1.212, "4xlarge": 1.624, "8xlarge": 2.448, "12xlarge": 5.672}
_G5_EC2 |= {"16xlarge": 4.096, "24xlarge": 8.144, "48xlarge": 16.288}
_G5_SAGEMAKER = {"xlarge": 1.408, "2xlarge": 1.515, "4xlarge": 2.03, "8xlarge": 3.06, "12xlarge": 7.09}
_G5_SAGEMAKER |= {"16xlarge": 5.72, "24xlarge": 10.18, "48xlarge": 20.36}
_G6_EC2 = {"xlarge": 0.8048, "2xlarge": 0.9776, "4xlarge": 1.3232, "8xlarge": 2.0144, "12xlarge": 4.6016}
_G6_EC2 |= {"16xlarge": 3.3968, "24xlarge": 6.6758, "48xlarge": 13.3504}

INSTANCE_SPECS: dict[str, InstanceSpec] = {
    # SageMaker Training
    "ml.p4d.24xlarge": InstanceSpec(8, 96, 37.688),
    "ml.p4de.24xlarge": InstanceSpec(8, 96, 47.11),
    "ml.p5.48xlarge": InstanceSpec(8, 192, 113.07),
    "ml.p5e.48xlarge": InstanceSpec(8, 192, 126.79),
    "ml.p5en.48xlarge": InstanceSpec(8, 192, 131.80),
    "ml.trn1.32xlarge": InstanceSpec(16, 128, 24.725),
    **{f"ml.g5.{size}": InstanceSpec(*_G_SIZES[size], price) for size, price in _G5_SAGEMAKER.items()},
    # EC2
    "p4d.24xlarge": InstanceSpec(8, 96, 32.7726),
    "p4de.24xlarge": InstanceSpec(8, 96, 40.9657),
    "p5.48xlarge": InstanceSpec(8, 192, 55.04),
    "trn1.2xlarge": InstanceSpec(1, 8, 1.34375),
    "trn1.32xlarge": InstanceSpec(16, 128, 21.50),
    **{f"g5.{size}": InstanceSpec(*_G_SIZES[size], price) for size, price in _G5_EC2.items()},
    **{f"g6.{size}": InstanceSpec(*_G_SIZES[size], price) for size, price in _G6_EC2.items()},
}
UNKNOWN_INSTANCE = InstanceSpec(devices=1, vcpus=1, usd_per_hour=0.0)
# Instance families with accelerators: GPUs (p, g, gr), Trainium, Inferentia, Gaudi.
ACCELERATED_FAMILIES = re.compile(r"(p|gr?|trn|inf|dl)[0-9]")
# Of those, AWS's Neuron devices (Trainium, Inferentia): the Neuron tools see them, NVML and nvidia-smi do not.
NEURON_FAMILIES = re.compile(r"(trn|inf)[0-9]")


def instance_spec(instance_type: str) -> InstanceSpec:
    """The spec of `instance_type`, or `UNKNOWN_INSTANCE` (no price) for types not in the table."""
    return INSTANCE_SPECS.get(instance_type, UNKNOWN_INSTANCE)


def accelerated(instance_type: str) -> bool:
    """Whether `instance_type` (EC2's or SageMaker's `ml.` name) is of a family with accelerators."""
    return bool(ACCELERATED_FAMILIES.match(instance_type.removeprefix("ml.")))


def neuron(instance_type: str) -> bool:
    """Whether `instance_type` (EC2's or SageMaker's `ml.` name) has Neuron devices (Trainium, Inferentia)."""
    return bool(NEURON_FAMILIES.match(instance_type.removeprefix("ml.")))


@dataclass(frozen=True)
class Burn:
    """What a stall cost: device-hours and estimated dollars (None when the type has no price)."""

    device_hours: float
    dollars: float | None


def estimate_burn(instance_type: str, hosts: int, seconds: float) -> Burn:
    """Device-hours and on-demand dollars for `hosts` instances of `instance_type` over `seconds`."""
    spec = instance_spec(instance_type)
    hours = max(seconds, 0.0) / 3600
    dollars = hosts * spec.usd_per_hour * hours if spec.usd_per_hour else None
    return Burn(device_hours=hosts * spec.devices * hours, dollars=dollars)


def estimate_fleet_burn(fleet: dict[str, int], seconds: float) -> Burn:
    """`estimate_burn` summed over a job's instance types (type -> hosts); dollars None when no type has a price."""
    burns = [estimate_burn(instance_type, hosts, seconds) for instance_type, hosts in fleet.items()]
    priced = [b.dollars for b in burns if b.dollars is not None]
    return Burn(device_hours=sum(b.device_hours for b in burns), dollars=sum(priced) if priced else None)
