"""trainer_agent: in-loop training telemetry (progress, throughput, TFLOPs/GPU, MFU, phases) for Stallwatch.

from trainer_agent import TrainerAgent
agent = TrainerAgent(flops_per_token=flops_per_token, total_steps=10_000)
for batch in loader:
    with agent.step(tokens=batch.numel(), samples=len(batch)):
        loss = train_step(batch)
    agent.record(loss=loss)
agent.close()
"""

from __future__ import annotations

from trainer_agent.agent import TrainerAgent
from trainer_agent.cloudwatch import CloudWatchSink
from trainer_agent.emf import metric_definitions
from trainer_agent.sinks import EmfStdoutSink, FanOutSink, JsonlSink, NullSink, Sink
from trainer_agent.stack_dumps import StallDumps
from trainer_agent.window import Window

__version__ = "0.1.0"  # the distribution's version (pyproject.toml reads it); CHANGELOG.md says what changed

__all__ = [
    "CloudWatchSink",
    "EmfStdoutSink",
    "FanOutSink",
    "JsonlSink",
    "NullSink",
    "Sink",
    "StallDumps",
    "TrainerAgent",
    "Window",
    "__version__",
    "metric_definitions",
]
