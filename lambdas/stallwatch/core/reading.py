"""What every signal source reads, so the trace source shows the engine what the AWS source would.

The lookback and period of the metric reads, the statistic per agent metric, how many log lines a host's tail
keeps, and SageMaker's log stream names.
"""

from __future__ import annotations

import re

from stallwatch.core import contract

LOOKBACK_SECONDS = 3 * 3600  # history the engine sees: baselines before the stall and the stall itself
METRIC_PERIOD_SECONDS = 60
LOG_LINES_PER_HOST = 20
LOG_TAIL_SECONDS = 600  # log lines read before the quietest host's last event
ERROR_LINES_PER_HOST = 10
# Statistic per agent metric: counts are summed, markers take the maximum, the rest are averaged.
AGENT_STATISTICS = {
    "Steps": "Sum",
    "NonFiniteLoss": "Sum",
    "Heartbeat": "Sum",
    "Step": "Maximum",
    "LastStepAge": "Maximum",
    contract.LOG_IDLE_SECONDS: "Maximum",
}
SAGEMAKER_STREAM = re.compile(r"^(?P<job>[^/]+)/(?P<host>algo-\d+)-\d+$")
# EC2 streams are named by instance id (the CloudWatch agent's {instance_id}), optionally with a suffix per file.
EC2_STREAM = re.compile(r"^(?P<host>i-[0-9a-f]{8,17})(?:/.*)?$")
FILTER_STREAMS_LIMIT = 100  # FilterLogEvents' logStreamNames per call
