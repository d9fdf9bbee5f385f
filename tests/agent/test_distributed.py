"""The agent under real torchrun (CPU, gloo): SIGTERM in a hung collective, a group SIGTERM with DataLoader
workers, and throughput counted once per step under DDP, in the core agent and both callbacks."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stallwatch.aws.slack import AlertMessage, Evidence
from stallwatch.core import engine
from stallwatch.core.decision import Action, Diagnosis, JobState
from stallwatch.core.policy import Policy
from tests.agent.distributed_worker import STALL_FLOOR_S
from tests.core.signals_builder import SignalsBuilder
from trainer_agent.contract import STACKS_MARKER
from trainer_agent.sigterm import FLUSH_S
from trainer_agent.stack_dumps import POLL_S
from trainer_agent.window import TERA

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("distributed_worker.py")
START_S = 120.0
"""Starting torchrun and importing torch (and transformers) on a loaded 2-core machine."""
STOP_S = 20.0
"""torchrun escalates to SIGKILL 30 s after its SIGTERM; a stop must be over well before."""
SETTLE_S = 0.5
"""Time for rank 0 to be inside the collective after it announced it."""

pytestmark = pytest.mark.slow


class Torchrun:
    """`torchrun distributed_worker.py MODE OUT` on one host (N ranks), or as one of 2 hosts (node, port)."""

    def __init__(
        self, out: Path, mode: str, nproc: int = 2, node: tuple[int, int] | None = None, env: dict | None = None
    ) -> None:
        self.out = out
        given = env or {}
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RANK", "WORLD_SIZE", "LOCAL_RANK"))}
        env |= given | {"PYTHONPATH": str(ROOT), "STALLWATCH_JOB_NAME": "ddp-job", "OMP_NUM_THREADS": "1"}
        env |= {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}"]
        if node is None:
            command.append("--standalone")
        else:
            node_rank, port = node
            env["SM_CURRENT_HOST"] = f"algo-{node_rank + 1}"
            command += ["--nnodes=2", f"--node_rank={node_rank}", "--master_addr=127.0.0.1", f"--master_port={port}"]
        self.log_path = out / f"torchrun-{node[0] if node else 0}.log"
        self.log = self.log_path.open("w")
        self.process = subprocess.Popen(
            [*command, str(WORKER), mode, str(out)], stdout=self.log, stderr=subprocess.STDOUT, env=env
        )

    def wait_for_file(self, name: str) -> Path:
        path, deadline = self.out / name, time.monotonic() + START_S
        while not path.exists():
            assert self.process.poll() is None, self.output()
            assert time.monotonic() < deadline, f"{name} never appeared: {self.output()}"
            time.sleep(0.1)
        return path

    def wait_for_lines(self, marker: str, count: int) -> list[str]:
        """The first `count` lines of its log holding `marker` (the ranks' stdout), waiting for them."""
        deadline = time.monotonic() + START_S
        while len(found := [line for line in self.output(None).splitlines() if marker in line]) < count:
            assert self.process.poll() is None, self.output()
            assert time.monotonic() < deadline, f"{count} lines with {marker} never appeared: {self.output()}"
            time.sleep(0.2)
        return found[:count]

    def finish(self, timeout_s: float = START_S) -> int:
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError(f"torchrun still running after {timeout_s} s: {self.output()}") from None

    def output(self, last: int | None = 3000) -> str:
        self.log.flush()
        text = self.log_path.read_text()
        return text if last is None else text[-last:]

    def records(self, name: str = "windows.jsonl", scope: str = "job") -> list[dict]:
        path = self.out / name
        lines = path.read_text().splitlines() if path.exists() else []
        return [record for line in lines if (record := json.loads(line))["scope"] == scope]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("blocked_in", ["backward", "recv"])
def test_sigterm_in_a_hung_collective_flushes_within_2_s_and_ends_by_sigterm(tmp_path, blocked_in):
    # Given 2 hosts x 1 rank (both report, so both handle SIGTERM): rank 0 blocked in DDP's backward
    # all_reduce or in a recv, rank 1 in a recv, neither ever matched, after two completed steps
    port = free_port()
    hosts = [Torchrun(tmp_path, f"hang-{blocked_in}", nproc=1, node=(node, port)) for node in (0, 1)]
    pids = [int(host.wait_for_file(f"blocked-{rank}").read_text()) for rank, host in enumerate(hosts)]
    time.sleep(SETTLE_S)

    # When the job is stopped: each host's launcher gets SIGTERM and passes it on to its worker
    sent = time.time()
    for host in hosts:
        host.process.send_signal(signal.SIGTERM)
    stopped = [host.finish(STOP_S) for host in hosts]

    # Then each rank wrote its final window within 2 s and ended by SIGTERM at once, as it does without the
    # agent (torchrun needed no SIGKILL, which comes 30 s on): rank 0 its job window with the 2 steps
    assert all(code != 0 for code in stopped)
    (window,) = hosts[0].records("windows-0.jsonl")
    assert (window["Steps"], window["Step"]) == (2, 2)
    for rank, host in enumerate(hosts):
        (beat,) = host.records(f"windows-{rank}.jsonl", scope="host")
        assert (beat["host"], beat["Heartbeat"]) == (f"algo-{rank + 1}", 1)
        assert beat["t"] - sent < FLUSH_S
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_group_sigterm_with_dataloader_workers_keeps_the_final_window_of_every_sink(tmp_path):
    # Given a loop fed by two forked DataLoader workers, with a sink that takes a second per window
    run = Torchrun(tmp_path, "dataloader", nproc=1)
    run.wait_for_file("running")

    # When torchrun is stopped: it sends SIGTERM to the worker's whole process group at once, so the
    # DataLoader workers die while the trainer flushes (torch's SIGCHLD handler raises in the trainer)
    run.process.send_signal(signal.SIGTERM)
    run.finish(STOP_S)

    # Then the final window reached both sinks, the slow one included
    (window,) = run.records()
    assert window["Step"] >= 5
    (slow,) = run.records("slow.jsonl")
    assert slow["Step"] == window["Step"]


@pytest.mark.parametrize("mode", ["ddp", "fsdp", "hf", "lightning"])
def test_ddp_throughput_counts_each_token_and_sample_once(tmp_path, mode):
    # Given 2 DDP ranks accumulating 2 micro-batches per optimizer step, each counting what it consumed
    run = Torchrun(tmp_path, mode)

    # When they train 4 steps with the agent (core loop around DDP or FSDP2, Hugging Face or Lightning callback)
    code = run.finish()

    # Then the job's window (exactly 1000 s long on the agent's clock) carries the ranks' summed counts
    assert code == 0, run.output()
    expected = json.loads((tmp_path / "expected.json").read_text())
    (window,) = run.records()
    assert window["Steps"] == 4
    assert window["TokensPerSecond"] * 1000.0 == pytest.approx(expected["tokens"], rel=1e-9)
    assert window["SamplesPerSecond"] * 1000.0 == pytest.approx(expected["samples"], rel=1e-9)
    per_device_flops = window["TFLOPsPerAccelerator"] * TERA * 1000.0
    assert per_device_flops * expected["world_size"] == pytest.approx(1e6 * expected["tokens"], rel=1e-9)


def source_line(needle: str) -> str:
    """``distributed_worker.py:N``: where the worker's source holds `needle`."""
    lines = WORKER.read_text().splitlines()
    return f"{WORKER.name}:{next(n for n, line in enumerate(lines, start=1) if needle in line)}"


@pytest.mark.parametrize(
    ("mode", "recorder", "odd", "where"),
    [
        ("stall-loader", True, 1, source_line("time.sleep(BLOCK_S)  # the stuck read")),
        ("stall-checkpoint", False, 0, source_line('with path.open("wb") as checkpoint')),
    ],
)
def test_a_stall_leaves_every_ranks_stacks_and_the_alert_names_the_odd_rank_out(tmp_path, mode, recorder, odd, where):
    # Given 2 ranks that each step with an all_reduce, the agent's stack dumps on their stdout, then one rank stuck
    # (rank 1 in its data loader's read, or rank 0 alone writing a checkpoint) while the other waits in the all_reduce;
    # the flight recorder on for the first (gloo's records the collectives' sequence numbers)
    run = Torchrun(tmp_path, mode, env={"TORCH_NCCL_TRACE_BUFFER_SIZE": "100"} if recorder else {})

    # When both ranks' stacks are in the log, and the job is stopped
    lines = run.wait_for_lines(STACKS_MARKER, 2)
    run.process.send_signal(signal.SIGTERM)
    assert run.finish(STOP_S) != 0

    # Then each rank wrote one line, once its steps had stopped for the threshold (their steps take milliseconds:
    # the floor), and SIGTERM ended them without a second one
    records = [json.loads(line[line.index("{") :]) for line in lines]
    assert sorted(r["Rank"] for r in records) == [0, 1]
    assert all(STALL_FLOOR_S <= r["StalledSeconds"] <= STALL_FLOOR_S + 3 * POLL_S for r in records)
    assert run.output(None).count(STACKS_MARKER) == 2
    if recorder:
        assert {r["Rank"]: r["Collective"]["seq"] for r in records} == {0: 4, 1: 3}

    # And the engine, deciding on a hung job whose log holds these lines, names the odd rank and its file:line in the
    # decision's reasons and evidence, and in the Slack alert
    onset = 3600.0
    builder = (
        SignalsBuilder(hosts=1)
        .progress(0, onset)
        .no_progress(onset, onset + 20 * 60)
        .gpu(0, onset + 20 * 60, 99.0)
        .stacks((onset + r["StalledSeconds"], line) for r, line in zip(records, lines, strict=True))
    )
    now = onset + 16 * 60
    signals = builder.build(now)
    decision = engine.decide(
        signals, Policy(stop_requires_tag=False).for_job({"stallwatch:mode": "enforce"}), JobState(), now
    )
    assert (decision.diagnosis, decision.action) == (Diagnosis.HANG, Action.WARN)
    assert decision.evidence["stacks"]["named"] == [odd]
    (summary,) = [reason for reason in decision.reasons if f"rank {odd} on" in reason]
    assert where in summary
    assert "1 rank in all_reduce" in summary
    message = AlertMessage(decision, signals.facts, Evidence.of(decision, signals, None)).render()
    assert f"rank {odd} on" in json.dumps(message)
    assert where in json.dumps(message)
