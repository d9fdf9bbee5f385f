"""The control plane's Powertools setup: its health metrics are named by the deployment."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_the_control_plane_metrics_carry_the_service_name_the_stack_sets() -> None:
    # Given the environment a deployment named team-b gives its functions
    script = (
        "from stallwatch.aws.observability import metrics\n"
        "metrics.add_metric(name='Decisions', unit='Count', value=1)\n"
        "print(json.dumps(metrics.serialize_metric_set()))\n"
    )
    env = {**os.environ, "POWERTOOLS_SERVICE_NAME": "team-b", "PYTHONPATH": os.pathsep.join(sys.path)}
    # When a function publishes a metric
    result = subprocess.run(
        [sys.executable, "-c", "import json\n" + script], env=env, capture_output=True, text=True, check=True
    )
    # Then its service dimension is the deployment's name
    emf = json.loads(result.stdout)
    assert emf["service"] == "team-b"
    assert emf["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["service"]]
