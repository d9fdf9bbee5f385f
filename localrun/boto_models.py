"""One parse of botocore's service models per process (the tests and the demo only).

Each `boto3.Session` builds its own botocore loader, which reads and parses every service model its clients need
(EC2's alone is 4.5 MB of JSON): a fresh session's eight clients cost 0.3 to 0.6 s of CPU, a loaded session's about
0.14 s (docs/benchmarks.md, "The suite"). A Lambda container builds its runtime once, so this is paid once there; the
tests build a runtime per test. Installed, every session of the process shares one loader per data path, and with it
the parsed models.

    boto_models.install()
"""

from __future__ import annotations

import functools

import botocore.session
from botocore.loaders import Loader, create_loader

_original = create_loader


class _SearchPaths(list[str]):
    """A loader's search paths, to which each new `boto3.Session` appends its own data folder: once is enough."""

    def append(self, path: str) -> None:
        if path not in self:
            super().append(path)


@functools.cache
def _shared(search_path_string: str | None = None) -> Loader:
    loader = _original(search_path_string)
    loader._search_paths = _SearchPaths(loader.search_paths)  # the list boto3 appends to
    return loader


def install() -> None:
    botocore.session.create_loader = _shared  # type: ignore[attr-defined]


def uninstall() -> None:
    botocore.session.create_loader = _original  # type: ignore[attr-defined]
