"""Launch a SageMaker training job that Stallwatch watches, stops and resumes (docs/deploy.md, "SageMaker jobs").

    make dist                                            # the trainer-agent wheel, dist/trainer_agent-*.whl
    pip install "sagemaker>=2.200,<3"                    # the SageMaker Python SDK (its v2 Estimator API)
    python examples/sagemaker_estimator.py --role-policy --bucket my-training-bucket > role-policy.json  # the role's
    python examples/sagemaker_estimator.py --role arn:aws:iam::123456789012:role/training \\
        --bucket my-training-bucket --job llama-8b-pretrain --instance-type ml.p4d.24xlarge --instances 2

The job gets the agent the way a job without a public package index does: the wheel (`make dist`'s, built into dist/
when there is none) is copied into `source_dir`
beside the training script, and `requirements.txt` names it (SageMaker's PyTorch containers pip-install
`requirements.txt` from `source_dir` before the entry point starts). By default the job carries no `stallwatch:mode`
tag, so the deployment's mode governs it (`notify` unless you changed it: alerts, never a stop). Opting in is a choice
made per job: `--mode enforce` tags it `stallwatch:mode=enforce` (stops allowed), `--restarts N` tags it
`stallwatch:resume=N` (restarts from the checkpoint after Stallwatch's stop), with the checkpoint in
`checkpoint_s3_uri` (SageMaker syncs it to /opt/ml/checkpoints, where examples/train_gpt.py resumes).
The execution role needs `cloudwatch:PutMetricData` in the Stallwatch namespace (the agent's metrics), and, for a
resume, the tag `stallwatch:resume` on the role itself (Stallwatch may pass only such roles).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
TRAIN_SCRIPT = "train_gpt.py"
SOURCES = ("train_gpt.py", "gpt.py", "distributed.py", "checkpoints.py")  # the entry point and what it imports
CHECKPOINT_DIR = "/opt/ml/checkpoints"  # SageMaker's default local path of CheckpointConfig
FRAMEWORK_VERSION, PY_VERSION = "2.5", "py311"  # an AWS Deep Learning Container for PyTorch
AGENT_NAMESPACE = "Stallwatch"
AGENT_EXTRAS = "aws"  # boto3 for CloudWatch; nvidia-ml-py ships in the GPU containers
MODE_TAG, RESUME_TAG = "stallwatch:mode", "stallwatch:resume"
MODES = ("off", "observe", "notify", "enforce")
MAX_RESTARTS = 10  # what stallwatch:resume accepts
DEFAULT_STEPS = 2_000  # a few minutes of the example on one GPU: enough to see its metrics and dashboards
DEFAULT_MAX_RUN_MINUTES = 60  # SageMaker stops the job after this long (StoppingCondition.MaxRuntimeInSeconds)
RESUMABLE_ROLE_TAG = {"Key": RESUME_TAG, "Value": "true"}  # Stallwatch may pass only roles so tagged to a resume
SAGEMAKER_TRUST_POLICY = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"}, "Action": "sts:AssumeRole"}],
}
ROLE_POLICY_NAME = "stallwatch-example"
IAM_SETTLE_S = 10  # IAM is eventually consistent: SageMaker may not assume a role made a moment ago


def stage_source_dir(wheel: Path, into: Path) -> Path:
    """`source_dir` for the Estimator: the training script, the wheel, and a requirements.txt naming the wheel."""
    into.mkdir(parents=True, exist_ok=True)
    for name in SOURCES:
        shutil.copy2(REPO_ROOT / "examples" / name, into / name)
    shutil.copy2(wheel, into / wheel.name)
    (into / "requirements.txt").write_text(f"./{wheel.name}[{AGENT_EXTRAS}]\n", encoding="utf-8")
    return into


def estimator_arguments(
    *,
    job: str,
    role: str,
    bucket: str,
    source_dir: Path,
    instance_type: str,
    instances: int,
    mode: str | None = None,
    restarts: int = 0,
    steps: int = DEFAULT_STEPS,
    max_run_minutes: int = DEFAULT_MAX_RUN_MINUTES,
) -> dict[str, Any]:
    """The keyword arguments of `sagemaker.pytorch.PyTorch` for a job Stallwatch watches; `mode` and `restarts` tag it
    only when given (None, 0: the deployment's policy governs)."""
    tags = {MODE_TAG: mode} if mode else {}
    if restarts:
        tags[RESUME_TAG] = str(restarts)
    return {
        "entry_point": TRAIN_SCRIPT,
        "source_dir": str(source_dir),
        "role": role,
        "instance_type": instance_type,
        "instance_count": instances,
        "framework_version": FRAMEWORK_VERSION,
        "py_version": PY_VERSION,
        "base_job_name": job,
        "output_path": f"s3://{bucket}/{job}/output",
        "checkpoint_s3_uri": f"s3://{bucket}/{job}/checkpoints",  # kept by every resume
        "checkpoint_local_path": CHECKPOINT_DIR,
        "hyperparameters": {"checkpoint-dir": CHECKPOINT_DIR, "checkpoint-every": 500, "steps": steps},
        "max_run": max_run_minutes * 60,  # a resume gets what the stopped job had left
        "tags": [{"Key": key, "Value": value} for key, value in tags.items()],
        "metric_definitions": _metric_definitions(),
        "distribution": {"torch_distributed": {"enabled": True}} if instances > 1 else None,
    }


def built_wheel(dist: Path) -> Path:
    """The trainer-agent wheel in `dist` (`make dist`'s), built there from this checkout when there is none."""
    found = sorted(dist.glob("trainer_agent-*.whl"))
    if not found:
        build = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(REPO_ROOT)]
        subprocess.run(build, check=True, capture_output=True)
        found = sorted(dist.glob("trainer_agent-*.whl"))
    return found[-1]


def _metric_definitions() -> list[dict[str, str]]:
    """The agent's progress line as SageMaker metrics (the job's console graphs), when the agent is importable."""
    try:
        from trainer_agent import metric_definitions
    except ImportError:
        return []
    return metric_definitions()


def execution_role_policy(bucket: str) -> dict[str, Any]:
    """What the job's execution role needs besides SageMaker's basics: the agent's metrics, and the bucket."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "TrainerAgentMetrics",
                "Effect": "Allow",
                "Action": "cloudwatch:PutMetricData",
                "Resource": "*",  # PutMetricData has no resource-level permissions: the namespace condition scopes it
                "Condition": {"StringEquals": {"cloudwatch:namespace": AGENT_NAMESPACE}},
            },
            {
                "Sid": "TrainingData",
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:ListBucket"],
                "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"],
            },
            {
                "Sid": "TrainingLogs",
                "Effect": "Allow",
                "Action": [
                    "logs:CreateLogStream",
                    "logs:PutLogEvents",
                    "logs:CreateLogGroup",
                    "logs:DescribeLogStreams",
                ],
                "Resource": "arn:aws:logs:*:*:log-group:/aws/sagemaker/TrainingJobs:*",
            },
            {
                "Sid": "PullTheTrainingImage",
                "Effect": "Allow",
                "Action": ["ecr:GetAuthorizationToken", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"],
                "Resource": "*",
            },
        ],
    }


def create_execution_role(iam: Any, name: str, bucket: str, resumable: bool) -> str:
    """The execution role `name`, made if absent (SageMaker's trust policy) and given `execution_role_policy`'s
    permissions, tagged `stallwatch:resume=true` when the job may be resumed; its ARN."""
    try:
        arn = iam.get_role(RoleName=name)["Role"]["Arn"]
        made = False
    except iam.exceptions.NoSuchEntityException:
        description = "SageMaker training jobs of Stallwatch's example (examples/sagemaker_estimator.py)"
        created = iam.create_role(
            RoleName=name, AssumeRolePolicyDocument=json.dumps(SAGEMAKER_TRUST_POLICY), Description=description
        )
        arn, made = created["Role"]["Arn"], True
    iam.put_role_policy(
        RoleName=name, PolicyName=ROLE_POLICY_NAME, PolicyDocument=json.dumps(execution_role_policy(bucket))
    )
    if resumable:
        iam.tag_role(RoleName=name, Tags=[RESUMABLE_ROLE_TAG])
    if made:
        time.sleep(IAM_SETTLE_S)
    return str(arn)


def build_parser() -> argparse.ArgumentParser:
    """The command line; `--help` shows every default."""
    parser = argparse.ArgumentParser(
        description="Launch a SageMaker training job that Stallwatch watches.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--role-policy", action="store_true", help="print the execution role's policy and exit")
    parser.add_argument("--role", help="the execution role's ARN (tag it stallwatch:resume=true for resumes)")
    parser.add_argument(
        "--create-role",
        metavar="NAME",
        help="make the execution role NAME (or bring it up to date) and launch with it, in place of --role",
    )
    parser.add_argument("--bucket", required=True, help="S3 bucket for output and checkpoints")
    parser.add_argument("--job", default="stallwatch-example", help="the job name's start (the SDK adds a time)")
    parser.add_argument("--instance-type", default="ml.g5.xlarge", help="SageMaker instance type")
    parser.add_argument("--instances", type=int, default=1, help="instances (more than 1: torch_distributed)")
    parser.add_argument(
        "--mode",
        choices=MODES,
        default=None,
        help="tag stallwatch:mode (enforce: Stallwatch may stop the job); None: no tag, the deployment's mode governs",
    )
    parser.add_argument("--restarts", type=int, default=0, help="tag stallwatch:resume=N after a stop; 0: no tag")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="steps the example trains, then ends")
    parser.add_argument(
        "--max-run-minutes",
        type=int,
        default=DEFAULT_MAX_RUN_MINUTES,
        help="SageMaker stops the job after this long, whatever it does",
    )
    parser.add_argument(
        "--wheel",
        type=Path,
        default=None,
        help="the trainer-agent wheel; None: the one in dist/ (`make dist`), built there when there is none",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 0 <= args.restarts <= MAX_RESTARTS or args.instances < 1 or args.steps < 1 or args.max_run_minutes < 1:
        parser.error(f"--restarts must be 0 to {MAX_RESTARTS}, --instances, --steps and --max-run-minutes at least 1")
    if args.role_policy:
        print(json.dumps(execution_role_policy(args.bucket), indent=2))
        return 0
    if bool(args.role) == bool(args.create_role):
        parser.error("give --role (an existing role's ARN) or --create-role NAME to launch")
    wheel = args.wheel or built_wheel(REPO_ROOT / "dist")
    if not wheel.is_file():
        parser.error(f"no trainer-agent wheel at {wheel}")
    from sagemaker.pytorch import PyTorch  # imported here: --role-policy needs no SDK

    role = args.role or create_execution_role(_iam(), args.create_role, args.bucket, resumable=args.restarts > 0)
    with tempfile.TemporaryDirectory() as staging:
        source_dir = stage_source_dir(wheel, Path(staging) / "source")
        arguments = estimator_arguments(
            job=args.job,
            role=role,
            bucket=args.bucket,
            source_dir=source_dir,
            instance_type=args.instance_type,
            instances=args.instances,
            mode=args.mode,
            restarts=args.restarts,
            steps=args.steps,
            max_run_minutes=args.max_run_minutes,
        )
        estimator = PyTorch(**{k: v for k, v in arguments.items() if v is not None})
        estimator.fit(wait=False)  # the SDK uploads source_dir before it returns
    name = estimator.latest_training_job.name
    shape = f"{args.instances} x {args.instance_type}, {args.steps} steps, at most {args.max_run_minutes} min"
    print(f"started {name} ({shape})")
    print(f"  its policy:  stallwatch policy show {name}")
    print(f"  end it now:  aws sagemaker stop-training-job --training-job-name {name}")
    return 0


def _iam() -> Any:
    import boto3  # imported here: only --create-role needs it

    return boto3.client("iam")


if __name__ == "__main__":
    sys.exit(main())
