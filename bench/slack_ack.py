"""How soon Slack gets its answer from a cold Slack endpoint, side by side with the work the answer no longer waits for.

    python bench/slack_ack.py              # 5 cold processes, ~1 min on 2 cores
    python bench/slack_ack.py --runs 10

Each run is a fresh Python process (a cold container: nothing imported, no client, no cached secret) against moto
in that process and a Slack stand-in on 127.0.0.1. It times, from the process's first line, importing the handler
and answering one signed "Stop now" (signature, payload, request claim, hand-off), then the deferred work
(allow-list, job check, transaction, StopTrainingJob, response_url). The moto setup between the two is not
counted. Slack's limit is 3 s; "inline" is what the answer would cost if the work ran before it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SLACK_LIMIT_S = 3.0

CHILD = r"""
import time
started, started_cpu = time.perf_counter(), time.process_time()
import json, os, sys
from handlers import slack_interactions  # the cold imports a Lambda container pays
imported, imported_cpu = time.perf_counter(), time.process_time()

import boto3, moto
from localrun import moto_sagemaker
from localrun.resources import create_table
from stallwatch.core.config import StallwatchConfig
from stallwatch.runtime import environment, interactions
from localrun.moto_world import (TABLE, LambdaContext, World)
from localrun.slack_receiver import SlackReceiver
from localrun.slack_presses import ALLOWED_USER, JOB, SIGNING_SECRET, press_payload, signed_request
from stallwatch.aws.buttons import OperatorAction
from stallwatch.aws.clients import AwsClients

moto_sagemaker.install()
with moto.mock_aws(), SlackReceiver() as slack:
    create_table(boto3.client("dynamodb"), TABLE)
    secret = {"webhook_url": slack.url, "signing_secret": SIGNING_SECRET}
    arn = boto3.client("secretsmanager").create_secret(Name="s", SecretString=json.dumps(secret))["ARN"]
    os.environ.update(TABLE_NAME=TABLE, SLACK_SECRET_ARN=arn, ALARM_ACTION_ARN="arn:aws:lambda:us-east-1:1:function:x")
    os.environ["STALLWATCH_CONFIG"] = StallwatchConfig.model_validate(
        {"slack": {"allowed_user_ids": [ALLOWED_USER]}}).model_dump_json()
    world = World(AwsClients(), now=time.time())
    world.create_job(JOB, hosts=2, tags={"stallwatch:mode": "enforce"})
    api = type("Api", (), {"response_url": slack.base + "/actions/T/1/x"})()
    event = signed_request(press_payload(api, OperatorAction.STOP_NOW), time.time())
    deferred = []
    setup_done, setup_cpu = time.perf_counter(), time.process_time()
    # what the handler's first call does in a cold container: the runtime (clients, table, secret) built from
    # the environment; only the hand-off is replaced (it would be one asynchronous Lambda Invoke)
    endpoint = interactions.Interactions(environment.Runtime.from_env(), defer=deferred.append)
    interactions.endpoint = lambda: endpoint
    answer = slack_interactions.handler(event, LambdaContext())
    answered, answered_cpu = time.perf_counter(), time.process_time()
    result = slack_interactions.handler({interactions.DEFERRED_EVENT_KEY: deferred.pop().model_dump()}, LambdaContext())
    done, done_cpu = time.perf_counter(), time.process_time()
assert answer["statusCode"] == 200 and result["status"] == "applied", (answer, result)
print(json.dumps({
    "import_s": imported - started, "answer_s": answered - setup_done, "work_s": done - answered,
    "import_cpu_s": imported_cpu - started_cpu, "answer_cpu_s": answered_cpu - setup_cpu,
    "work_cpu_s": done_cpu - answered_cpu,
}))
"""


def run_once() -> dict[str, float]:
    env = {
        "PYTHONPATH": f"{ROOT}:{ROOT / 'lambdas'}",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "POWERTOOLS_TRACE_DISABLED": "1",
        "POWERTOOLS_METRICS_DISABLED": "1",
        "PATH": "/usr/bin:/bin",
    }
    out = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    runs = [run_once() for _ in range(args.runs)]
    answer = [r["import_s"] + r["answer_s"] for r in runs]
    inline = [a + r["work_s"] for a, r in zip(answer, runs, strict=True)]
    print(f"{args.runs} cold runs (median, max):")
    print(f"  imports              {statistics.median(r['import_s'] for r in runs):.3f} s")
    print(
        f"  answer (cold)        {statistics.median(answer):.3f} s, max {max(answer):.3f} s  (limit {SLACK_LIMIT_S} s)"
    )
    print(f"  deferred work        {statistics.median(r['work_s'] for r in runs):.3f} s")
    print(f"  answer if inline     {statistics.median(inline):.3f} s, max {max(inline):.3f} s")
    print(f"  answer / inline      {statistics.median(a / i for a, i in zip(answer, inline, strict=True)):.2f}")
    cpu_answer = [r["import_cpu_s"] + r["answer_cpu_s"] for r in runs]
    cpu_work = [r["work_cpu_s"] for r in runs]
    print("CPU time of the process (what a busy shared host does not inflate), median:")
    print(
        f"  imports {statistics.median(r['import_cpu_s'] for r in runs):.3f} s, answer (cold) "
        f"{statistics.median(cpu_answer):.3f} s, deferred work {statistics.median(cpu_work):.3f} s"
    )


if __name__ == "__main__":
    main()
