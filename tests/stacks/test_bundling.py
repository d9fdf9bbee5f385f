"""The Lambda asset is bundled locally, without Docker: exactly the lock's wheels for the Lambda runtime and
architecture, hash-checked, then compiled to bytecode for the runtime's Python."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest
from aws_cdk import DockerImage
from aws_cdk import aws_lambda as lambda_

import trainer_agent
from stacks.bundling import RUNTIME_PROVIDED, AgentWheelBundling, BundlingError, LocalPythonBundling
from stacks.constants import (
    AGENT_LOCK,
    AGENT_WHEEL_SOURCES,
    LAMBDA_ARCHITECTURE,
    LAMBDA_LOCK,
    LAMBDA_PACKAGES,
    LAMBDA_REQUIREMENTS,
    LAMBDA_RUNTIME,
    LAMBDA_SOURCE_DIR,
    REPO_ROOT,
)
from stacks.lock import agent_requirements, lock_text

RUNTIME_PYTHON = LAMBDA_RUNTIME.name.removeprefix("python")
_PIN = re.compile(r"^([a-z0-9-]+)==(\S+) \\\n    --hash=sha256:([0-9a-f]{64})$", re.MULTILINE)


def _bundler(
    source_dir: Path = LAMBDA_SOURCE_DIR,
    *,
    bundle_dependencies: bool,
    architecture: lambda_.Architecture = LAMBDA_ARCHITECTURE,
) -> LocalPythonBundling:
    return LocalPythonBundling(
        source_dir, runtime=LAMBDA_RUNTIME, architecture=architecture, bundle_dependencies=bundle_dependencies
    )


def _wheel(folder: Path, name: str, version: str, requires: list[str]) -> Path:
    """A minimal pure-Python wheel (a module and a console script), as a package index would serve it."""
    dist_info = f"{name}-{version}.dist-info"
    metadata = "".join(
        [f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", *(f"Requires-Dist: {r}\n" for r in requires)]
    )
    files = {
        f"{name}/__init__.py": "VALUE = 42\n",
        f"{dist_info}/METADATA": metadata,
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{dist_info}/entry_points.txt": f"[console_scripts]\n{name}-cli = {name}:main\n",
    }
    records = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        records.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{dist_info}/RECORD"] = "\n".join([*records, f"{dist_info}/RECORD,,"]) + "\n"
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


@pytest.fixture
def locked_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The runtime packages and a lock pinning one wheel (which requires another, unlocked), served from a local
    folder instead of PyPI."""
    index = tmp_path / "index"
    index.mkdir()
    wheel = _wheel(index, "tinydep", "1.0", requires=["unlockeddep"])
    _wheel(index, "unlockeddep", "1.0", requires=[])
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    source = tmp_path / "lambdas"
    source.mkdir()
    for package in LAMBDA_PACKAGES:
        (source / package).symlink_to(LAMBDA_SOURCE_DIR / package)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (source / LAMBDA_LOCK).write_text(f"tinydep==1.0 \\\n    --hash=sha256:{digest}\n")
    return source


def test_without_dependencies_the_bundle_is_the_runtime_packages_only(tmp_path: Path) -> None:
    # Given the offline bundler
    bundler = _bundler(bundle_dependencies=False)
    # When it bundles
    handled = bundler.try_bundle(str(tmp_path), image=DockerImage.from_registry("unused"))
    # Then it handled the asset itself (no Docker), copying the packages without bytecode
    assert handled is True
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(LAMBDA_PACKAGES)
    assert (tmp_path / "stallwatch" / "core" / "config.py").is_file()
    assert not list(tmp_path.rglob("__pycache__"))


def test_the_bundle_installs_exactly_the_locked_wheels_and_their_bytecode(locked_source: Path, tmp_path: Path) -> None:
    # Given a lock with one wheel, and a Python of the runtime's version on this machine
    bundler = _bundler(locked_source, bundle_dependencies=True)
    assert bundler.bytecode_python, f"python{RUNTIME_PYTHON} is needed to compile the asset's bytecode (pyenv)"
    output = tmp_path / "asset"
    output.mkdir()
    # When it bundles
    bundler.try_bundle(str(output), image=DockerImage.from_registry("unused"))
    # Then the locked wheel is in, its unlocked dependency is not (nothing is resolved), nor its console script
    assert (output / "tinydep" / "__init__.py").is_file()
    assert not list(output.glob("unlockeddep*"))
    assert not (output / "bin").exists()
    # And every module has bytecode for the runtime's Python that never checks its source (the zip resets mtimes)
    magic = subprocess.run(
        [bundler.bytecode_python, "-c", "import importlib.util; print(importlib.util.MAGIC_NUMBER.hex())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    tag = f"cpython-{RUNTIME_PYTHON.replace('.', '')}"
    for module in [output / "tinydep" / "__init__.py", output / "stallwatch" / "core" / "config.py"]:
        pyc = module.parent / "__pycache__" / f"{module.stem}.{tag}.pyc"
        header = pyc.read_bytes()[:8]
        assert header[:4].hex() == magic
        assert int.from_bytes(header[4:8], "little") == 0b01  # hash-based, unchecked (PEP 552)


def test_a_wheel_that_does_not_match_the_lock_hash_fails_the_bundle(locked_source: Path, tmp_path: Path) -> None:
    lock = locked_source / LAMBDA_LOCK
    lock.write_text(re.sub(r"sha256:[0-9a-f]{64}", "sha256:" + "0" * 64, lock.read_text()))
    with pytest.raises(BundlingError, match="THESE PACKAGES DO NOT MATCH THE HASHES"):
        _bundler(locked_source, bundle_dependencies=True).try_bundle(
            str(tmp_path), image=DockerImage.from_registry("unused")
        )


def test_dependencies_are_the_lock_installed_as_wheels_for_the_lambda_platform(tmp_path: Path) -> None:
    command = _bundler(bundle_dependencies=True).pip_command(tmp_path)
    assert command[command.index("--requirement") + 1] == str(LAMBDA_SOURCE_DIR / LAMBDA_LOCK)
    assert {"--require-hashes", "--no-deps", "--only-binary=:all:", "manylinux2014_aarch64"} <= set(command)
    assert command[command.index("--python-version") + 1] == RUNTIME_PYTHON
    assert command[command.index("--target") + 1] == str(tmp_path)
    x86_command = _bundler(bundle_dependencies=True, architecture=lambda_.Architecture.X86_64).pip_command(tmp_path)
    assert "manylinux2014_x86_64" in x86_command


def test_the_asset_hash_covers_the_lock_and_tells_the_offline_bundle_from_the_full_one(locked_source: Path) -> None:
    before = _bundler(locked_source, bundle_dependencies=True).hash_inputs()
    lock = locked_source / LAMBDA_LOCK
    lock.write_text(lock.read_text().replace("tinydep==1.0", "tinydep==1.1"))
    assert _bundler(locked_source, bundle_dependencies=True).hash_inputs() != before
    assert _bundler(bundle_dependencies=False).hash_inputs() != _bundler(bundle_dependencies=True).hash_inputs()


def test_the_committed_lock_pins_every_requirement_with_a_hash_and_leaves_the_runtime_sdk_out() -> None:
    lock = (LAMBDA_SOURCE_DIR / LAMBDA_LOCK).read_text()
    pins = {name: version for name, version, _ in _PIN.findall(lock)}
    entries = [line for line in lock.splitlines() if line and not line.startswith(("#", "    "))]
    assert len(entries) == len(pins), "every entry has exactly one sha256"
    assert f"{LAMBDA_RUNTIME.name} {LAMBDA_ARCHITECTURE.name}" in lock
    for line in (LAMBDA_SOURCE_DIR / LAMBDA_REQUIREMENTS).read_text().splitlines():
        if line and not line.startswith("#"):
            requirement, version = line.split("==")
            name = requirement.split("[")[0].lower().replace("_", "-")
            assert pins.get(name) == version, f"{name}: run `make lambda-lock`"
    assert not set(RUNTIME_PROVIDED) & set(pins)


def test_the_lock_is_written_from_pips_report_sorted_with_one_hash_each() -> None:
    # Given pip's installation report (the fields pip documents), with the runtime's botocore in it
    def item(name: str, version: str, digest: str) -> dict[str, object]:
        archive = {"hashes": {"sha256": digest}}
        return {"metadata": {"name": name, "version": version}, "download_info": {"archive_info": archive}}

    report = {"install": [item("Pydantic_Core", "2.50.4", "a" * 64), item("botocore", "1.44.8", "b" * 64),
                          item("annotated-types", "0.8.0", "c" * 64)]}  # fmt: skip
    # When the lock is written
    text = lock_text(report, header="for python3.12 arm64")
    # Then names are normalized and sorted, each with its hash, and botocore is left to the runtime
    assert text == (
        "# for python3.12 arm64\n"
        f"annotated-types==0.8.0 \\\n    --hash=sha256:{'c' * 64}\n"
        f"pydantic-core==2.50.4 \\\n    --hash=sha256:{'a' * 64}\n"
    )


# ---- the trainer agent's asset for EC2 nodes -----------------------------------------------------------------------


@pytest.fixture
def agent_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A lock of the agent's extras' packages, as wheels served from a local folder instead of PyPI."""
    index = tmp_path / "index"
    index.mkdir()
    pins = []
    for name, version in (("boto3", "1.99.0"), ("nvidia_ml_py", "13.0")):
        wheel = _wheel(index, name, version, requires=[])
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        pins.append(f"{name.replace('_', '-')}=={version} \\\n    --hash=sha256:{digest}")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    lock = tmp_path / "agent-requirements.lock"
    lock.write_text("\n".join(pins) + "\n")
    return lock


def test_the_agents_asset_carries_its_dependencies_and_installs_with_no_index(agent_lock: Path, tmp_path: Path) -> None:
    # Given the agent's bundler with the lock of its extras' packages
    asset = tmp_path / "asset"
    asset.mkdir()
    AgentWheelBundling(REPO_ROOT, bundle_dependencies=True, lock=agent_lock).try_bundle(
        str(asset), image=DockerImage.from_registry("unused")
    )

    # Then the asset holds the agent's wheel and the locked wheels
    names = sorted(p.name for p in asset.iterdir())
    assert names == ["boto3-1.99.0-py3-none-any.whl", "nvidia_ml_py-13.0-py3-none-any.whl", _agent_wheel_name()]

    # And a node's fresh environment installs the agent with its extras from it alone, as user-data.sh does
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-cache-dir"]
    installed = subprocess.run(
        [*pip, "--no-index", "--find-links", str(asset), f"{asset / _agent_wheel_name()}[aws,nvml]"],
        capture_output=True, text=True, check=False, env={**os.environ, "PIP_FIND_LINKS": ""},
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    imported = subprocess.run([str(python), "-c", "import boto3, nvidia_ml_py, trainer_agent"], check=False)
    assert imported.returncode == 0


def test_the_offline_agent_asset_is_its_wheel_alone_and_its_hash_tells_the_two_apart(
    agent_lock: Path, tmp_path: Path
) -> None:
    offline = AgentWheelBundling(REPO_ROOT, bundle_dependencies=False, lock=agent_lock)
    asset = tmp_path / "asset"
    asset.mkdir()
    offline.try_bundle(str(asset), image=DockerImage.from_registry("unused"))
    assert [p.name for p in asset.iterdir()] == [_agent_wheel_name()]
    full = AgentWheelBundling(REPO_ROOT, bundle_dependencies=True, lock=agent_lock).hash_inputs()
    assert offline.hash_inputs() != full
    agent_lock.write_text(agent_lock.read_text().replace("13.0", "13.1"))
    assert AgentWheelBundling(REPO_ROOT, bundle_dependencies=True, lock=agent_lock).hash_inputs() != full


def test_the_agents_wheel_is_built_once_a_process_and_again_when_a_source_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a copy of the agent's sources, and every pip wheel this process runs counted
    repo = tmp_path / "repo"
    for name in AGENT_WHEEL_SOURCES:
        (shutil.copytree if (REPO_ROOT / name).is_dir() else shutil.copy2)(REPO_ROOT / name, repo / name)
    builds = []
    run = subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda command, **kw: builds.append(command) or run(command, **kw))

    def bundle() -> bytes:
        asset = Path(tempfile.mkdtemp(dir=tmp_path))
        AgentWheelBundling(repo, bundle_dependencies=False).try_bundle(str(asset), image=DockerImage.from_registry("x"))
        [wheel] = asset.iterdir()
        return zipfile.ZipFile(wheel).read("trainer_agent/__init__.py")

    # When two stacks bundle it (two regions of one deployment), then a module changes and a third does
    first, second = bundle(), bundle()
    init = repo / "trainer_agent" / "__init__.py"
    init.write_text(init.read_text() + "\nEDITED = True\n")
    third = bundle()

    # Then pip built it twice: once for the first two, and again with the change
    assert len(builds) == 2
    assert first == second != third
    assert third.endswith(b"EDITED = True\n")


def test_the_committed_agent_lock_pins_every_package_of_the_agents_extras_with_a_hash() -> None:
    lock = AGENT_LOCK.read_text()
    pins = {name: version for name, version, _ in _PIN.findall(lock)}
    entries = [line for line in lock.splitlines() if line and not line.startswith(("#", "    "))]
    assert len(entries) == len(pins), "every entry has exactly one sha256"
    for requirement in agent_requirements():
        name, _, lowest = requirement.partition(">=")
        assert name in pins, f"{name}: run `make lambda-lock`"
        assert tuple(map(int, pins[name].split(".")[:2])) >= tuple(map(int, lowest.split(".")[:2]))
    # And boto3's own dependencies travel too: a node's pip resolves nothing from an index
    assert {"botocore", "s3transfer", "jmespath", "urllib3", "python-dateutil", "six"} <= set(pins)
    command = AgentWheelBundling(REPO_ROOT, bundle_dependencies=True).download_command(Path("/out"))
    assert {"--require-hashes", "--no-deps", "--only-binary=:all:"} <= set(command)
    assert command[command.index("--platform") + 1] == "any"


def _agent_wheel_name() -> str:
    return f"trainer_agent-{trainer_agent.__version__}-py3-none-any.whl"
