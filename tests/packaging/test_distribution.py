"""The trainer-agent distribution: what the wheel and sdist hold, and that the wheel installs and runs in a clean
venv, without torch, on the oldest and the newest Python it declares.

The artifacts are built here as `make dist` builds them, or taken from `$TRAINER_AGENT_DIST` (the release
workflow checks the very files it uploads: `make dist wheel-check`, docs/release.md).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

import trainer_agent
from tests.packaging.distribution import DIST_ENV, build_distribution, require_python

REPO_ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
SMOKE = Path(__file__).with_name("agent_smoke.py")
_CLASSIFIER = re.compile(r"^Programming Language :: Python :: (3\.\d+)$")
DECLARED_PYTHONS = sorted(
    (m[1] for c in PYPROJECT["classifiers"] if (m := _CLASSIFIER.match(c))), key=lambda v: tuple(map(int, v.split(".")))
)


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(wheel, sdist)."""
    given = os.environ.get(DIST_ENV)
    # Under xdist each worker has its own basetemp below one for the run: build once, in that one.
    run_tmp = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        run_tmp = run_tmp.parent
    folder = Path(given) if given else build_distribution(run_tmp)
    [wheel] = folder.glob("trainer_agent-*.whl")
    [sdist] = folder.glob("trainer_agent-*.tar.gz")
    return wheel, sdist


def _metadata(wheel: Path) -> tuple[list[str], dict[str, list[str]]]:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        [metadata] = [n for n in names if n.endswith(".dist-info/METADATA")]
        message = Parser().parsestr(archive.read(metadata).decode())
    fields: dict[str, list[str]] = {}
    for key, value in message.items():
        fields.setdefault(key, []).append(value)
    return names, fields


def test_the_declared_pythons_match_requires_python() -> None:
    oldest = DECLARED_PYTHONS[0]
    assert PYPROJECT["requires-python"] == f">={oldest}"
    assert len(DECLARED_PYTHONS) >= 2


def test_the_wheel_holds_the_agent_its_license_and_extras(dist: tuple[Path, Path]) -> None:
    # Given the built wheel
    wheel, _ = dist
    names, fields = _metadata(wheel)
    # Then it holds the agent package and its dist-info only, with the repository's LICENSE
    assert all(n.startswith(("trainer_agent/", "trainer_agent-")) for n in names), names
    [license_file] = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read(license_file) == (REPO_ROOT / "LICENSE").read_bytes()
    # And its metadata declares the license, the Pythons, no hard dependency, and the extras
    assert fields["License-Expression"] == ["Apache-2.0"]
    assert fields["Requires-Python"] == [f">={DECLARED_PYTHONS[0]}"]
    assert {"hf", "lightning", "aws", "nvml", "torch"} <= set(fields["Provides-Extra"])
    requirements = fields["Requires-Dist"]
    assert all("extra ==" in r for r in requirements), requirements
    assert any(r.startswith("transformers") and 'extra == "hf"' in r for r in requirements)
    assert any(r.startswith("lightning") and 'extra == "lightning"' in r for r in requirements)


def test_the_sdist_holds_the_agent_and_license_but_no_control_plane_or_tests(dist: tuple[Path, Path]) -> None:
    _, sdist = dist
    with tarfile.open(sdist) as archive:
        names = [name.split("/", 1)[1] for name in archive.getnames() if "/" in name]
        root = archive.getnames()[0].split("/")[0]
        license_text = archive.extractfile(f"{root}/LICENSE").read()  # type: ignore[union-attr]
    assert license_text == (REPO_ROOT / "LICENSE").read_bytes()
    assert "trainer_agent/agent.py" in names
    python_files = [n for n in names if n.endswith(".py")]
    assert all(n.startswith("trainer_agent/") for n in python_files), python_files
    for outside in ("tests/", "lambdas/", "stacks/", "localrun/", "deploy/", "app.py", "cdk.json"):
        assert not [n for n in names if n.startswith(outside)], outside


@pytest.mark.slow
@pytest.mark.parametrize("version", [DECLARED_PYTHONS[0], DECLARED_PYTHONS[-1]], ids=["oldest", "newest"])
def test_the_wheel_installs_and_runs_in_a_clean_venv_without_torch(
    version: str, dist: tuple[Path, Path], tmp_path: Path
) -> None:
    # Given a clean venv of the declared Python, with only the wheel installed (it needs nothing, so no index)
    python = require_python(version)
    # Nothing of the repository or the dev venv may leak in (PYTHONPATH would show pip the tree's egg-info).
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    venv = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], env=env, check=True, capture_output=True, timeout=120)
    venv_python = venv / "bin" / "python"
    install = [str(venv_python), "-m", "pip", "install", "--no-index", "--disable-pip-version-check", str(dist[0])]
    subprocess.run(install, env=env, check=True, capture_output=True, timeout=120)
    # When the smoke script imports every module and runs a short loop, outside the repository
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    shutil.copy(SMOKE, workdir / SMOKE.name)
    result = subprocess.run(
        [str(venv_python), SMOKE.name], cwd=workdir, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    # Then it ran on that Python, without torch or boto3, and the agent reported the steps
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["python"] == version
    assert (report["torch_installed"], report["boto3_installed"]) == (False, False)
    assert report["version"] == trainer_agent.__version__
    assert any(path.endswith("licenses/LICENSE") for path in report["files"])
    [job] = [r for r in report["records"] if r["scope"] == "job"]
    assert (job["job"], job["Step"], job["Loss"]) == ("wheel-smoke", 3.0, 1.5)
    assert job["TFLOPsPerAccelerator"] > 0
    assert any('"JobName": "wheel-smoke"' in line for line in report["emf_lines"])
    assert any('"JobName": "wheel-smoke-auto"' in line for line in report["auto_sink_output"])


def test_the_wheel_is_versioned_as_the_agent_says(dist: tuple[Path, Path]) -> None:
    _, fields = _metadata(dist[0])
    assert fields["Version"] == [trainer_agent.__version__]
    assert dist[0].name == f"trainer_agent-{trainer_agent.__version__}-py3-none-any.whl"


def test_the_control_plane_wheel_installs_stallwatch_alone_not_a_top_level_handlers(tmp_path: Path) -> None:
    # Given the control plane's wheel, built as `pip install ./lambdas` builds it
    import stallwatch

    source = tmp_path / "lambdas"  # a copy: setuptools writes build/ and egg-info beside the sources
    shutil.copytree(REPO_ROOT / "lambdas", source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    command = ["pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(source)]
    built = subprocess.run([sys.executable, "-m", *command], capture_output=True, text=True, timeout=300, check=False)
    assert built.returncode == 0, built.stderr[-2000:]
    [wheel] = tmp_path.glob("stallwatch-*.whl")

    # Then it holds the stallwatch package and its dist-info only, at the version the package says
    names, fields = _metadata(wheel)
    top_level = {name.split("/", 1)[0] for name in names}
    assert top_level == {"stallwatch", f"stallwatch-{stallwatch.__version__}.dist-info"}
    assert fields["Version"] == [stallwatch.__version__]


def test_both_packages_say_their_version() -> None:
    import stallwatch

    for module, expected in (("stallwatch.offline.cli", "stallwatch"), ("trainer_agent", "trainer-agent")):
        shown = subprocess.run(
            [sys.executable, "-m", module, "--version"], capture_output=True, text=True, timeout=60, check=False
        )
        version = stallwatch.__version__ if expected == "stallwatch" else trainer_agent.__version__
        assert (shown.returncode, shown.stdout.strip()) == (0, f"{expected} {version}")
