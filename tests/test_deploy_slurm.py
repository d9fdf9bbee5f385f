"""deploy/slurm/install.sh: what a lifecycle script installs on a Slurm cluster's controller, login and compute nodes
(ParallelCluster, PCS, HyperPod alike), under a folder of the test's: the scripts in /opt/stallwatch/slurm, their
settings in /etc/stallwatch/slurm.env (which the runner and the Prolog read), the runner's systemd unit, and the
nodes' log folder root's alone."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from tests.fixtures.slurm import runner_script

INSTALL = Path(__file__).resolve().parents[1] / "deploy" / "slurm" / "install.sh"
SETTINGS = {
    "STALLWATCH_TABLE": "stallwatch-Table-1ABC",
    "STALLWATCH_EVENT_BUS": "stallwatch-slurm",
    "AWS_REGION": "us-west-2",
    "STALLWATCH_PLATFORM": "hyperpod",
    "STALLWATCH_SSM_TARGET": "sagemaker-cluster:2hd31rmi9mde_controller-machine-i-09e7576cbc230c181",
}


def install(root: Path, *roles: str, **settings: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "STALLWATCH_ROOT": str(root)} | settings
    return subprocess.run(["sh", str(INSTALL), *roles], env=env, capture_output=True, text=True, check=False)


def test_a_controller_with_its_runner_and_a_node_get_their_scripts_settings_and_unit(tmp_path: Path) -> None:
    # When a lifecycle script installs the controller, its runner, and a compute node
    done = install(tmp_path, "--controller", "--runner", "--node", **SETTINGS)

    # Then each script is in place and root's, the runner's unit starts it, and the settings are the stack's
    assert done.returncode == 0, done.stderr
    opt = tmp_path / "opt/stallwatch/slurm"
    expected = {
        "stallwatch-events.sh",
        "stallwatch-runner",
        "stallwatch-prolog.sh",
        "stallwatch-key.sh",
        "stallwatch-log.sh",
    }
    assert {p.name for p in opt.iterdir()} == expected
    assert all(os.access(opt / name, os.X_OK) for name in expected - {"stallwatch-key.sh"})
    unit = (tmp_path / "etc/systemd/system/stallwatch-runner.service").read_text()
    assert "ExecStart=/opt/stallwatch/slurm/stallwatch-runner" in unit
    assert "Restart=always" in unit
    logs = tmp_path / "var/log/stallwatch/slurm"
    assert (logs.stat().st_uid, stat.S_IMODE(logs.stat().st_mode)) == (0, 0o755)
    assert "PrologSlurmctld=" in done.stdout
    assert "Prolog=" in done.stdout
    # And the runner reads the settings the file holds, as the shell does
    settings = (tmp_path / "etc/stallwatch/slurm.env").read_text()
    for name, value in SETTINGS.items():
        assert f"{name}='{value}'" in settings
    shell = subprocess.run(
        ["sh", "-c", f". {tmp_path / 'etc/stallwatch/slurm.env'}; echo $STALLWATCH_TABLE $STALLWATCH_SSM_TARGET"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert shell.stdout.split() == [SETTINGS["STALLWATCH_TABLE"], SETTINGS["STALLWATCH_SSM_TARGET"]]


def test_a_runner_without_the_stacks_table_is_refused_and_an_unknown_role_too(tmp_path: Path) -> None:
    assert install(tmp_path, "--runner").returncode == 2
    assert "STALLWATCH_TABLE" in install(tmp_path, "--runner").stderr
    assert install(tmp_path, "--everything", **SETTINGS).returncode == 2
    assert install(tmp_path).returncode == 2


def test_the_runner_reads_its_settings_file(tmp_path: Path, monkeypatch) -> None:
    # Given the settings file the installer wrote beside the runner
    install(tmp_path, "--runner", **SETTINGS)
    (tmp_path / "opt/stallwatch/slurm/stallwatch-slurm.env").write_text(
        (tmp_path / "etc/stallwatch/slurm.env").read_text()
    )
    script = runner_script()
    for name in SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", os.environ["PATH"])  # restored after: the runner adds Slurm's folders to it
    monkeypatch.setattr(script, "__file__", str(tmp_path / "opt/stallwatch/slurm/stallwatch-runner"))
    # When the runner reads its settings
    script.settings()
    # Then they are the file's
    assert {name: os.environ[name] for name in SETTINGS} == SETTINGS
