"""Cold import of the Lambda handlers from the asset, with and without its precompiled bytecode, side by side.

    python bench/lambda_cold_import.py             # ~2 min on 2 cores; needs PyPI (wheels) and a CPython 3.12
    python bench/lambda_cold_import.py --runs 30

The asset is built by the real bundler (stacks/bundling.py) for this machine's architecture (arm64 wheels cannot
load on x86_64; every Python file is the same), from a lock resolved here the way `make lambda-lock` resolves it.
The same asset is then copied without its `__pycache__` folders: the asset as it was before bytecode was
precompiled. Each run is a fresh python3.12 process with PYTHONDONTWRITEBYTECODE=1 (/var/task is read-only: nothing
is cached between cold starts) and the Lambda environment variables Powertools looks at, importing one handler
module; boto3 comes from a folder with its own bytecode, as the runtime's does. Runs alternate between the two
assets; the figure is the ratio of the medians of the import time measured inside the process.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "lambdas")]  # a repository tool: run from a checkout
from aws_cdk import DockerImage  # noqa: E402
from aws_cdk import aws_lambda as lambda_  # noqa: E402

from stacks.bundling import LocalPythonBundling, wheel_selection  # noqa: E402
from stacks.constants import (  # noqa: E402
    LAMBDA_LOCK,
    LAMBDA_PACKAGES,
    LAMBDA_REQUIREMENTS,
    LAMBDA_RUNTIME,
    LAMBDA_SOURCE_DIR,
    ON_ALARM_HANDLER,
    ON_JOB_STATE_HANDLER,
    SLACK_INTERACTIONS_HANDLER,
    SWEEPER_HANDLER,
)
from stacks.interpreters import find_python  # noqa: E402
from stacks.lock import lock_text, resolve  # noqa: E402

HANDLERS = [h.rsplit(".", 1)[0] for h in (ON_ALARM_HANDLER, ON_JOB_STATE_HANDLER, SWEEPER_HANDLER,
                                          SLACK_INTERACTIONS_HANDLER)]  # fmt: skip
LAMBDA_ENV = {
    "AWS_LAMBDA_FUNCTION_NAME": "stallwatch-bench",
    "AWS_EXECUTION_ENV": f"AWS_Lambda_{LAMBDA_RUNTIME.name}",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
    "POWERTOOLS_SERVICE_NAME": "stallwatch",
    "PYTHONDONTWRITEBYTECODE": "1",
}
TIMED_IMPORT = (
    "import time, importlib; t = time.perf_counter(); importlib.import_module({!r}); print(time.perf_counter() - t)"
)


def build_assets(work: Path, python: str) -> tuple[Path, Path, Path]:
    """(asset with bytecode, the same without, boto3 as the runtime has it) for this machine's architecture."""
    architecture = lambda_.Architecture.ARM_64 if platform.machine() == "aarch64" else lambda_.Architecture.X86_64
    source = work / "source"
    source.mkdir()
    for package in LAMBDA_PACKAGES:
        (source / package).symlink_to(LAMBDA_SOURCE_DIR / package)
    options = wheel_selection(LAMBDA_RUNTIME, architecture)
    report = resolve(LAMBDA_SOURCE_DIR / LAMBDA_REQUIREMENTS, options)
    (source / LAMBDA_LOCK).write_text(lock_text(report, header=f"bench lock for {architecture.name}"))
    bundler = LocalPythonBundling(source, runtime=LAMBDA_RUNTIME, architecture=architecture, bundle_dependencies=True)
    assert bundler.bytecode_python, "no python3.12 found"
    compiled = work / "compiled"
    compiled.mkdir()
    bundler.try_bundle(str(compiled), image=DockerImage.from_registry("unused"))
    sources_only = work / "sources-only"
    shutil.copytree(compiled, sources_only, ignore=shutil.ignore_patterns("__pycache__"))
    boto3_version = next(
        line.split("==")[1].strip()
        for line in (ROOT / "requirements-dev.txt").read_text().splitlines()
        if line.startswith("boto3==")
    )
    runtime = work / "runtime"
    subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target", str(runtime),
         f"boto3=={boto3_version}"],
        check=True,
    )  # fmt: skip
    return compiled, sources_only, runtime


def time_import(python: str, asset: Path, runtime: Path, module: str) -> float:
    env = {**os.environ, **LAMBDA_ENV, "PYTHONPATH": f"{asset}{os.pathsep}{runtime}"}
    result = subprocess.run(
        [python, "-c", TIMED_IMPORT.format(module)], env=env, cwd=asset, capture_output=True, text=True, check=True
    )
    return float(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="runs per handler and asset")
    args = parser.parse_args()
    python = find_python(LAMBDA_RUNTIME.name.removeprefix("python"))
    if python is None:
        sys.exit("no python3.12 found (PATH, pyenv)")
    with tempfile.TemporaryDirectory() as scratch:
        compiled, sources_only, runtime = build_assets(Path(scratch), python)
        print(f"python {python}, {platform.machine()}, {args.runs} runs per handler and asset\n")
        print(f"{'handler':34} {'sources only':>13} {'bytecode':>10} {'ratio':>7}")
        all_before, all_after = [], []
        for module in HANDLERS:
            before, after = [], []
            for run in range(args.runs):
                order = [(sources_only, before), (compiled, after)]
                for asset, samples in order if run % 2 == 0 else order[::-1]:
                    samples.append(time_import(python, asset, runtime, module))
            b, a = statistics.median(before), statistics.median(after)
            all_before += before
            all_after += after
            print(f"{module:34} {b * 1000:10.0f} ms {a * 1000:7.0f} ms {a / b:7.2f}")
        b, a = statistics.median(all_before), statistics.median(all_after)
        print(f"{'all (median)':34} {b * 1000:10.0f} ms {a * 1000:7.0f} ms {a / b:7.2f}")
        size = sum(p.stat().st_size for p in compiled.rglob("*") if p.is_file())
        size_before = sum(p.stat().st_size for p in sources_only.rglob("*") if p.is_file())
        print(f"\nasset unzipped: {size_before / 1e6:.1f} MB sources only, {size / 1e6:.1f} MB with bytecode")


if __name__ == "__main__":
    main()
