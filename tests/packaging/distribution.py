"""Helpers of the distribution tests: build the wheel and sdist as `make dist` does, and find a Python by version."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
# A folder with an already built wheel and sdist to check instead of building (the release workflow).
DIST_ENV = "TRAINER_AGENT_DIST"


def build_distribution(shared_tmp: Path) -> Path:
    """`make dist` into a folder shared by the xdist workers: built once, under a lock (it writes egg-info here)."""
    with (shared_tmp / "dist.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        folder = shared_tmp / "dist"
        if not folder.is_dir():
            staging = shared_tmp / "dist.partial"
            shutil.rmtree(staging, ignore_errors=True)
            command = ["make", "-s", "-C", str(REPO_ROOT), "dist", f"DIST={staging}", f"PY={sys.executable}"]
            result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
            assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
            staging.rename(folder)
    return folder


def find_python(version: str) -> str:
    """An interpreter of `version` ("3.10"): this one, `python3.10` on PATH, or a pyenv install; else fail."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" == version:
        return sys.executable
    candidates = [shutil.which(f"python{version}")]
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates += sorted(str(p) for p in pyenv_root.glob(f"versions/{version}.*/bin/python{version}"))
    for candidate in filter(None, candidates):
        probe = [candidate, "-c", "import sys; print(f'{sys.version_info.major}.{sys.version_info.minor}')"]
        result = subprocess.run(probe, capture_output=True, text=True, timeout=60, check=False)
        if result.returncode == 0 and result.stdout.strip() == version:  # a pyenv shim may exist yet refuse
            return candidate
    pytest.fail(f"Python {version} not found (PATH, {pyenv_root}/versions): install it, e.g. `pyenv install {version}`")
