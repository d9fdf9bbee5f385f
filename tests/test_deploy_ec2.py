"""deploy/ec2: what a user installs on EC2 training nodes matches what the control plane reads, and it boots.

launch.sh is run for a 2-node job against a stub AWS CLI; the user data it renders for each node is then run with
stub `curl` (instance metadata), `systemctl`, package managers, pip and CloudWatch agent, installing under a folder.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stacks.ec2_training import cloudwatch_agent_config
from stallwatch.core import clusters, contract
from stallwatch.core.config import EC2_LOG_GROUP
from stallwatch.core.policy import MODE_TAG
from stallwatch.core.reading import EC2_STREAM
from stallwatch.core.resume import CHECKPOINT_TAG, RESUME_TAG

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
        count, user_data = int(args[args.index("--count") + 1]), args[args.index("--user-data") + 1]
        rank0 = not Path(os.environ["STUB_DIR"], "rank0.sh").exists()
        Path(os.environ["STUB_DIR"], "rank0.sh" if rank0 else "others.sh").write_text(
            Path(user_data.removeprefix("file://")).read_text())
        for i in range(count):
            print(f"i-0{{'a' if rank0 else 'b'}}{{i:015x}}\\t10.0.1.{{10 + i + (0 if rank0 else 1)}}")
    elif args[:2] == ["s3", "cp"]:
        with zipfile.ZipFile(args[-1], "w") as archive:
            archive.writestr("trainer_agent-0.1.0-py3-none-any.whl", b"wheel")
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
COMMANDS = ("aws", "curl", "uname", "dnf", "dpkg", "rpm", "systemctl", "python-stub", "agent-ctl")


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
        **extra,
    }


def _launch(stubs: dict[str, Path], **values: str) -> subprocess.CompletedProcess[str]:
    """launch.sh for a 2-node job, against the stub AWS CLI."""
    job = {
        "JOB": JOB,
        "NODES": "2",
        "AMI": "ami-0123456789abcdef0",
        "SUBNET": "subnet-0123",
        "SECURITY_GROUP": "sg-0123",
        "TRAIN_COMMAND": "train.py --config configs/70b.yaml --lr=3e-4",
        "CHECKPOINT_URI": "s3://my-bucket/checkpoints/llm-70b/",
        "RESUME": "2",
        "PYTHON": "python-stub",
    } | values
    return subprocess.run(
        ["bash", str(DEPLOY / "launch.sh")], env=_env(stubs, **job), capture_output=True, text=True, check=False
    )


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
    runs = [c for c in _calls(stubs) if c[:3] == ["aws", "ec2", "run-instances"]]
    assert [c[c.index("--count") + 1] for c in runs] == ["1", "1"]
    for run in runs:
        tags = run[run.index("--tag-specifications") + 1]
        for key, value in (
            (clusters.JOB_TAG, JOB),
            (MODE_TAG, "enforce"),
            (CHECKPOINT_TAG, "s3://my-bucket/checkpoints/llm-70b/"),
            (RESUME_TAG, "2"),
        ):
            assert f"{{Key={key},Value={value}}}" in tags
        assert "InstanceMetadataTags=enabled" in run[run.index("--metadata-options") + 1]
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
