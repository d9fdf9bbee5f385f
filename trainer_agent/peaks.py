"""Peak dense TFLOP/s per device and precision, for MFU. Never guesses: unknown means None.

    peak_tflops("NVIDIA H100 80GB HBM3", "bf16")   # 989.4
    peak_tflops("NeuronCore-v2", "bf16")            # 95.0: one of a Trainium chip's two NeuronCores (trn1)
    peak_tflops("cpu", "bf16")                      # None (and MFU is not reported)

A device is what one rank drives: a GPU, or a NeuronCore (on trn2, a logical NeuronCore of LNC physical ones).
Figures are dense (no 2:4 sparsity): half the "with sparsity" numbers of NVIDIA's datasheets.
"""

from __future__ import annotations

import re

# Precision aliases -> the table's keys.
PRECISIONS = {
    "bf16": "bf16",
    "bfloat16": "bf16",
    "torch.bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "torch.float16": "fp16",
    "tf32": "tf32",
    "tfloat32": "tf32",
    "fp32": "fp32",
    "float32": "fp32",
    "torch.float32": "fp32",
    "fp8": "fp8",
}

# Device -> precision -> peak dense TFLOP/s of one device (one NeuronCore for Trainium).
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    # NVIDIA A100 datasheet (SXM and PCIe have the same tensor-core peaks).
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    # NVIDIA H100 datasheet.
    "H100 SXM": {"fp8": 1978.9, "bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "H100 PCIe": {"fp8": 1513.0, "bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2},
    "H100 NVL": {"fp8": 1670.5, "bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0},
    # NVIDIA H200 datasheet: the SXM part has H100 SXM's compute.
    "H200": {"fp8": 1978.9, "bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "H200 NVL": {"fp8": 1670.5, "bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0},
    # NVIDIA HGX B200 datasheet, per GPU.
    "B200": {"fp8": 4500.0, "bf16": 2250.0, "fp16": 2250.0, "tf32": 1100.0},
    # NVIDIA L4 / L40S datasheets.
    "L4": {"fp8": 242.5, "bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3},
    "L40S": {"fp8": 733.0, "bf16": 362.05, "fp16": 362.05, "tf32": 183.0, "fp32": 91.6},
    # AWS's A10G (g5): NVIDIA's A10 datasheet figures.
    "A10G": {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2},
    # Volta and Turing have no bf16 tensor cores: bf16 is absent on purpose.
    "V100 SXM": {"fp16": 125.0, "fp32": 15.7},
    "V100 PCIe": {"fp16": 112.0, "fp32": 14.0},
    "T4": {"fp16": 65.0, "fp32": 8.1},
    # AWS Neuron architecture guides, per chip divided by its NeuronCores. Trainium (trn1): 2 NeuronCore-v2 deliver
    # 190 FP16/BF16/cFP8/TF32 and 47.5 FP32 TFLOPS. Trainium2 (trn2): 8 NeuronCore-v3 deliver 1,299 FP8, 667
    # BF16/FP16/TF32 and 181 FP32 TFLOPS; a rank drives a logical NeuronCore of two of them (LNC=2, trn2's default).
    "NeuronCore-v2": {"fp8": 95.0, "bf16": 95.0, "fp16": 95.0, "tf32": 95.0, "fp32": 23.75},
    "NeuronCore-v3": {"fp8": 162.375, "bf16": 83.375, "fp16": 83.375, "tf32": 83.375, "fp32": 22.625},
}
PEAK_TFLOPS["NeuronCore-v3 LNC=2"] = {precision: 2 * peak for precision, peak in PEAK_TFLOPS["NeuronCore-v3"].items()}

# Device names as torch.cuda.get_device_name() reports them (or trainer_agent.neuron names a NeuronCore) -> table key;
# first match wins.
DEVICE_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(pattern, re.IGNORECASE), key)
    for pattern, key in [
        (r"\bH100\b.*\bNVL\b", "H100 NVL"),
        (r"\bH100\b.*\bPCIe\b", "H100 PCIe"),
        (r"\bG?H100\b", "H100 SXM"),
        (r"\bH200\b.*\bNVL\b", "H200 NVL"),
        (r"\bG?H200\b", "H200"),
        (r"\bB200\b", "B200"),
        (r"\bA100\b", "A100"),
        (r"\bL40S\b", "L40S"),
        (r"\bL4\b", "L4"),
        (r"\bA10G\b", "A10G"),
        (r"\bV100\b.*\bPCIe\b", "V100 PCIe"),
        (r"\bV100\b", "V100 SXM"),
        (r"\bT4\b", "T4"),
        (r"\bNeuronCore-v3 LNC=2\b", "NeuronCore-v3 LNC=2"),
        (r"\bNeuronCore-v3\b|\bNCv3\b|\bTrainium2\b|\btrn2\b", "NeuronCore-v3"),
        (r"\bNeuronCore-v2\b|\bNCv2\b|\bTrainium1?\b|\btrn1n?\b", "NeuronCore-v2"),
    ]
]


def device_key(device_name: str) -> str | None:
    """The table key for a device name, or None when the device is not in the table."""
    return next((key for pattern, key in DEVICE_PATTERNS if pattern.search(device_name)), None)


def precision_key(precision: object) -> str:
    """Normalise a precision ("bf16", "bfloat16", torch.bfloat16, ...); ValueError when unknown."""
    key = PRECISIONS.get(str(precision).lower())
    if key is None:
        raise ValueError(f"precision {precision!r} is not one of {sorted(PRECISIONS)}")
    return key


def peak_tflops(device_name: str, precision: object = "bf16") -> float | None:
    """Peak dense TFLOP/s of one device at a precision, or None when the table does not know it."""
    key = device_key(device_name)
    return None if key is None else PEAK_TFLOPS[key].get(precision_key(precision))
