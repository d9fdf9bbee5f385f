"""What one on_alarm decision costs: AWS API calls and wall time, on moto, for a hung 8-host job.

    .venv/bin/python bench/decision_cost.py

Seeds an 8-host ml.p4d.24xlarge job hung for 40 minutes (agent metrics, SageMaker host metrics, logs), then runs
on_alarm twice through the real handler: the first alarm (decision: warn) and, after the grace period, a second
alarm transition (decision: stop). The same for an 8-node p4d.24xlarge EC2 cluster (one job by its stallwatch:job
tag, CloudWatch agent metrics, one log stream per instance). A first decision on a 1-host job warms the container
(botocore's first calls, the Slack secret read); it is reported, not budgeted. API calls are counted with botocore
``before-call`` hooks (one per API call, retries excluded) on every client the runtime uses. Budget: <= 10 calls and
< 1 s per decision.

It runs twice: on stock moto, whose GetMetricData scans every datapoint for every query and period (seconds for
77 series), and with `localrun/moto_metric_index` (moto's own answer, computed per metric): the budget is
checked on the second, which is closer to what the control plane itself costs.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "lambdas")]

import os  # noqa: E402

for name, value in {
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "POWERTOOLS_TRACE_DISABLED": "1",
    "POWERTOOLS_METRICS_DISABLED": "1",
    "POWERTOOLS_LOG_LEVEL": "WARNING",
}.items():
    os.environ[name] = value
os.environ.pop("AWS_ENDPOINT_URL", None)

import boto3  # noqa: E402
import moto  # noqa: E402

from handlers import on_alarm  # noqa: E402
from localrun import (  # noqa: E402
    moto_alarm_filters,
    moto_logs_filter,
    moto_logs_insights,
    moto_metric_index,
    moto_metric_search,
    moto_sagemaker,
)
from localrun.moto_world import (  # noqa: E402
    ALARM_ACTION_ARN,
    MINUTE,
    RECHECK_GROUP,
    RECHECK_ROLE_ARN,
    TABLE,
    Clock,
    LambdaContext,
    World,
    alarm_event,
)
from localrun.resources import create_table  # noqa: E402
from localrun.slack_receiver import SlackReceiver  # noqa: E402
from stallwatch.core import alarms  # noqa: E402
from stallwatch.runtime import environment  # noqa: E402

JOB = "llama-70b-pretrain"
WARMUP_JOB = "bert-base-ft"
EC2_JOB = "llm-70b"  # the instances' stallwatch:job tag
HOSTS = 8
CALL_BUDGET = 10
SECONDS_BUDGET = 1.0
REPEATS = 3
SERVICES = ("cloudwatch", "logs", "sagemaker", "ec2", "dynamodb", "secretsmanager", "scheduler")


def _setup(slack: SlackReceiver) -> environment.Runtime:
    create_table(boto3.client("dynamodb"), TABLE)
    secret = boto3.client("secretsmanager").create_secret(
        Name="slack", SecretString=json.dumps({"webhook_url": slack.url})
    )
    boto3.client("scheduler").create_schedule_group(Name=RECHECK_GROUP)  # rechecks scheduled as deployed
    os.environ.update(
        TABLE_NAME=TABLE,
        SLACK_SECRET_ARN=secret["ARN"],
        ALARM_ACTION_ARN=ALARM_ACTION_ARN,
        RECHECK_SCHEDULE_GROUP=RECHECK_GROUP,
        RECHECK_ROLE_ARN=RECHECK_ROLE_ARN,
    )
    rt = environment.Runtime.from_env()
    rt.clock = Clock(time.time())
    environment.runtime = lambda: rt  # the handler's runtime is this one
    return rt


def _seed(world: World, job: str, hosts: int) -> None:
    world.create_job(job, hosts=hosts, tags={"stallwatch:mode": "enforce"})
    world.steps_until(job, last_step_min=40)
    for i in range(1, hosts + 1):
        host = f"algo-{i}"
        world.host_gpu(job, host, world.every_minute(110, 100.0))
        world.agent_host(job, host, "GPUPowerWatts", world.every_minute(110, lambda m: 390.0 if m > 40 else 95.0))
        world.progress_logs(job, host, until_min=40)


def _measure(rt: environment.Runtime, event: dict[str, Any]) -> dict[str, Any]:
    calls: Counter[str] = Counter()

    def count(model: Any, **kwargs: Any) -> None:
        calls[f"{model.service_model.service_name}:{model.name}"] += 1

    clients = [getattr(rt.clients, service) for service in SERVICES]
    for client in clients:
        client.meta.events.register("before-call", count)
    start, cpu_start = time.perf_counter(), time.process_time()
    result = on_alarm.handler(event, LambdaContext())
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    for client in clients:
        client.meta.events.unregister("before-call", count)
    return {
        "action": result["action"],
        "calls": sum(calls.values()),
        "seconds": round(seconds, 3),
        "cpu_seconds": round(cpu, 3),
        "by_api": dict(calls),
    }


def _seed_ec2(world: World, job: str, nodes: int) -> list[str]:
    """The same hang on an EC2 cluster: instances tagged stallwatch:job, CWAgent metrics, a log stream per node."""
    instances = world.launch(nodes, {"stallwatch:job": job, "stallwatch:mode": "enforce"})
    world.steps_until(job, last_step_min=40)
    for instance in instances:
        world.ec2_gpu(instance, world.every_minute(110, 100.0))
        world.agent_host(job, instance, "GPUPowerWatts", world.every_minute(110, lambda m: 390.0 if m > 40 else 95.0))
        world.ec2_logs(instance, [(m, f"step {110 - m} loss 2.31") for m in range(110, 39, -5)])
    return instances


def run() -> dict[str, Any]:
    """A warm-up decision on a 1-host job, then the 8-host job's warn and, after the grace period, its stop; the same
    on an 8-node EC2 cluster."""
    with moto.mock_aws(), SlackReceiver() as slack:
        rt = _setup(slack)
        world = World(rt.clients, now=rt.clock())
        _seed(world, WARMUP_JOB, hosts=1)
        _seed(world, JOB, hosts=HOSTS)
        nodes = _seed_ec2(world, EC2_JOB, HOSTS)
        prefix = rt.config.alarm_prefix
        cold = _measure(rt, alarm_event(alarms.alarm_name(prefix, "sagemaker", WARMUP_JOB, alarms.PROGRESS)))
        warn = _measure(rt, alarm_event(alarms.alarm_name(prefix, "sagemaker", JOB, alarms.PROGRESS)))
        ec2_warn = _measure(rt, alarm_event(alarms.alarm_name(prefix, "ec2", EC2_JOB, alarms.PROGRESS)))
        rt.clock.advance(6 * MINUTE)
        host_alarm = alarms.alarm_name(prefix, "sagemaker", JOB, alarms.GPU_MEMORY, "algo-3")
        stop = _measure(rt, alarm_event(host_alarm, "2026-11-30T10:06:00.000+0000"))
        node_alarm = alarms.alarm_name(prefix, "ec2", EC2_JOB, alarms.GPU_MEMORY, nodes[2])
        ec2_stop = _measure(rt, alarm_event(node_alarm, "2026-11-30T10:06:00.000+0000"))
    return {
        "warm-up, 1 host: warn": cold,
        "8 hosts: warn": warn,
        "8 hosts: stop": stop,
        "EC2, 8 nodes: warn": ec2_warn,
        "EC2, 8 nodes: stop": ec2_stop,
    }


def main() -> int:
    moto_sagemaker.install()
    moto_metric_search.install()  # SEARCH and the Logs Insights query, which moto lacks
    moto_logs_insights.install()
    moto_alarm_filters.install()
    moto_logs_filter.install()
    stock = run()
    moto_metric_index.install()
    moto_metric_search.install()  # over the index
    # The fastest of a few runs: the machine's other load only ever adds time.
    indexed = min((run() for _ in range(REPEATS)), key=lambda r: max(d["seconds"] for d in r.values()))
    print(
        json.dumps(
            {"job": f"{HOSTS} x ml.p4d.24xlarge, hung 40 min", "stock moto": stock, "indexed": indexed}, indent=2
        )
    )
    within = all(
        r["calls"] <= CALL_BUDGET and (r["seconds"] < SECONDS_BUDGET or name.startswith("warm-up"))
        for name, r in indexed.items()
    )
    print(
        f"budget (<= {CALL_BUDGET} calls, < {SECONDS_BUDGET} s per decision, moto GetMetricData indexed): "
        f"{'met' if within else 'EXCEEDED'}"
    )
    return 0 if within else 1


if __name__ == "__main__":
    raise SystemExit(main())
