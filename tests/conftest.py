"""Test-wide guards (no test may reach a real AWS account), moto's images, each worker's garbage collector, and the
suite's order: slow tests first."""

from __future__ import annotations

import gc
import os
from collections.abc import Generator
from pathlib import Path

import pytest

from localrun import boto_models

# moto's EC2 builds every image it knows at each region backend's start and reset: about 1,300 in us-east-1 with its
# latest and ECS-optimised lists, a tenth of the suite's moto time. The suite launches from one of its built-in images:
# moto loads only the few in this file (read as moto's EC2 is imported: nothing above imports it).
os.environ.setdefault("MOTO_AMIS_PATH", str(Path(__file__).parent / "fixtures" / "moto_images.json"))
boto_models.install()  # every boto3 session of a worker parses botocore's service models once


# A worker's heap is large (botocore's models, moto's backends, the collected tests) and the garbage collector walked
# it all at each full collection, hundreds of times a run: 18 % of the CPU of four runtime and offline modules.
# Collection only imports, so the collector waits for its end; then what is loaded is kept out of every later
# collection, and the youngest generation is collected every 10,000 allocations instead of 700 (docs/benchmarks.md,
# "The suite").
GC_THRESHOLDS = (10_000, 10, 10)


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session) -> Generator[None, object, object]:
    gc.disable()
    try:
        return (yield)
    finally:
        gc.collect()
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
        gc.enable()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each worker's share starts with its slow tests. `make test` runs `--dist worksteal`, which hands each worker one
    contiguous block of this order and lets an idle worker steal from the end of a busy one's: so the slow tests (the
    demos, the real Slurm, training subprocesses) are dealt round-robin to the block heads, where they start at once
    side by side, and the fast ones, a module together, fill each block's end, where they can be stolen."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    slow = [item for item in items if item.get_closest_marker("slow")]
    fast = [item for item in items if not item.get_closest_marker("slow")]
    share = -(-len(fast) // workers)
    items[:] = [t for w in range(workers) for t in slow[w::workers] + fast[w * share : (w + 1) * share]]


@pytest.fixture(autouse=True)
def _no_real_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake credentials and a fixed region for every test; a test that forgets moto fails instead of calling AWS."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_SECURITY_TOKEN", "testing")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
