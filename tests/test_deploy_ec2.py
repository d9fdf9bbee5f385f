"""deploy/ec2: what a user installs on EC2 training nodes matches what the control plane reads, and it boots.

launch.sh is run for a 2-node job against a stub AWS CLI; the user data it renders for each node is then run with
stub `curl` (instance metadata), `systemctl`, package managers, pip and CloudWatch agent, installing under a folder.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stacks.ec2_training import cloudwatch_agent_config
from stallwatch.core import contract
from stallwatch.core.config import EC2_LOG_GROUP
from stallwatch.core.platforms import ec2_clusters as clusters
from stallwatch.core.platforms.ec2 import EC2_STREAM
from stallwatch.core.policy import MODE_TAG, Policy
from stallwatch.core.resume import CHECKPOINT_TAG, RESUME_TAG
from tests.fixtures.request_limits import Request

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "ec2"
AGENT_CONFIG = json.loads((DEPLOY / "cloudwatch-agent.json").read_text())
CWAGENT_METRIC_PREFIX = "nvidia_smi_"  # the CloudWatch agent names nvidia_gpu measurements nvidia_smi_<measurement>
USER_DATA_LIMIT = 16 * 1024  # RunInstances: "User data is limited to 16 KB" (before base64)
RANK0_IP = "10.0.1.10"
JOB = "llm-70b"
OUTPUTS = {
    "Ec2InstancePolicyArn": "arn:aws:iam::123456789012:policy/stallwatch-Ec2TrainingPolicy",
    "AgentWheelUri": "s3://cdk-hnb659fds-assets-123456789012-us-east-1/3f2a.zip",
    "Ec2AgentConfigParameter": "AmazonCloudWatch-stallwatch-ec2",
}
CTL = "opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl"

# One stub for every command the scripts run: it logs its name and arguments (JSON lines) and answers as AWS, the
# instance metadata service or a package manager would.
STUB = """#!{python}
import json, os, sys, zipfile
from pathlib import Path
name, args = Path(sys.argv[0]).name, sys.argv[1:]
with open(os.environ["STUB_LOG"], "a") as log:
    log.write(json.dumps([name, *args]) + "\\n")
def installed():  # a package manager put the CloudWatch agent in place
    ctl = Path(os.environ["STALLWATCH_ROOT"]) / {ctl!r}
    ctl.parent.mkdir(parents=True, exist_ok=True)
    ctl.write_text("#!/bin/sh\\nexec " + str(Path(sys.argv[0]).with_name("agent-ctl")) + ' "$@"\\n')
    ctl.chmod(0o755)
if name == "aws":
    if args[:2] == ["cloudformation", "describe-stacks"]:
        query = args[args.index("--query") + 1]
        print(json.loads(os.environ["STUB_OUTPUTS"])[query.split("'")[1]])
    elif args[:2] == ["ec2", "run-instances"]:
        user_data = args[args.index("--user-data") + 1]
        rank0 = not Path(os.environ["STUB_DIR"], "rank0.sh").exists()
        node = "rank0" if rank0 else "others"
        Path(os.environ["STUB_DIR"], f"{{node}}.sh").write_text(Path(user_data.removeprefix("file://")).read_text())
        Path(os.environ["STUB_DIR"], f"{{node}}.json").write_text(json.dumps(args[2:]))
        for i in range(int(args[args.index("--count") + 1])):
            print(f"i-0{{'a' if rank0 else 'b'}}{{i:015x}}\\t10.0.1.{{10 + i + (0 if rank0 else 1)}}")
    elif args[:2] == ["ec2", "describe-capacity-reservations"]:
        print("\\t".join(json.loads(os.environ["STUB_RESERVATION"])))
    elif args[:2] == ["ec2", "describe-subnets"]:
        print(os.environ.get("STUB_SUBNET_ZONE", "us-east-1a"))
    elif args[:2] in (["iam", "get-role"], ["ec2", "describe-placement-groups"]) and os.environ.get("STUB_ABSENT"):
        sys.exit(254)  # the AWS CLI's exit code for a service error (NoSuchEntity, InvalidPlacementGroup.Unknown)
    elif args[:2] == ["ssm", "get-parameter"]:
        print(Path(os.environ["STUB_AGENT_CONFIG"]).read_text())
    elif args[:2] == ["s3", "cp"]:
        with zipfile.ZipFile(args[-1], "w") as archive:
            archive.writestr("trainer_agent-0.1.0-py3-none-any.whl", b"wheel")
            archive.writestr("boto3-1.35.0-py3-none-any.whl", b"wheel")
elif name == "curl":
    url = next(a for a in args if a.startswith("http"))
    if url.endswith("/api/token"):
        print("token", end="")
    elif "-o" in args:
        Path(args[args.index("-o") + 1]).write_bytes(b"package")
    else:
        answers = json.loads(os.environ["STUB_IMDS"])
        path = url.split("/latest/", 1)[1]
        if path not in answers:
            sys.exit(22)  # curl -f: HTTP 404
        print(answers[path], end="")
elif name == "uname":
    print(os.environ["STUB_ARCH"])
elif name in ("dnf", "dpkg", "rpm"):
    installed()
elif name == "agent-ctl" and args[:2] == ["-a", "fetch-config"]:
    pass
"""
COMMANDS = ("aws", "curl", "uname", "dnf", "dpkg", "rpm", "systemctl", "python-stub", "agent-ctl", "sleep")
COMMANDS += ("nvidia-smi", "shutdown")  # a GPU node's


@pytest.fixture
def stubs(tmp_path: Path) -> dict[str, Path]:
    """A folder of stub commands and the log they write."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = STUB.format(python=sys.executable, ctl=CTL)
    for command in COMMANDS:
        (bin_dir / command).write_text(stub)
        (bin_dir / command).chmod(0o755)
    return {"bin": bin_dir, "log": tmp_path / "calls.jsonl", "dir": tmp_path}


def _calls(stubs: dict[str, Path]) -> list[list[str]]:
    log = stubs["log"]
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _env(stubs: dict[str, Path], **extra: str) -> dict[str, str]:
    return {
        "PATH": f"{stubs['bin']}:/usr/bin:/bin",
        "HOME": str(stubs["dir"]),
        "STUB_LOG": str(stubs["log"]),
        "STUB_DIR": str(stubs["dir"]),
        "STUB_OUTPUTS": json.dumps(OUTPUTS),
        "STUB_ARCH": "x86_64",
        "STUB_AGENT_CONFIG": str(DEPLOY / "cloudwatch-agent.json"),
        **extra,
    }


def _launch(stubs: dict[str, Path], **values: str) -> subprocess.CompletedProcess[str]:
    """launch.sh for a 2-node job, against the stub AWS CLI."""
    job = {
        "JOB": JOB,
        "NODES": "2",
        "AMI": "ami-0123456789abcdef0",
        "SUBNET": "subnet-0123456789abcdef0",
        "SECURITY_GROUP": "sg-0123456789abcdef0",
        "TRAIN_COMMAND": "train.py --config configs/70b.yaml --lr=3e-4",
        "CHECKPOINT_URI": "s3://my-bucket/checkpoints/llm-70b/",
        "RESUME": "2",
        "MODE": "enforce",
        "PYTHON": "python-stub",
    } | values
    return subprocess.run(
        ["bash", str(DEPLOY / "launch.sh")], env=_env(stubs, **job), capture_output=True, text=True, check=False
    )


def _request(stubs: dict[str, Path], node: str) -> dict[str, Any]:
    """The RunInstances request launch.sh made for `node` (rank0, others), as the AWS CLI makes it of its options."""
    return _as_request(json.loads((stubs["dir"] / f"{node}.json").read_text()))


# run-instances' options and the request's parameters (the AWS CLI's names; a single --count N is MinCount = MaxCount)
RUN_INSTANCES_OPTIONS = {
    "--image-id": "ImageId",
    "--instance-type": "InstanceType",
    "--network-interfaces": "NetworkInterfaces",
    "--iam-instance-profile": "IamInstanceProfile",
    "--metadata-options": "MetadataOptions",
    "--tag-specifications": "TagSpecifications",
    "--placement": "Placement",
    "--capacity-reservation-specification": "CapacityReservationSpecification",
    "--instance-market-options": "InstanceMarketOptions",
}


def _as_request(options: list[str]) -> dict[str, Any]:
    request: dict[str, Any] = {}
    for option, value in zip(options[::2], options[1::2], strict=True):
        if option == "--count":
            request["MinCount"] = request["MaxCount"] = int(value)
        elif option in RUN_INSTANCES_OPTIONS:
            name = RUN_INSTANCES_OPTIONS[option]
            request[name] = value if name in ("ImageId", "InstanceType") else json.loads(value)
    return request


def _tags(request: dict[str, Any]) -> dict[str, str]:
    [spec] = request["TagSpecifications"]
    return {tag["Key"]: tag["Value"] for tag in spec["Tags"]}


def _boot(stubs: dict[str, Path], user_data: Path, root: Path, imds: dict[str, str], **env: str) -> Any:
    """Run a node's user data as cloud-init would (as root, once), installing under `root`."""
    root.mkdir(exist_ok=True)
    answers = {"meta-data/local-ipv4": RANK0_IP, "meta-data/placement/region": "us-east-1"} | imds
    environment = _env(stubs, STALLWATCH_ROOT=str(root), STUB_IMDS=json.dumps(answers), **env)
    return subprocess.run(["bash", str(user_data)], env=environment, capture_output=True, text=True, check=False)


def _preinstalled_agent(root: Path, stubs: dict[str, Path]) -> None:
    """The CloudWatch agent as the Deep Learning AMIs ship it."""
    ctl = root / CTL
    ctl.parent.mkdir(parents=True)
    ctl.write_text(f'#!/bin/sh\nexec {stubs["bin"] / "agent-ctl"} "$@"\n')
    ctl.chmod(0o755)


def _systemd_environment(path: Path) -> dict[str, str]:
    """An EnvironmentFile= as systemd reads it: KEY="value" lines."""
    return {
        key: shlex.split(value)[0] if value else ""
        for key, _, value in (line.partition("=") for line in path.read_text().splitlines())
    }


# ---- the configuration the control plane reads ---------------------------------------------------------------------


def test_the_cloudwatch_agent_publishes_the_per_instance_gpu_metrics_the_alarms_read() -> None:
    metrics = AGENT_CONFIG["metrics"]
    published = {CWAGENT_METRIC_PREFIX + m for m in metrics["metrics_collected"]["nvidia_gpu"]["measurement"]}
    assert metrics["namespace"] == contract.CWAGENT_NAMESPACE
    assert {
        contract.CWAGENT_GPU_UTILIZATION,
        contract.CWAGENT_GPU_MEMORY_USED,
        contract.CWAGENT_GPU_MEMORY_TOTAL,
    } <= published
    assert metrics["append_dimensions"] == {contract.CWAGENT_DIM_INSTANCE: "${aws:InstanceId}"}
    assert metrics["aggregation_dimensions"] == [[contract.CWAGENT_DIM_INSTANCE]]


def test_the_cloudwatch_agent_ships_logs_to_the_ec2_log_group_one_stream_per_instance_id() -> None:
    [files] = AGENT_CONFIG["logs"]["logs_collected"]["files"]["collect_list"]
    assert files["log_group_name"] == EC2_LOG_GROUP
    stream = files["log_stream_name"].replace("{instance_id}", "i-0123456789abcdef0")
    assert EC2_STREAM.match(stream)["host"] == "i-0123456789abcdef0"
    # The stack creates the group with its retention: the agent neither creates nor configures one
    assert "retention_in_days" not in files
    assert (
        cloudwatch_agent_config("/team-b/ec2")["logs"]["logs_collected"]["files"]["collect_list"][0]["log_group_name"]
        == "/team-b/ec2"
    )


# ---- launch.sh and the user data -----------------------------------------------------------------------------------


def test_a_two_node_launch_boots_both_nodes_into_one_torchrun_job(stubs: dict[str, Path]) -> None:
    # When launch.sh starts a 2-node job
    launched = _launch(stubs)
    assert launched.returncode == 0, launched.stderr

    # Then rank 0 was launched first and the other node with rank 0's private IP, both tagged as the control plane
    # groups them (and the resume opt-in with the checkpoint), with tags in instance metadata for the agent
    requests = [_request(stubs, node) for node in ("rank0", "others")]
    assert [(r["MinCount"], r["MaxCount"]) for r in requests] == [(1, 1), (1, 1)]
    for request in requests:
        [spec] = request["TagSpecifications"]
        assert spec["ResourceType"] == "instance"
        assert _tags(request) == {
            clusters.JOB_TAG: JOB,
            "Name": JOB,
            MODE_TAG: "enforce",
            CHECKPOINT_TAG: "s3://my-bucket/checkpoints/llm-70b/",
            RESUME_TAG: "2",
        }
        assert request["MetadataOptions"]["InstanceMetadataTags"] == "enabled"
    assert launched.stdout.split() == ["i-0a000000000000000", "i-0b000000000000000"]
    rank0, others = stubs["dir"] / "rank0.sh", stubs["dir"] / "others.sh"
    assert all(len(path.read_bytes()) <= USER_DATA_LIMIT for path in (rank0, others))

    # When each node boots its user data (the Deep Learning AMI: the CloudWatch agent is there)
    nodes = {}
    for name, user_data, ip in (("rank0", rank0, RANK0_IP), ("node1", others, "10.0.1.11")):
        root = stubs["dir"] / name
        _preinstalled_agent(root, stubs)
        booted = _boot(stubs, user_data, root, {"meta-data/local-ipv4": ip})
        assert booted.returncode == 0, booted.stderr
        nodes[name] = root

    # Then each started the CloudWatch agent with the stack's configuration, installed the stack's wheel into the
    # training environment, and started the unit
    calls = _calls(stubs)
    assert (
        calls.count(["agent-ctl", "-a", "fetch-config", "-m", "ec2", "-s", "-c", "ssm:AmazonCloudWatch-stallwatch-ec2"])
        == 2
    )
    assert [
        "aws",
        "s3",
        "cp",
        "--only-show-errors",
        OUTPUTS["AgentWheelUri"],
        str(nodes["rank0"] / "opt/stallwatch/wheel/agent.zip"),
    ] in calls
    pips = [c for c in calls if c[:4] == ["python-stub", "-m", "pip", "install"]]
    assert [c[-1] for c in pips] == [
        f"{root}/opt/stallwatch/wheel/trainer_agent-0.1.0-py3-none-any.whl[aws,nvml]" for root in nodes.values()
    ]
    # And never from a package index: the dependencies' wheels came in the same zip
    for pip, root in zip(pips, nodes.values(), strict=True):
        assert "--no-index" in pip
        assert pip[pip.index("--find-links") + 1] == f"{root}/opt/stallwatch/wheel"
    assert [c for c in calls if c[0] == "systemctl"] == [
        ["systemctl", "daemon-reload"],
        ["systemctl", "enable", "--now", "stallwatch-train.service"],
    ] * 2
    assert not [c for c in calls if c[0] in ("dnf", "dpkg", "rpm")]

    # And both nodes agree on the job: the same name, node count, rank 0's address and command, and the checkpoint
    envs = {name: _systemd_environment(root / "etc/stallwatch/train.env") for name, root in nodes.items()}
    assert (
        envs["rank0"]
        == envs["node1"]
        == {
            "JOB": JOB,
            "STALLWATCH_JOB_NAME": JOB,
            "NODES": "2",
            "MASTER_ADDR": RANK0_IP,
            "RDZV_PORT": "29400",
            "NPROC_PER_NODE": "gpu",
            "TRAIN_COMMAND": "train.py --config configs/70b.yaml --lr=3e-4",
            "PYTHON": "python-stub",
            "STALLWATCH_CHECKPOINT_URI": "s3://my-bucket/checkpoints/llm-70b/",
            "MAX_HOURS": "2",
        }
    )

    # And the unit runs the launcher with that environment, restarts on failure only, and stops torchrun first
    unit = (nodes["node1"] / "etc/systemd/system/stallwatch-train.service").read_text()
    for line in (
        "EnvironmentFile=/etc/stallwatch/train.env",
        "ExecStart=/opt/stallwatch/bin/stallwatch-train",
        "WorkingDirectory=/opt/train",
        "Restart=on-failure",
        "KillMode=mixed",
        "StandardOutput=append:/var/log/training/train.log",
        "WantedBy=multi-user.target",
    ):
        assert line in unit.splitlines()

    # When the unit starts its launcher, Then it is torchrun with the job's values, the script's arguments as given
    launcher = nodes["node1"] / "opt/stallwatch/bin/stallwatch-train"
    started = subprocess.run(
        [str(launcher)], env=_env(stubs, **envs["node1"]), capture_output=True, text=True, check=False
    )
    assert started.returncode == 0, started.stderr
    # (the node powers off 2 hours after the training starts: launch.sh's bound)
    assert _calls(stubs)[-2] == ["shutdown", "-P", "+120", "stallwatch: MAX_HOURS=2 reached"]
    assert _calls(stubs)[-1] == [
        "python-stub",
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc-per-node=gpu",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={RANK0_IP}:29400",
        f"--rdzv-id={JOB}",
        "train.py",
        "--config",
        "configs/70b.yaml",
        "--lr=3e-4",
    ]


@pytest.mark.parametrize(
    ("os_release", "arch", "expected"),
    [
        ('ID="amzn"\nVERSION_ID="2023"\n', "x86_64", ["dnf", "install", "-y", "amazon-cloudwatch-agent"]),
        ('ID="amzn"\nVERSION_ID="2023"\n', "aarch64", ["dnf", "install", "-y", "amazon-cloudwatch-agent"]),
        (
            "ID=ubuntu\nID_LIKE=debian\n",
            "aarch64",
            [
                "curl",
                "-fsSL",
                "-o",
                "/tmp/amazon-cloudwatch-agent.deb",
                "https://amazoncloudwatch-agent-us-east-1.s3.us-east-1.amazonaws.com/ubuntu/arm64/latest/amazon-cloudwatch-agent.deb",
            ],
        ),
        (
            "ID=ubuntu\nID_LIKE=debian\n",
            "x86_64",
            [
                "curl",
                "-fsSL",
                "-o",
                "/tmp/amazon-cloudwatch-agent.deb",
                "https://amazoncloudwatch-agent-us-east-1.s3.us-east-1.amazonaws.com/ubuntu/amd64/latest/amazon-cloudwatch-agent.deb",
            ],
        ),
    ],
    ids=["al2023-x86_64", "al2023-arm64", "ubuntu-arm64", "ubuntu-x86_64"],
)
def test_the_cloudwatch_agent_is_installed_for_the_nodes_os_and_architecture(
    stubs: dict[str, Path], os_release: str, arch: str, expected: list[str]
) -> None:
    # Given a node without the CloudWatch agent, and the user data of a one-node job (values from its tags)
    assert _launch(stubs, NODES="1").returncode == 0
    root = stubs["dir"] / "node"
    (root / "etc").mkdir(parents=True)
    (root / "etc/os-release").write_text(os_release)

    # When it boots
    booted = _boot(stubs, stubs["dir"] / "rank0.sh", root, {}, STUB_ARCH=arch)

    # Then the package for its OS and architecture is installed, and the agent started with the stack's configuration
    assert booted.returncode == 0, booted.stderr
    calls = _calls(stubs)
    assert expected in calls
    assert ["agent-ctl", "-a", "fetch-config", "-m", "ec2", "-s", "-c", "ssm:AmazonCloudWatch-stallwatch-ec2"] in calls


def test_a_node_without_nvidia_smi_starts_the_cloudwatch_agent_without_its_gpu_metrics(stubs: dict[str, Path]) -> None:
    # Given a Trainium node (no nvidia-smi: the CloudWatch agent will not start with nvidia_gpu metrics there) and the
    # user data of a one-node job
    (stubs["bin"] / "nvidia-smi").unlink()
    assert _launch(stubs, NODES="1").returncode == 0
    root = stubs["dir"] / "trn1"
    _preinstalled_agent(root, stubs)

    # When it boots
    booted = _boot(stubs, stubs["dir"] / "rank0.sh", root, {})

    # Then the agent runs the stack's configuration without the GPU metrics, and the training logs still ship
    assert booted.returncode == 0, booted.stderr
    config = root / "opt/stallwatch/cloudwatch-agent.json"
    assert ["agent-ctl", "-a", "fetch-config", "-m", "ec2", "-s", "-c", f"file:{config}"] in _calls(stubs)
    assert json.loads(config.read_text()) == {key: AGENT_CONFIG[key] for key in ("agent", "logs")}
    assert ["aws", "ssm", "get-parameter", "--region", "us-east-1", "--name", OUTPUTS["Ec2AgentConfigParameter"],
            "--query", "Parameter.Value", "--output", "text"] in _calls(stubs)  # fmt: skip


def test_a_job_name_read_from_the_instance_tag_when_launch_sh_is_not_the_launcher(stubs: dict[str, Path]) -> None:
    # Given user data without a job name (another launcher), on a node tagged stallwatch:job
    assert _launch(stubs, NODES="1").returncode == 0
    user_data = stubs["dir"] / "rank0.sh"
    user_data.write_text(user_data.read_text().replace(f"JOB={JOB}\n", "", 1))
    root = stubs["dir"] / "node"
    _preinstalled_agent(root, stubs)

    # When it boots
    booted = _boot(stubs, user_data, root, {"meta-data/tags/instance/stallwatch:job": "from-the-tag"})

    # Then the job is the tag's
    assert booted.returncode == 0, booted.stderr
    assert _systemd_environment(root / "etc/stallwatch/train.env")["JOB"] == "from-the-tag"


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"NODES": "two"}, "NODES"),
        ({"TRAIN_COMMAND": 'train.py --name "$(id)"'}, "TRAIN_COMMAND"),
        ({"CHECKPOINT_URI": "/local/path"}, "CHECKPOINT_URI"),
        ({"JOB": "has.dot"}, "JOB"),
    ],
)
def test_a_bad_value_stops_the_boot_before_anything_is_installed(
    stubs: dict[str, Path], values: dict[str, str], named: str
) -> None:
    # Given user data rendered with a value the job cannot run with
    assert _launch(stubs, NODES="1").returncode == 0
    user_data = stubs["dir"] / "rank0.sh"
    rendered, body = user_data.read_text().split("# Boot script", 1)  # launch.sh's values come before the body
    bad = "".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items())
    user_data.write_text(f"{rendered}{bad}# Boot script{body}")
    root = stubs["dir"] / "node"
    _preinstalled_agent(root, stubs)
    before = len(_calls(stubs))

    # When the node boots, Then it stops naming the value, having installed and started nothing
    booted = _boot(stubs, user_data, root, {})
    assert booted.returncode != 0
    assert f"stallwatch user-data: {named}=" in booted.stderr
    assert [c[0] for c in _calls(stubs)[before:]] == ["curl"] * len(_calls(stubs)[before:])
    assert not (root / "etc/systemd/system/stallwatch-train.service").exists()


def test_launch_sh_refuses_a_resume_without_a_checkpoint(stubs: dict[str, Path]) -> None:
    launched = _launch(stubs, CHECKPOINT_URI="")
    assert launched.returncode == 2
    assert "RESUME needs CHECKPOINT_URI" in launched.stderr
    assert not [c for c in _calls(stubs) if c[:2] == ["aws", "ec2"]]


# ---- launch.sh for real clusters -----------------------------------------------------------------------------------

RESERVATION = "cr-0123456789abcdef0"
REQUIRED = {
    "JOB": JOB,
    "NODES": "4",
    "AMI": "ami-0123456789abcdef0",
    "SUBNET": "subnet-0123456789abcdef0",
    "SECURITY_GROUP": "sg-0123456789abcdef0",
    "TRAIN_COMMAND": "train.py --config configs/70b.yaml",
}
# What launch.sh asks of AWS before it has checked every value, and for a dry run's plan: reads only.
READS = (
    ("cloudformation", "describe-stacks"),
    ("ec2", "describe-capacity-reservations"),
    ("ec2", "describe-subnets"),
    ("iam", "get-role"),
    ("ec2", "describe-placement-groups"),
)
P5 = {"INSTANCE_TYPE": "p5.48xlarge"}


def _launch_only(stubs: dict[str, Path], reservation: list[str] | None = None, **values: str) -> Any:
    """launch.sh with the required values and `values`, nothing else set (the launcher's own defaults)."""
    env = _env(stubs, **(REQUIRED | values))
    if reservation is not None:
        env["STUB_RESERVATION"] = json.dumps(reservation)
    return subprocess.run(["bash", str(DEPLOY / "launch.sh")], env=env, capture_output=True, text=True, check=False)


def _aws_changes(stubs: dict[str, Path]) -> list[list[str]]:
    """Every AWS call but the reads launch.sh checks its values with."""
    return [c for c in _calls(stubs) if c[0] == "aws" and tuple(c[1:3]) not in READS]


def _valid_request(request: dict[str, Any]) -> None:
    """The request is one botocore accepts for RunInstances, within AWS's documented limits."""
    from botocore.session import get_session
    from botocore.validate import ParamValidator

    model = get_session().get_service_model("ec2").operation_model("RunInstances")
    report = ParamValidator().validate(request, model.input_shape)
    assert not report.has_errors(), report.generate_report()
    assert Request("ec2", "RunInstances", request).violations() == []


def test_the_launchers_defaults_set_no_mode_tag_so_the_deployments_mode_governs(stubs: dict[str, Path]) -> None:
    # When launch.sh runs with only the values it requires
    launched = _launch_only(stubs)

    # Then every node carries the job's tag and no stallwatch:mode: the deployment's mode (notify) governs the job
    assert launched.returncode == 0, launched.stderr
    for node in ("rank0", "others"):
        assert _tags(_request(stubs, node)) == {clusters.JOB_TAG: JOB, "Name": JOB}
    assert Policy().for_job(_tags(_request(stubs, "rank0"))).may_stop is False


def test_a_p5_cluster_is_launched_with_32_efas_in_a_placement_group_into_its_capacity_block(
    stubs: dict[str, Path],
) -> None:
    # Given a Capacity Block of 4 p5.48xlarge, active, in the subnet's zone
    block = ["capacity-block", "p5.48xlarge", "us-east-1a", "active", "4", "None"]

    # When launch.sh launches 4 p5 nodes into it
    launched = _launch_only(stubs, block, CAPACITY_RESERVATION=RESERVATION, **P5)
    assert launched.returncode == 0, launched.stderr

    # Then rank 0, then the 3 others (all or none), each with one EFA per network card: the primary (card 0,
    # device 0) EFA with ENA, the 31 others EFA-only on device 1 of cards 1 to 31, all in the subnet and group
    rank0, others = _request(stubs, "rank0"), _request(stubs, "others")
    assert (rank0["MinCount"], rank0["MaxCount"], others["MinCount"], others["MaxCount"]) == (1, 1, 3, 3)
    for request in (rank0, others):
        assert request["InstanceType"] == "p5.48xlarge"
        interfaces = request["NetworkInterfaces"]
        assert [(i["NetworkCardIndex"], i["DeviceIndex"], i["InterfaceType"]) for i in interfaces] == [
            (0, 0, "efa"),
            *((card, 1, "efa-only") for card in range(1, 32)),
        ]
        assert {(i["SubnetId"], tuple(i["Groups"])) for i in interfaces} == {
            (REQUIRED["SUBNET"], (REQUIRED["SECURITY_GROUP"],))
        }
        # And into the Capacity Block, which needs its market type; no placement group (an UltraCluster places them)
        assert request["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
        assert request["CapacityReservationSpecification"] == {
            "CapacityReservationTarget": {"CapacityReservationId": RESERVATION}
        }
        assert "Placement" not in request
        _valid_request(request)


def test_an_on_demand_reservation_is_launched_into_in_its_own_cluster_placement_group(stubs: dict[str, Path]) -> None:
    # Given an On-Demand Capacity Reservation of p4d.24xlarge made in a cluster placement group
    odcr = [
        "default",
        "p4d.24xlarge",
        "us-east-1a",
        "active",
        "8",
        "arn:aws:ec2:us-east-1:123456789012:placement-group/pg-a",
    ]

    # When launch.sh launches 2 p4d nodes into it
    launched = _launch_only(stubs, odcr, CAPACITY_RESERVATION=RESERVATION, INSTANCE_TYPE="p4d.24xlarge", NODES="2")
    assert launched.returncode == 0, launched.stderr

    # Then each node has 4 EFAs, is in the reservation's placement group and its reservation, at On-Demand's market
    request = _request(stubs, "others")
    assert [(i["NetworkCardIndex"], i["DeviceIndex"], i["InterfaceType"]) for i in request["NetworkInterfaces"]] == [
        (0, 0, "efa"), (1, 1, "efa-only"), (2, 1, "efa-only"), (3, 1, "efa-only"),
    ]  # fmt: skip
    assert request["Placement"] == {"GroupName": "pg-a"}
    assert (
        request["CapacityReservationSpecification"]["CapacityReservationTarget"]["CapacityReservationId"] == RESERVATION
    )
    assert "InstanceMarketOptions" not in request
    _valid_request(request)


@pytest.mark.parametrize(("instance_type", "efas"), [("p5e.48xlarge", 32), ("p4de.24xlarge", 4), ("trn1.32xlarge", 8)])
def test_each_known_instance_type_gets_one_efa_per_network_card(
    stubs: dict[str, Path], instance_type: str, efas: int
) -> None:
    launched = _launch_only(stubs, INSTANCE_TYPE=instance_type, NODES="1")
    assert launched.returncode == 0, launched.stderr
    request = _request(stubs, "rank0")
    assert [i["NetworkCardIndex"] for i in request["NetworkInterfaces"]] == list(range(efas))
    # And without a reservation, a cluster placement group of the job's own, created when absent
    assert request["Placement"] == {"GroupName": f"stallwatch-{JOB}"}
    _valid_request(request)


def test_an_instance_type_without_a_known_efa_count_needs_one(stubs: dict[str, Path]) -> None:
    refused = _launch_only(stubs, INSTANCE_TYPE="g6e.48xlarge")
    assert refused.returncode == 2
    assert "EFA_INTERFACES=''" in refused.stderr
    assert _calls(stubs) == []

    # When told there is no EFA, Then the node has one plain interface
    launched = _launch_only(stubs, INSTANCE_TYPE="g6e.48xlarge", EFA_INTERFACES="0", NODES="1")
    assert launched.returncode == 0, launched.stderr
    [interface] = _request(stubs, "rank0")["NetworkInterfaces"]
    assert interface["DeviceIndex"] == 0
    assert "InterfaceType" not in interface


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"JOB": ""}, "JOB"),
        ({"JOB": "a,b"}, "JOB"),  # a comma would break the tag arguments
        ({"JOB": "has.dot"}, "JOB"),
        ({"TRAIN_COMMAND": ""}, "TRAIN_COMMAND"),
        ({"TRAIN_COMMAND": 'train.py --name "$(id)"'}, "TRAIN_COMMAND"),
        ({"CHECKPOINT_URI": "/local/path"}, "CHECKPOINT_URI"),
        ({"NPROC_PER_NODE": "all"}, "NPROC_PER_NODE"),
        ({"MODE": "stop"}, "MODE"),
        ({"RESUME": "11", "CHECKPOINT_URI": "s3://b/c/"}, "RESUME"),
        ({"SUBNET": "my-subnet"}, "SUBNET"),
    ],
)
def test_a_value_the_job_cannot_run_with_is_refused_before_anything_is_created_or_launched(
    stubs: dict[str, Path], values: dict[str, str], named: str
) -> None:
    refused = _launch_only(stubs, **values)
    assert refused.returncode == 2
    assert refused.stderr.startswith(f"launch.sh: {named}=")
    assert _aws_changes(stubs) == []


@pytest.mark.parametrize(
    ("reservation", "said"),
    [
        (["capacity-block", "p5.48xlarge", "us-east-1a", "scheduled", "4", "None"], "is scheduled"),
        (["default", "p4d.24xlarge", "us-east-1a", "active", "4", "None"], "reserves p4d.24xlarge"),
        (["default", "p5.48xlarge", "us-east-1a", "active", "3", "None"], "room for 3"),
        (["default", "p5.48xlarge", "us-east-1b", "active", "4", "None"], "in us-east-1a"),
    ],
)
def test_a_reservation_that_cannot_hold_the_job_is_refused_before_any_launch(
    stubs: dict[str, Path], reservation: list[str], said: str
) -> None:
    refused = _launch_only(stubs, reservation, CAPACITY_RESERVATION=RESERVATION, **P5)
    assert refused.returncode == 2
    assert said in refused.stderr
    assert _aws_changes(stubs) == []


def test_the_role_it_creates_holds_exactly_what_the_nodes_need(stubs: dict[str, Path]) -> None:
    # Given an account without the job's role, instance profile and placement group
    launched = _launch_only(
        stubs, STUB_ABSENT="1", TRAIN_CODE_URI="s3://code-bucket/llm-70b/", CHECKPOINT_URI="s3://ckpt/runs/llm-70b/"
    )
    assert launched.returncode == 0, launched.stderr
    calls = _aws_changes(stubs)
    role = f"stallwatch-{JOB}"

    # Then the role is created for EC2 with the stack's policy (metrics, logs, agent config and wheel) and SSM's core
    # (recovery in place), and may read the code and read and write the checkpoints, under their prefixes only
    [create] = [c for c in calls if c[1:3] == ["iam", "create-role"]]
    trust = json.loads(create[create.index("--assume-role-policy-document") + 1])
    assert trust["Statement"] == [
        {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}
    ]
    attached = {c[c.index("--policy-arn") + 1] for c in calls if c[1:3] == ["iam", "attach-role-policy"]}
    assert attached == {OUTPUTS["Ec2InstancePolicyArn"], "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"}
    [inline] = [c for c in calls if c[1:3] == ["iam", "put-role-policy"]]
    statements = {s["Sid"]: s for s in json.loads(inline[inline.index("--policy-document") + 1])["Statement"]}
    assert statements["TrainingCode"]["Action"] == ["s3:GetObject"]
    assert statements["TrainingCode"]["Resource"] == "arn:aws:s3:::code-bucket/llm-70b/*"
    assert statements["ListCode"]["Condition"] == {"StringLike": {"s3:prefix": "llm-70b/*"}}
    assert set(statements["TrainingCheckpoints"]["Action"]) == {
        "s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
    }  # fmt: skip
    assert statements["TrainingCheckpoints"]["Resource"] == "arn:aws:s3:::ckpt/runs/llm-70b/*"
    assert statements["ListCheckpoints"]["Resource"] == "arn:aws:s3:::ckpt"
    assert ["aws", "iam", "add-role-to-instance-profile", "--instance-profile-name", role, "--role-name", role] in calls
    # And the cluster placement group is created, all before the first launch, which uses the profile
    assert ["aws", "ec2", "create-placement-group", "--group-name", role, "--strategy", "cluster"] in calls
    first_launch = next(i for i, c in enumerate(calls) if c[1:3] == ["ec2", "run-instances"])
    assert all(c[1] == "iam" or "placement" in c[2] for c in calls[:first_launch])
    assert _request(stubs, "rank0")["IamInstanceProfile"] == {"Name": role}


def test_a_dry_run_prints_a_plan_and_its_commands_and_changes_nothing(stubs: dict[str, Path]) -> None:
    printed = _launch_only(stubs, DRY_RUN="1", CHECKPOINT_URI="s3://ckpt/llm-70b/", **P5)
    assert printed.returncode == 0, printed.stderr
    plan = [line for line in printed.stdout.splitlines() if line.startswith("#")]
    commands = [shlex.split(line) for line in printed.stdout.splitlines() if not line.startswith("#")]

    # Then it reads as a plan: the role and instance profile, the placement group and the nodes a run would make
    # (the stub says the role and the group exist), how long they run and how to end them
    said = "\n".join(plan)
    assert f"role and instance profile stallwatch-{JOB}: exist, brought up to date" in said
    assert "AmazonSSMManagedInstanceCore and stallwatch-job-s3" in said
    assert f"placement group stallwatch-{JOB}: exists, used" in said
    assert "4 x p5.48xlarge, On-Demand: rank 0, then 3 with its private IP; 32 EFA each" in said
    assert "each node powers off 2 h after its training starts" in said
    assert "aws ec2 terminate-instances" in said
    assert len(printed.stdout) < 16_000
    # And the two launches as they would run, the only commands
    assert [command[:3] for command in commands] == [["aws", "ec2", "run-instances"]] * 2
    rank0, others = (_as_request(command[3:]) for command in commands)
    _valid_request(rank0)
    assert (rank0["MinCount"], others["MinCount"]) == (1, 3)
    assert len(rank0["NetworkInterfaces"]) == 32
    assert _aws_changes(stubs) == []


def test_a_dry_run_says_what_a_run_would_create(stubs: dict[str, Path]) -> None:
    printed = _launch_only(stubs, DRY_RUN="1", STUB_ABSENT="1")  # no such role, no such placement group
    assert printed.returncode == 0, printed.stderr
    assert f"role and instance profile stallwatch-{JOB}: created" in printed.stdout
    assert f"placement group stallwatch-{JOB} (cluster): created" in printed.stdout
    assert _aws_changes(stubs) == []


def test_the_launchers_defaults_are_small_nodes_that_power_off(stubs: dict[str, Path]) -> None:
    # When launch.sh runs with only the values it requires
    assert _launch_only(stubs).returncode == 0

    # Then the nodes are g5.xlarge (one GPU each), without EFA, and each powers off 2 hours after its training starts
    rank0 = _request(stubs, "rank0")
    assert rank0["InstanceType"] == "g5.xlarge"
    assert [i.get("InterfaceType") for i in rank0["NetworkInterfaces"]] == [None]
    assert "MAX_HOURS=2\n" in (stubs["dir"] / "rank0.sh").read_text()


def test_help_and_docs_name_every_value_launch_sh_reads() -> None:
    # Given the values launch.sh reads from its environment
    script = (DEPLOY / "launch.sh").read_text()
    read = set(re.findall(r'^([A-Z_]+)="\$\{\1:-', script, re.MULTILINE)) | {"STALLWATCH_STACK", "NPROC_PER_NODE"}
    read |= {"TRAIN_DIR", "PYTHON", "RDZV_PORT"}  # handed on to the nodes as they are
    shown = subprocess.run(["bash", str(DEPLOY / "launch.sh"), "--help"], capture_output=True, text=True, check=True)
    documented = {line.split()[0] for line in shown.stdout.splitlines() if re.match(r"^  [A-Z_]{3,} ", line)}
    # Then --help names each, with its default, and so does docs/deploy.md's table of them
    assert read <= documented
    deploy_md = (Path(__file__).resolve().parents[1] / "docs" / "deploy.md").read_text()
    assert [name for name in sorted(documented) if f"| `{name}`" not in deploy_md] == []


def test_the_unit_file_is_one_systemd_accepts(stubs: dict[str, Path]) -> None:
    # Given the unit a node writes
    assert _launch(stubs, NODES="1").returncode == 0
    root = stubs["dir"] / "node"
    _preinstalled_agent(root, stubs)
    assert _boot(stubs, stubs["dir"] / "rank0.sh", root, {}).returncode == 0
    unit = root / "etc/systemd/system/stallwatch-train.service"

    # When systemd checks it, its paths moved under the node's folder (where this test installed them)
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze is not installed: apt-get install systemd")
    text = unit.read_text()
    for path in ("/opt/stallwatch/", "/etc/stallwatch/", "/opt/train", "/var/log/training/"):
        text = text.replace(path, f"{root}{path}")
    checked_unit = stubs["dir"] / "check" / unit.name
    checked_unit.parent.mkdir()
    checked_unit.write_text(text)
    checked = subprocess.run(
        [analyze, "verify", str(checked_unit)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "SYSTEMD_LOG_LEVEL": "warning"},
    )

    # Then it finds nothing wrong with it
    problems = [line for line in checked.stderr.splitlines() if unit.name in line]
    assert problems == [], checked.stderr


def test_the_launcher_reads_the_stacks_outputs_and_no_package_index() -> None:
    launch, user_data = (DEPLOY / "launch.sh").read_text(), (DEPLOY / "user-data.sh").read_text()
    for output in OUTPUTS:
        assert f"output {output}" in launch
    assert 'pip install "trainer-agent' not in user_data  # no index name Stallwatch does not own
