"""examples/sagemaker_estimator.py: a SageMaker job with the agent in its container, the tags Stallwatch reads, and
the role it needs (the SDK itself is not called: launching needs an account)."""

from __future__ import annotations

import argparse
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import boto3
import moto
import pytest

from stallwatch.core import contract
from stallwatch.core.policy import MODE_TAG, Policy
from stallwatch.core.resume import RESUME_TAG

REPO_ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("sagemaker_estimator", REPO_ROOT / "examples" / "sagemaker_estimator.py")
example = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(example)  # type: ignore[union-attr]
WHEEL_SOURCES = ("trainer_agent", "pyproject.toml", "README.md", "LICENSE", "MANIFEST.in")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trainer-agent wheel, built from the repository as `make dist` builds it."""
    out = tmp_path_factory.mktemp("wheel")
    source = out / "src"  # a copy: setuptools writes build/ and egg-info beside the sources
    source.mkdir()
    for name in WHEEL_SOURCES:
        if (REPO_ROOT / name).is_dir():
            shutil.copytree(REPO_ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO_ROOT / name, source / name)
    command = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        str(out),
        str(source),
    ]
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    [built] = out.glob("trainer_agent-*.whl")
    return built


def test_the_source_dir_carries_the_wheel_and_a_requirements_line_pip_installs(wheel: Path, tmp_path: Path) -> None:
    # Given the source_dir the example stages
    source = example.stage_source_dir(wheel, tmp_path / "source")

    # Then it holds the entry point, what it imports, and the wheel named by requirements.txt
    assert {p.name for p in source.iterdir()} == {
        "train_gpt.py", "gpt.py", "distributed.py", "checkpoints.py", wheel.name, "requirements.txt",
    }  # fmt: skip
    # And pip, run there as SageMaker's container runs it, takes the line: the local wheel, with the aws extra
    dry_run = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-index", "-r", "requirements.txt"],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert dry_run.returncode == 0, dry_run.stderr
    assert "Would install trainer-agent-" in dry_run.stdout


def test_by_default_the_job_carries_no_mode_tag_and_the_deployments_mode_governs_it(tmp_path: Path) -> None:
    # Given the example's defaults, as its command line has them
    args = _parsed(["--bucket", "b"])

    # When it builds the job with them
    arguments = example.estimator_arguments(
        job=args.job, role="arn:aws:iam::123456789012:role/training", bucket="b", source_dir=tmp_path,
        instance_type=args.instance_type, instances=args.instances, mode=args.mode, restarts=args.restarts,
    )  # fmt: skip

    # Then the job opts into nothing: no stallwatch:mode (the deployment's notify governs), no resume
    assert arguments["tags"] == []
    assert Policy().for_job({}).may_stop is False


def test_help_shows_every_options_default() -> None:
    # Given --help's text, one block per option (a line starting with the option, then its indented help)
    text = example.build_parser().format_help().split("options:\n", 1)[1]
    blocks = [" ".join(block.split()) for block in re.split(r"\n(?=  -)", text)]

    # Then every option but --help names its default
    options = {block.split()[0].rstrip(","): block for block in blocks}
    assert set(options) >= {"--mode", "--restarts", "--instances", "--instance-type", "--job", "--wheel"}
    assert [o for o, block in options.items() if o != "-h" and "(default:" not in block] == []


def test_the_estimator_opts_the_job_in_when_asked_with_a_checkpoint_and_the_agents_metrics(tmp_path: Path) -> None:
    arguments = example.estimator_arguments(
        job="llama-8b", role="arn:aws:iam::123456789012:role/training", bucket="b", source_dir=tmp_path,
        instance_type="ml.p4d.24xlarge", instances=2, mode="enforce", restarts=2,
    )  # fmt: skip
    tags = {t["Key"]: t["Value"] for t in arguments["tags"]}
    assert tags == {MODE_TAG: "enforce", RESUME_TAG: "2"}
    assert arguments["checkpoint_s3_uri"] == "s3://b/llama-8b/checkpoints"
    assert arguments["hyperparameters"]["checkpoint-dir"] == arguments["checkpoint_local_path"]
    assert arguments["distribution"] == {"torch_distributed": {"enabled": True}}
    assert {d["Name"] for d in arguments["metric_definitions"]} >= {"stallwatch:Step"}


def _parsed(argv: list[str]) -> argparse.Namespace:
    return example.build_parser().parse_args(argv)


def test_the_execution_role_may_publish_the_agents_metrics_only_in_stallwatchs_namespace() -> None:
    policy = example.execution_role_policy("my-bucket")
    [metrics] = [s for s in policy["Statement"] if s["Action"] == "cloudwatch:PutMetricData"]
    assert metrics["Condition"] == {"StringEquals": {"cloudwatch:namespace": contract.NAMESPACE}}
    assert not [s for s in policy["Statement"] if "*" in s["Action"] or s["Action"] == "*"]


def test_the_default_job_is_one_small_gpu_for_a_bounded_run(tmp_path: Path) -> None:
    # Given the example's defaults, as its command line has them
    args = _parsed(["--bucket", "b"])

    # When it builds the job with them
    arguments = example.estimator_arguments(
        job=args.job, role="arn:aws:iam::123456789012:role/training", bucket="b", source_dir=tmp_path,
        instance_type=args.instance_type, instances=args.instances, mode=args.mode, restarts=args.restarts,
        steps=args.steps, max_run_minutes=args.max_run_minutes,
    )  # fmt: skip

    # Then it is one ml.g5.xlarge (one GPU) for 2,000 steps, which SageMaker ends after an hour whatever it does
    assert (arguments["instance_type"], arguments["instance_count"]) == ("ml.g5.xlarge", 1)
    assert arguments["hyperparameters"]["steps"] == 2000
    assert arguments["max_run"] == 3600


def test_create_role_makes_the_execution_role_sagemaker_assumes_and_updates_it_when_it_exists(monkeypatch) -> None:
    monkeypatch.setattr(example, "IAM_SETTLE_S", 0)
    with moto.mock_aws():
        iam = boto3.client("iam")

        # When the role is made for a resumable job, then made again for another bucket
        arn = example.create_execution_role(iam, "stallwatch-example", "my-bucket", resumable=True)
        again = example.create_execution_role(iam, "stallwatch-example", "other-bucket", resumable=False)

        # Then SageMaker may assume it, it holds the example's permissions (the latest bucket's), and it is tagged so
        # that Stallwatch may pass it to a resume
        role = iam.get_role(RoleName="stallwatch-example")["Role"]
        assert arn == again == role["Arn"]
        [trust] = role["AssumeRolePolicyDocument"]["Statement"]
        assert (trust["Principal"], trust["Action"]) == ({"Service": "sagemaker.amazonaws.com"}, "sts:AssumeRole")
        policy = iam.get_role_policy(RoleName="stallwatch-example", PolicyName=example.ROLE_POLICY_NAME)
        assert policy["PolicyDocument"] == example.execution_role_policy("other-bucket")
        tags = {t["Key"]: t["Value"] for t in iam.list_role_tags(RoleName="stallwatch-example")["Tags"]}
        assert tags == {RESUME_TAG: "true"}


def test_launching_needs_a_role_or_a_role_to_create(capsys) -> None:
    with pytest.raises(SystemExit):
        example.main(["--bucket", "b"])
    assert "give --role" in capsys.readouterr().err


def test_without_a_wheel_in_dist_the_example_builds_one_there(tmp_path: Path) -> None:
    # Given an empty dist folder, When the example looks for the wheel, Then it builds the checkout's there
    wheel = example.built_wheel(tmp_path)
    assert wheel.parent == tmp_path
    assert wheel.name.startswith("trainer_agent-")
    assert wheel.suffix == ".whl"
    # ...and finds that one again without building
    assert example.built_wheel(tmp_path) == wheel
