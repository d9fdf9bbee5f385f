"""The Lambda asset, bundled on this machine without Docker.

The asset is the runtime packages (``stallwatch``, ``handlers``) plus ``lambdas/requirements.txt``
installed as wheels for the Lambda runtime and architecture (Powertools included, so no layer ARN per region):

    code = lambda_code(bundle_dependencies=True)

With ``bundle_dependencies=False`` only the packages are copied: synth then works offline (tests,
reviews), but the asset cannot run. The choice is part of the asset hash, so the two never share a cache.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import jsii
from aws_cdk import BundlingOptions, DockerImage, ILocalBundling
from aws_cdk import aws_lambda as lambda_

from stacks.constants import (
    LAMBDA_ARCHITECTURE,
    LAMBDA_PACKAGES,
    LAMBDA_REQUIREMENTS,
    LAMBDA_RUNTIME,
    LAMBDA_SOURCE_DIR,
)

# Kept out of the asset and its hash: build and editor leftovers.
ASSET_EXCLUDE = ["**/__pycache__", "**/*.pyc", "*.egg-info", "build", "dist"]
# The runtime's own SDK (a newer botocore pulled in by aws-xray-sdk would shadow it) and console scripts.
_NOT_BUNDLED = ("boto3", "botocore", "s3transfer", "bin")
_COPY_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc")
# Amazon Linux 2023 (python3.12+) has glibc 2.34: manylinux2014 and manylinux_2_28 wheels both run.
_WHEEL_PLATFORMS = {
    "arm64": ("manylinux2014_aarch64", "manylinux_2_28_aarch64"),
    "x86_64": ("manylinux2014_x86_64", "manylinux_2_28_x86_64"),
}


class BundlingError(RuntimeError):
    """The Lambda dependencies could not be installed."""


@jsii.implements(ILocalBundling)
class LocalPythonBundling:
    """Copies the runtime packages and installs the wheels for `runtime`/`architecture` with pip."""

    def __init__(
        self,
        source_dir: Path,
        *,
        runtime: lambda_.Runtime,
        architecture: lambda_.Architecture,
        bundle_dependencies: bool,
    ) -> None:
        self.source_dir = source_dir
        self.python_version = runtime.name.removeprefix("python")
        self.platforms = _WHEEL_PLATFORMS[architecture.name]
        self.bundle_dependencies = bundle_dependencies

    def try_bundle(self, output_dir: str, *, image: DockerImage, **_options: object) -> bool:
        """Bundle into `output_dir`; always handles the asset (True), or raises."""
        output = Path(output_dir)
        for package in LAMBDA_PACKAGES:
            shutil.copytree(self.source_dir / package, output / package, ignore=_COPY_IGNORE, dirs_exist_ok=True)
        if self.bundle_dependencies:
            self._install_dependencies(output)
        return True

    def hash_inputs(self) -> dict[str, str]:
        """What the bundle depends on besides the source files."""
        return {
            "BUNDLE_DEPENDENCIES": str(self.bundle_dependencies).lower(),
            "PYTHON_VERSION": self.python_version,
            "PLATFORMS": " ".join(self.platforms),
        }

    def pip_command(self, output_dir: Path) -> list[str]:
        """The pip invocation that installs the runtime's wheels into `output_dir`."""
        platforms = [arg for platform in self.platforms for arg in ("--platform", platform)]
        return [
            sys.executable, "-m", "pip", "install",
            "--requirement", str(self.source_dir / LAMBDA_REQUIREMENTS),
            "--target", str(output_dir),
            "--implementation", "cp",
            "--python-version", self.python_version,
            *platforms,
            "--only-binary=:all:",
            "--upgrade", "--no-compile", "--quiet", "--disable-pip-version-check",
        ]  # fmt: skip

    def _install_dependencies(self, output_dir: Path) -> None:
        result = subprocess.run(self.pip_command(output_dir), capture_output=True, text=True, check=False)
        if result.returncode:
            raise BundlingError(
                f"pip could not install {self.source_dir / LAMBDA_REQUIREMENTS} for python{self.python_version} "
                f"{'/'.join(self.platforms)}:\n{result.stderr.strip()}\n"
                "Offline? Synthesize with `-c stallwatch:bundle-dependencies=false` (not deployable)."
            )
        for name in _NOT_BUNDLED:
            for leftover in [*output_dir.glob(name), *output_dir.glob(f"{name}-*.dist-info")]:
                shutil.rmtree(leftover)


def lambda_code(*, bundle_dependencies: bool) -> lambda_.Code:
    """One asset shared by the three functions."""
    bundler = LocalPythonBundling(
        LAMBDA_SOURCE_DIR,
        runtime=LAMBDA_RUNTIME,
        architecture=LAMBDA_ARCHITECTURE,
        bundle_dependencies=bundle_dependencies,
    )
    return lambda_.Code.from_asset(
        str(LAMBDA_SOURCE_DIR),
        exclude=ASSET_EXCLUDE,
        bundling=BundlingOptions(
            # Required by the API; used only if local bundling declined, which it never does.
            image=LAMBDA_RUNTIME.bundling_image,
            local=bundler,
            # Hashed into the asset: a dependency-free or other-platform build never reuses another's cache.
            environment=bundler.hash_inputs(),
        ),
    )
