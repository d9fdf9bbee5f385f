"""The Lambda asset and the trainer-agent wheel with its dependencies' wheels (for EC2 training nodes), bundled on
this machine without Docker.

The asset is the runtime packages (``stallwatch``, ``handlers``) plus every package of ``lambdas/requirements.lock``
(pinned, with hashes, for the Lambda runtime's Python and architecture; ``make lambda-lock`` writes it), installed as
wheels without resolving anything, then compiled to bytecode for the runtime's Python:

    code = lambda_code(bundle_dependencies=True)

Bytecode is compiled with ``--invalidation-mode unchecked-hash``: the asset's zip resets file times, which would make
timestamp-checked ``.pyc`` files stale, and ``/var/task`` is read-only, so without them every cold start compiles
every module again. It needs a CPython of the runtime's version on this machine (`stacks.interpreters`); without one
the asset ships sources only, with a warning, and a different asset hash.

The agent's asset is its wheel, built from the repository, beside the wheels of ``deploy/ec2/agent-requirements.lock``
(downloaded hash-checked, without resolving anything): a node installs them with ``pip install --no-index``.

With ``bundle_dependencies=False`` only the packages (and the agent's own wheel) are in the assets: synth then works
offline (tests, reviews), but the assets cannot run. The choice, the locks' digests and the bytecode's Python are part
of the asset hashes.
"""

from __future__ import annotations

import functools
import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jsii
from aws_cdk import BundlingOptions, DockerImage, ILocalBundling
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_s3_assets as s3_assets
from constructs import Construct

from stacks.constants import (
    AGENT_LOCK,
    AGENT_OLDEST_PYTHON,
    AGENT_WHEEL_SOURCES,
    LAMBDA_ARCHITECTURE,
    LAMBDA_LOCK,
    LAMBDA_PACKAGES,
    LAMBDA_RUNTIME,
    LAMBDA_SOURCE_DIR,
    REPO_ROOT,
)
from stacks.interpreters import find_python

# Kept out of the asset and its hash: build and editor leftovers.
ASSET_EXCLUDE = ["**/__pycache__", "**/*.pyc", "*.egg-info", "build", "dist"]
# The runtime's own SDK, never locked nor bundled (a newer botocore pulled in by aws-xray-sdk would shadow it).
RUNTIME_PROVIDED = ("boto3", "botocore", "s3transfer")
# Console scripts: nothing in the functions runs them.
_NOT_BUNDLED = ("bin",)
_COPY_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc")
# Amazon Linux 2023 (python3.12+) has glibc 2.34: manylinux2014 and manylinux_2_28 wheels both run.
_WHEEL_PLATFORMS = {
    "arm64": ("manylinux2014_aarch64", "manylinux_2_28_aarch64"),
    "x86_64": ("manylinux2014_x86_64", "manylinux_2_28_x86_64"),
}
# The agent's dependencies are pure-Python wheels, one set for every node's architecture and Python.
AGENT_WHEEL_SELECTION = (
    "--implementation", "py", "--python-version", AGENT_OLDEST_PYTHON, "--platform", "any", "--only-binary=:all:",
)  # fmt: skip
# Where the functions' code lies on Lambda: the path compiled into the bytecode (tracebacks name it).
_LAMBDA_TASK_ROOT = "/var/task"


class BundlingError(RuntimeError):
    """The Lambda dependencies could not be installed or compiled."""


def wheel_selection(runtime: lambda_.Runtime, architecture: lambda_.Architecture) -> list[str]:
    """pip options that pick the wheels `runtime` on `architecture` loads, whatever machine runs pip."""
    platforms = [arg for platform in _WHEEL_PLATFORMS[architecture.name] for arg in ("--platform", platform)]
    python_version = runtime.name.removeprefix("python")
    return ["--implementation", "cp", "--python-version", python_version, *platforms, "--only-binary=:all:"]


@jsii.implements(ILocalBundling)
class LocalPythonBundling:
    """Copies the runtime packages, installs the locked wheels for `runtime`/`architecture`, compiles bytecode."""

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
        self.wheel_options = wheel_selection(runtime, architecture)
        self.bundle_dependencies = bundle_dependencies
        self.lock = source_dir / LAMBDA_LOCK
        # The interpreter that compiles the bytecode; None: sources only (and a warning when bundling).
        self.bytecode_python = find_python(self.python_version) if bundle_dependencies else None

    def try_bundle(self, output_dir: str, *, image: DockerImage, **_options: object) -> bool:
        """Bundle into `output_dir`; always handles the asset (True), or raises."""
        output = Path(output_dir)
        for package in LAMBDA_PACKAGES:
            shutil.copytree(self.source_dir / package, output / package, ignore=_COPY_IGNORE, dirs_exist_ok=True)
        if self.bundle_dependencies:
            self._install_dependencies(output)
            self._compile_bytecode(output)
        return True

    def hash_inputs(self) -> dict[str, str]:
        """What the bundle depends on besides the source files: the lock's digest among them."""
        return {
            "BUNDLE_DEPENDENCIES": str(self.bundle_dependencies).lower(),
            "WHEELS": " ".join(self.wheel_options),
            "LOCK_SHA256": hashlib.sha256(self.lock.read_bytes()).hexdigest() if self.lock.is_file() else "missing",
            "BYTECODE": f"cpython-{self.python_version}" if self.bytecode_python else "none",
        }

    def pip_command(self, output_dir: Path) -> list[str]:
        """The pip invocation that installs exactly the lock's wheels (hash-checked, nothing resolved)."""
        return [
            sys.executable, "-m", "pip", "install",
            "--requirement", str(self.lock),
            "--require-hashes", "--no-deps",
            "--target", str(output_dir),
            *self.wheel_options,
            "--upgrade", "--no-compile", "--quiet", "--disable-pip-version-check",
        ]  # fmt: skip

    @staticmethod
    def compile_command(output_dir: Path, python: str) -> list[str]:
        """compileall with `python` (the runtime's version): hash-based bytecode that never checks the sources."""
        return [
            python, "-m", "compileall", "-q", "-j", "0",
            "--invalidation-mode", "unchecked-hash",
            "-s", str(output_dir), "-p", _LAMBDA_TASK_ROOT,
            str(output_dir),
        ]  # fmt: skip

    def _install_dependencies(self, output_dir: Path) -> None:
        if not self.lock.is_file():
            raise BundlingError(f"{self.lock} is missing: run `make lambda-lock`")
        result = subprocess.run(self.pip_command(output_dir), capture_output=True, text=True, check=False)
        if result.returncode:
            raise BundlingError(
                f"pip could not install {self.lock} ({' '.join(self.wheel_options)}):\n{result.stderr.strip()}\n"
                "Offline? Synthesize with `-c stallwatch:bundle-dependencies=false` (not deployable). "
                "Changed lambdas/requirements.txt? Run `make lambda-lock`."
            )
        for name in _NOT_BUNDLED:
            for leftover in output_dir.glob(name):
                shutil.rmtree(leftover)

    def _compile_bytecode(self, output_dir: Path) -> None:
        if self.bytecode_python is None:
            print(
                f"stallwatch: no python{self.python_version} found (PATH, pyenv): the Lambda asset ships without "
                "bytecode, and every cold start compiles it (docs/lambdas.md)",
                file=sys.stderr,
            )
            return
        command = self.compile_command(output_dir, self.bytecode_python)
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode:
            raise BundlingError(f"compileall failed:\n{(result.stdout + result.stderr).strip()}")


def lambda_code(*, bundle_dependencies: bool) -> lambda_.Code:
    """One asset shared by the functions."""
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
            # Hashed into the asset: another lock, platform, bytecode or an offline build never reuses its cache.
            environment=bundler.hash_inputs(),
        ),
    )


@jsii.implements(ILocalBundling)
class AgentWheelBundling:
    """Builds the trainer-agent wheel from the repository (as `make dist` does, without its sdist), into the asset,
    beside the wheels of its dependencies from `lock` (with `bundle_dependencies`)."""

    def __init__(self, repo_root: Path, *, bundle_dependencies: bool, lock: Path = AGENT_LOCK) -> None:
        self.repo_root = repo_root
        self.bundle_dependencies = bundle_dependencies
        self.lock = lock

    def try_bundle(self, output_dir: str, *, image: DockerImage, **_options: object) -> bool:
        """Put the wheel into `output_dir`, and download its dependencies there; always handles the asset (True),
        or raises."""
        shutil.copy2(_built_wheel(self.repo_root, self._source_digest()), output_dir)
        if self.bundle_dependencies:
            self._download_dependencies(Path(output_dir))
        return True

    def _source_digest(self) -> str:
        """Every file the wheel is built from (as copied: no bytecode), by path and content."""
        digest = hashlib.sha256(str(self.repo_root.resolve()).encode())
        for name in AGENT_WHEEL_SOURCES:
            path = self.repo_root / name
            files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
            for file in files:
                if "__pycache__" not in file.parts and file.suffix != ".pyc":
                    digest.update(f"{file.relative_to(self.repo_root)}\0".encode() + file.read_bytes())
        return digest.hexdigest()[:16]

    def download_command(self, output_dir: Path) -> list[str]:
        """pip download of exactly the lock's wheels (hash-checked, nothing resolved)."""
        return [
            sys.executable, "-m", "pip", "download",
            "--requirement", str(self.lock), "--require-hashes", "--no-deps",
            "--dest", str(output_dir), *AGENT_WHEEL_SELECTION, "--quiet", "--disable-pip-version-check",
        ]  # fmt: skip

    def _download_dependencies(self, output_dir: Path) -> None:
        if not self.lock.is_file():
            raise BundlingError(f"{self.lock} is missing: run `make lambda-lock`")
        result = subprocess.run(self.download_command(output_dir), capture_output=True, text=True, check=False)
        if result.returncode:
            raise BundlingError(
                f"pip could not download {self.lock}:\n{result.stderr.strip()}\n"
                "Offline? Synthesize with `-c stallwatch:bundle-dependencies=false` (not deployable)."
            )

    def hash_inputs(self) -> dict[str, str]:
        """The wheel's inputs besides the package's files: its metadata (version, README, license), and the lock."""
        digest = hashlib.sha256()
        for name in AGENT_WHEEL_SOURCES[1:]:
            digest.update((self.repo_root / name).read_bytes())
        lock = hashlib.sha256(self.lock.read_bytes()).hexdigest() if self.lock.is_file() else "missing"
        return {
            "AGENT_METADATA_SHA256": digest.hexdigest(),
            "BUNDLE_DEPENDENCIES": str(self.bundle_dependencies).lower(),
            "AGENT_LOCK_SHA256": lock,
        }


@functools.cache
def _wheel_folder() -> tempfile.TemporaryDirectory[str]:
    """Where this process keeps the agent wheels it built; removed at exit."""
    return tempfile.TemporaryDirectory(prefix="stallwatch-agent-wheel-")


@functools.cache
def _built_wheel(repo_root: Path, digest: str) -> Path:
    """The trainer-agent wheel of `repo_root`'s files as they are (`digest`), built once in this process: each
    region's stack of a deployment bundles the same one."""
    wheel_dir = Path(_wheel_folder().name) / digest
    wheel_dir.mkdir(exist_ok=True)  # a failed build's leftovers are built over
    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch) / "trainer-agent"  # a copy: setuptools writes build/ and egg-info beside it
        source.mkdir()
        for name in AGENT_WHEEL_SOURCES:
            path = repo_root / name
            if path.is_dir():
                shutil.copytree(path, source / name, ignore=_COPY_IGNORE)
            else:
                shutil.copy2(path, source / name)
        command = [
            sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
            "--wheel-dir", str(wheel_dir), "--quiet", "--disable-pip-version-check", str(source),
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode:
        raise BundlingError(f"could not build the trainer-agent wheel:\n{result.stderr.strip()}")
    [wheel] = wheel_dir.glob("*.whl")
    return wheel


def agent_wheel(scope: Construct, construct_id: str, *, bundle_dependencies: bool) -> s3_assets.Asset:
    """The trainer-agent wheel as an S3 asset: a zip holding ``trainer_agent-<version>-py3-none-any.whl`` (the
    wheel's own name, which pip needs) and the wheels of its dependencies."""
    bundler = AgentWheelBundling(REPO_ROOT, bundle_dependencies=bundle_dependencies)
    return s3_assets.Asset(
        scope,
        construct_id,
        path=str(REPO_ROOT / AGENT_WHEEL_SOURCES[0]),
        exclude=ASSET_EXCLUDE,
        bundling=BundlingOptions(
            image=LAMBDA_RUNTIME.bundling_image,  # required by the API; local bundling never declines
            local=bundler,
            environment=bundler.hash_inputs(),
        ),
    )
