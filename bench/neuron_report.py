"""What reading one neuron-monitor report costs the agent's reader thread on a full trn1.32xlarge.

    python bench/neuron_report.py                 # 32 applications (a rank a NeuronCore), each with its model

The report has the shape of AWS's Neuron Monitor User Guide (tests/agent/test_neuron.py quotes it): every
application's `neuroncore_counters` (its core busy, the 31 others idle) and `memory_used` (with the breakdown per
core and its loaded model). The agent asks neuron-monitor for one every 15 s (trainer_agent.neuron_sampler), so the
share of a core it takes is the median below over 15 s.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # a repository tool: run from a checkout
from trainer_agent.neuron import read_report  # noqa: E402
from trainer_agent.neuron_sampler import SAMPLE_PERIOD  # noqa: E402

CORES = 32  # trn1.32xlarge: 16 Trainium devices of 2 NeuronCores
RUNS = 200


def application(core: int) -> dict[str, object]:
    """One rank's Neuron application, as neuron-monitor reports it."""
    per_core = {"constants": 61766864, "model_code": 1295008, "model_shared_scratchpad": 0, "runtime_memory": 43216}
    breakdown = {str(c): per_core | {"tensors": 0} for c in range(CORES)}
    model = {"name": "neff", "uuid": f"{core:032x}", "model_id": 10001, "is_running": True, "subgraphs": {
        "sg_00": {"memory_used_bytes": {"host": 12328, "neuron_device": 62547744}, "neuroncore_index": core,
                  "neuron_device_index": core // 2}}}  # fmt: skip
    return {"pid": 1000 + core, "neuron_runtime_tag": str(core), "error": "", "report": {
        "neuroncore_counters": {"period": 15.0, "error": "", "neuroncores_in_use": {
            str(c): {"neuroncore_utilization": 97.5 if c == core else 0.0} for c in range(CORES)}},
        "memory_used": {"period": 15.0, "error": "", "loaded_models": [model], "neuron_runtime_used_bytes": {
            "host": 2605992, "neuron_device": 63105088, "usage_breakdown": {"neuroncore_memory_usage": breakdown}}},
    }}  # fmt: skip


def main() -> int:
    hardware = {"neuron_device_count": CORES // 2, "neuroncore_per_device_count": 2, "error": ""}
    line = json.dumps({"neuron_runtime_data": [application(c) for c in range(CORES)], "neuron_hardware_info": hardware})
    times = []
    for _ in range(RUNS):
        started = time.perf_counter()
        read_report(json.loads(line))
        times.append(time.perf_counter() - started)
    median = statistics.median(times)
    period = float(SAMPLE_PERIOD.removesuffix("s"))
    print(
        f"a {CORES}-application report, {len(line) / 1024:.0f} KiB: read in {median * 1e3:.1f} ms (median of {RUNS});"
    )
    print(f"one every {period:g} s is {100 * median / period:.2f} % of a core")
    return 0


if __name__ == "__main__":
    sys.exit(main())
