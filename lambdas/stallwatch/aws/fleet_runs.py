"""Each run's goodput, kept when the run ends: the table's items the fleet report reads, and the metrics the fleet
dashboard sums.

    pk = "fleet-run"  sk = "<ended>#<job key>"    one run's `core.fleet.RunRecord` (kept `incident_ttl_days`)

One partition, sorted by the runs' ends: `since(t)` is one Query (a page per MB). The record is written in the
transaction that claims the run's end (`runtime.run_goodput`), so a duplicated end event records it once; its
metrics (`publish`) are one EMF line per category with GPU-hours, in the control plane's namespace, by category and
by category with each of platform, team and instance type (each with `service`, the deployment).

    FleetRuns(store).put(record, job_key, now)       # a transaction's Put
    FleetRuns(store).since(time.time() - 30 * 86_400)
    publish(record, now)
"""

from __future__ import annotations

import json
from typing import Any

from aws_lambda_powertools.metrics.functions import is_metrics_disabled

from stallwatch.aws.observability import service
from stallwatch.aws.store import Store
from stallwatch.core import contract
from stallwatch.core.fleet import RunRecord

FLEET_PK = "fleet-run"


class FleetRuns:
    """Run records in the Store's table."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.dynamodb = store.dynamodb
        self.table = store.table

    def put(self, record: RunRecord, key: str, now: float) -> dict[str, Any]:
        """The record's Put, for the transaction that claims its run's end."""
        item = {
            "pk": {"S": FLEET_PK},
            "sk": {"S": f"{record.ended:017.3f}#{key}"},
            "run": {"S": json.dumps(record.as_json())},
            "expires_at": self.store.expires(now),
        }
        return {"Put": {"TableName": self.table, "Item": item}}

    def since(self, t: float) -> list[RunRecord]:
        """The runs that ended at or after `t` (epoch seconds), oldest first."""
        pages = self.dynamodb.get_paginator("query").paginate(
            TableName=self.table,
            KeyConditionExpression="pk = :pk AND sk >= :since",
            ExpressionAttributeValues={":pk": {"S": FLEET_PK}, ":since": {"S": f"{t:017.3f}"}},
        )
        return [RunRecord.of_json(json.loads(item["run"]["S"])) for page in pages for item in page["Items"]]


def emf_lines(record: RunRecord, deployment: str, at: float) -> list[dict[str, Any]]:
    """The run's GPU-hours per category as EMF documents: one a category, with every dimension set."""
    sets = [[contract.DIM_CATEGORY, "service"]]
    sets += [[contract.DIM_CATEGORY, name, "service"] for name in contract.FLEET_DIMENSIONS]
    values = {
        contract.DIM_PLATFORM: record.platform,
        contract.DIM_TEAM: record.team,
        contract.DIM_INSTANCE_TYPE: record.instance_type,
        "service": deployment,
    }
    return [
        {
            "_aws": {
                "Timestamp": int(at * 1000),
                "CloudWatchMetrics": [
                    {
                        "Namespace": contract.CONTROL_PLANE_NAMESPACE,
                        "Dimensions": sets,
                        "Metrics": [{"Name": contract.RUN_GPU_HOURS, "Unit": "None"}],
                    }
                ],
            },
            **values,
            contract.DIM_CATEGORY: category.value,
            contract.RUN_GPU_HOURS: total.gpu_hours,
            "run": record.run,
        }
        for category, total in record.totals.items()
        if total.gpu_hours > 0
    ]


def publish(record: RunRecord, at: float) -> None:
    """The run's metrics at `at`, as EMF lines on stdout (CloudWatch Logs turns them into metrics; no API call);
    none where Powertools' metrics are off (POWERTOOLS_METRICS_DISABLED), as for the control plane's own."""
    if is_metrics_disabled():
        return
    for line in emf_lines(record, service, at):
        print(json.dumps(line))
