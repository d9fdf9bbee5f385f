"""Helpers of the distribution tests: build the wheel and sdist as `make dist` does, and require a Python by version."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stacks.interpreters import find_python

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


def require_python(version: str) -> str:
    """An interpreter of `version`; the test fails, naming how to get one, if this machine has none."""
    python = find_python(version)
    if python is None:
        pytest.fail(f"Python {version} not found (PATH, pyenv): install it, e.g. `pyenv install {version}`")
    return python
