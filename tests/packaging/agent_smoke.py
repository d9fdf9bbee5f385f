"""Run by a clean venv's Python with only the trainer-agent wheel installed (tests/packaging/test_distribution.py).

Imports every module of the wheel, runs a short loop into a JSONL sink and the default sinks, and prints one JSON
report on stdout for the test to check. Exits non-zero on any failure.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import io
import json
import pkgutil
import sys
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path

# The integrations import their framework on purpose (they raise ImportError naming the extra to install).
FRAMEWORK_MODULES = ("trainer_agent.integrations.huggingface", "trainer_agent.integrations.lightning")
STEPS = 3


def _import_every_module() -> list[str]:
    import trainer_agent

    names = [info.name for info in pkgutil.walk_packages(trainer_agent.__path__, "trainer_agent.")]
    for name in names:
        if name not in FRAMEWORK_MODULES:
            importlib.import_module(name)
    return names


def _run_loop(path: Path) -> tuple[list[dict[str, object]], str]:
    from trainer_agent import EmfStdoutSink, JsonlSink, TrainerAgent

    emf = io.StringIO()
    agent = TrainerAgent(
        job_name="wheel-smoke",
        flops_per_step=1e9,
        peak_tflops=100.0,
        total_steps=STEPS,
        sinks=[JsonlSink(path), EmfStdoutSink(emf)],
        handle_sigterm=False,
    )
    for _ in range(STEPS):
        with agent.step(tokens=128, samples=4):
            time.sleep(0.01)
        agent.record(loss=1.5)
    agent.close()
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return records, emf.getvalue()


def _default_sinks_without_boto3() -> str:
    """`sinks="auto"` with no boto3 falls back to the EMF line on stdout."""
    from trainer_agent import TrainerAgent

    captured = io.StringIO()
    with redirect_stdout(captured):
        agent = TrainerAgent(job_name="wheel-smoke-auto", handle_sigterm=False)
        with agent.step():
            pass
        agent.close()
    return captured.getvalue()


def main() -> None:
    modules = _import_every_module()
    with tempfile.TemporaryDirectory() as folder:
        records, emf = _run_loop(Path(folder) / "windows.jsonl")
    distribution = importlib.metadata.distribution("trainer-agent")
    report = {
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "torch_installed": importlib.util.find_spec("torch") is not None,
        "boto3_installed": importlib.util.find_spec("boto3") is not None,
        "modules": modules,
        "records": records,
        "emf_lines": emf.splitlines(),
        "auto_sink_output": _default_sinks_without_boto3().splitlines(),
        "version": distribution.version,
        "files": [str(path) for path in distribution.files or []],
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
