"""The Lambda asset is bundled locally, without Docker, for the Lambda runtime and architecture."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import DockerImage
from aws_cdk import aws_lambda as lambda_

from stacks.bundling import LocalPythonBundling
from stacks.constants import LAMBDA_ARCHITECTURE, LAMBDA_PACKAGES, LAMBDA_RUNTIME, LAMBDA_SOURCE_DIR


def _bundler(
    *, bundle_dependencies: bool, architecture: lambda_.Architecture = LAMBDA_ARCHITECTURE
) -> LocalPythonBundling:
    return LocalPythonBundling(
        LAMBDA_SOURCE_DIR, runtime=LAMBDA_RUNTIME, architecture=architecture, bundle_dependencies=bundle_dependencies
    )


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


def test_dependencies_are_installed_as_wheels_for_the_lambda_platform(tmp_path: Path) -> None:
    command = _bundler(bundle_dependencies=True).pip_command(tmp_path)
    assert command[command.index("--python-version") + 1] == "3.12"
    assert command[command.index("--target") + 1] == str(tmp_path)
    assert "manylinux2014_aarch64" in command
    assert "--only-binary=:all:" in command
    assert str(LAMBDA_SOURCE_DIR / "requirements.txt") in command
    x86_command = _bundler(bundle_dependencies=True, architecture=lambda_.Architecture.X86_64).pip_command(tmp_path)
    assert "manylinux2014_x86_64" in x86_command


def test_the_asset_hash_tells_the_offline_bundle_from_the_full_one() -> None:
    assert _bundler(bundle_dependencies=False).hash_inputs() != _bundler(bundle_dependencies=True).hash_inputs()
