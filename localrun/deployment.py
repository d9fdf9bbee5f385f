"""`stallwatch doctor --local`: the doctor's checks against the local demo's deployment, so a newcomer sees what a
passing doctor looks like before owning an account.

    python -m localrun.deployment [--send-test-alert]    # what `stallwatch doctor --local` runs, from a checkout

The deployment is the stack's own template, synthesized offline from cdk.json, created on moto (in this process) with
the demo's table and a Slack webhook secret whose webhook is a local receiver on 127.0.0.1; the functions run here when
invoked (`moto_lambda_invoke`), IAM answers from the roles' own policies (`moto_iam_simulate`), and one sweep has run.
The doctor then runs every check it runs against AWS, and prints them as it does there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import moto  # imported before any boto3 client is created

from localrun import aws_events, moto_iam_simulate, moto_lambda_invoke, moto_sagemaker
from localrun.local_aws import FAKE_ACCOUNT, scoped_environ
from localrun.resources import create_resources
from localrun.slack_receiver import SlackReceiver
from localrun.stack_on_moto import deploy_on_moto
from stallwatch.offline import doctor
from stallwatch.offline.ops import Deployment

REPO_ROOT = Path(__file__).resolve().parent.parent
SWEEPER_HANDLER = "handlers.sweeper.handler"
OUTPUT_SHOWN_ON_FAILURE = 4000  # characters of the kept output
# moto's own account in this process (mock_aws, no server): no endpoint, no profile.
MOTO_ENVIRONMENT = {**FAKE_ACCOUNT, "AWS_ENDPOINT_URL": None, "AWS_PROFILE": None}


def synthesized_template(outdir: Path) -> tuple[str, dict[str, Any]]:
    """The default deployment's stack name and template, as `cdk synth` writes it from cdk.json (offline)."""
    # imported here: CDK starts a node process, which only this needs
    from aws_cdk import App

    from stacks.application import add_stacks
    from stacks.constants import BUNDLE_DEPENDENCIES_CONTEXT_KEY

    cdk_json = REPO_ROOT / "cdk.json"
    context = json.loads(cdk_json.read_text(encoding="utf-8"))["context"]
    app = App(outdir=str(outdir), context={**context, BUNDLE_DEPENDENCIES_CONTEXT_KEY: False})
    [stack] = add_stacks(app, project_file=cdk_json)
    return stack.stack_name, app.synth().get_stack_by_name(stack.stack_name).template


@contextlib.contextmanager
def local_deployment() -> Iterator[str]:
    """The demo's deployment on moto for the duration of the block; yields its stack's name."""
    moto_sagemaker.install()
    moto_iam_simulate.install()
    moto_lambda_invoke.install()
    with (
        scoped_environ(MOTO_ENVIRONMENT),
        tempfile.TemporaryDirectory() as outdir,
        SlackReceiver() as slack,
        moto.mock_aws(),
    ):
        import boto3  # the clients are made inside mock_aws

        stack, template = synthesized_template(Path(outdir))
        resources = create_resources(
            boto3.client("dynamodb"), boto3.client("secretsmanager"), boto3.client("scheduler"), slack.webhook_url
        )
        slack_secret = {"webhook_url": slack.webhook_url, "signing_secret": secrets.token_hex(16)}
        boto3.client("secretsmanager").put_secret_value(
            SecretId=resources.secret_arn, SecretString=json.dumps(slack_secret)
        )
        deploy_on_moto(template, stack, resources.secret_arn)
        _sweep_once(boto3.client("lambda"))
        yield stack


def _sweep_once(lambda_client: Any) -> None:
    """The sweeper's scheduled run, as EventBridge invokes it: the doctor looks for a recent, clean one."""
    functions = lambda_client.list_functions()["Functions"]
    sweeper = next(f["FunctionName"] for f in functions if f["Handler"] == SWEEPER_HANDLER)
    lambda_client.invoke(FunctionName=sweeper, Payload=json.dumps(aws_events.scheduled(time.time())))


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """This process's output (synth's notes, the functions' log lines) kept aside, and shown only if the block fails:
    the doctor's report is the output."""
    with tempfile.TemporaryFile(mode="w+") as kept:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = [os.dup(1), os.dup(2)]
        os.dup2(kept.fileno(), 1)
        os.dup2(kept.fileno(), 2)
        try:
            yield
        except BaseException:
            _restore(saved)
            kept.seek(0)
            sys.stderr.write(kept.read()[-OUTPUT_SHOWN_ON_FAILURE:])
            raise
        _restore(saved)


def _restore(saved: list[int]) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, original in zip((1, 2), saved, strict=True):
        os.dup2(original, fd)
        os.close(original)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stallwatch doctor --local", description=__doc__.splitlines()[0])
    parser.add_argument("--send-test-alert", action="store_true", help="also send the test alert, to the receiver")
    args = parser.parse_args(argv)
    print("The local demo's deployment: the stack synthesized from cdk.json, on moto (no account; about a minute)")
    with quiet(), local_deployment() as stack:
        checks = doctor.run_checks(Deployment(stack=stack), send_alert=args.send_test_alert)
    return doctor.print_checks(checks)


if __name__ == "__main__":
    sys.exit(main())
