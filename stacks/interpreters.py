"""Finds a CPython of a given version on this machine, without importing CDK (the packaging tests use it too).

find_python("3.12")  # this interpreter, `python3.12` on PATH, or a pyenv install; None if there is none
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

_PROBE = "import sys; print(f'{sys.version_info.major}.{sys.version_info.minor}')"


def find_python(version: str) -> str | None:
    """The path of a working interpreter of `version` ("3.12"), or None."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" == version:
        return sys.executable
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates = [shutil.which(f"python{version}")]
    candidates += sorted(str(path) for path in pyenv_root.glob(f"versions/{version}.*/bin/python{version}"))
    for candidate in filter(None, candidates):
        result = subprocess.run([candidate, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=False)
        if result.returncode == 0 and result.stdout.strip() == version:  # a pyenv shim may exist, yet refuse
            return candidate
    return None
