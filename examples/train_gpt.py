"""Train a small GPT with the Stallwatch agent, on one process or many (DDP), optionally injecting the faults
Stallwatch detects.

    python examples/train_gpt.py --steps 60 --interval 5
    torchrun --nproc_per_node=2 examples/train_gpt.py --steps 60 --checkpoint-dir /tmp/ckpt   # DDP, one checkpoint
    python examples/train_gpt.py --steps 0 --fault hang --fault-after 20      # stops stepping, keeps logging (60 min)
    python examples/train_gpt.py --fault crash --fault-after 10               # NCCL/CUDA error, exit 1
    python examples/train_gpt.py --checkpoint-dir /opt/ml/checkpoints --checkpoint-every 100   # resumable

The process group comes from whichever launcher started the process (`distributed.py`: torchrun, SageMaker's
torch_distributed, srun, mpirun); the model trains on this process's GPU when there is one (NCCL), else on the CPU
(Gloo), wrapped in DistributedDataParallel when there are several processes, each reading its own batches.

Checkpoints (`checkpoints.py`) go to --checkpoint-dir (SageMaker syncs CheckpointConfig's S3 URI there), else to
STALLWATCH_CHECKPOINT_URI (an s3:// prefix or a folder; deploy/ec2/user-data.sh sets it): every --checkpoint-every
steps global rank 0 alone writes it, whole or not at all, and every rank of a run that finds one resumes from its
step, as a job resumed or restarted in place by Stallwatch does.

Faults: hang (a collective that never returns, with NCCL-like watchdog lines on stderr), crash (a fatal NCCL/CUDA
error and traceback, non-zero exit), checkpoint (a declared phase, then training resumes), idle (no steps and no
output; the process stays alive). SIGTERM flushes the agent's last window and exits 0, as SageMaker's
StopTrainingJob expects; so does --max-minutes (60 by default), whatever the run is doing then, so that no run of
the example goes on unbounded unless asked (--max-minutes 0).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import IO

import torch
from checkpoints import CheckpointStore, checkpoint_store
from distributed import Placement
from gpt import GPT, CharBatches, GPTConfig, local_text
from torch.nn.parallel import DistributedDataParallel

from trainer_agent import CloudWatchSink, EmfStdoutSink, JsonlSink, Sink, StallDumps, TrainerAgent
from trainer_agent.flops import matmul_param_count, transformer_flops_per_token
from trainer_agent.sinks import module_available

FAULTS = ("none", "hang", "crash", "checkpoint", "idle")
CHECKPOINT_URI_ENV = "STALLWATCH_CHECKPOINT_URI"
RESUMED_MARKER = "resumed from checkpoint at step"
HANG_LOG_EVERY_S = 5.0
DEFAULT_MAX_MINUTES = 60.0
CRASH_LOG = (
    "[rank0]:[E ProcessGroupNCCL.cpp:1577] [PG 0 Rank 0] Process group watchdog thread terminated with exception: "
    "CUDA error: an illegal memory access was encountered\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)
CRASH_ERROR = (
    "NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled cuda error "
    "(run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\n"
    "ncclUnhandledCudaError: Call to CUDA function failed.\n"
    "Last error:\nCuda failure 'an illegal memory access was encountered'"
)


class QuietableStream:
    """stdout that can be silenced (the idle fault stops all output while the agent keeps publishing)."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream, self.silenced = stream, False
        # The agent's sink thread writes windows while the loop writes lines; re-entrant for signal handlers.
        self._lock = threading.RLock()

    def write(self, text: str) -> int:
        with self._lock:
            return len(text) if self.silenced else self.stream.write(text)

    def flush(self) -> None:
        with self._lock:
            if not self.silenced:
                self.stream.flush()

    def line(self, line: str) -> None:
        """Write one whole line (print() writes text and newline separately: the agent's line could fall between)."""
        with self._lock:
            if not self.silenced:
                self.stream.write(line + "\n")
                self.stream.flush()

    def last_line(self, line: str) -> None:
        """Write a final line and go silent, with no other write in between."""
        with self._lock:
            self.stream.write(line + "\n")
            self.stream.flush()
            self.silenced = True


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="steps to train; 0 runs until stopped")
    parser.add_argument("--interval", type=float, default=60.0, help="the agent's emission window, seconds")
    parser.add_argument("--fault", choices=FAULTS, default="none")
    parser.add_argument("--fault-after", type=int, default=20, help="steps before the fault")
    parser.add_argument("--checkpoint-budget", type=float, default=60.0, help="declared checkpoint budget, s")
    parser.add_argument("--checkpoint-seconds", type=float, default=10.0, help="how long the checkpoint takes, s")
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        help=f"save checkpoints here and resume from one found here (default: ${CHECKPOINT_URI_ENV})",
    )
    parser.add_argument("--checkpoint-every", type=int, default=100, help="steps between checkpoints")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--log-every", type=int, default=1, help="progress line every N steps")
    parser.add_argument("--jsonl", help="also write the agent's windows to this JSONL file")
    parser.add_argument(
        "--dump-after",
        type=float,
        default=StallDumps().floor_s,
        help="the agent writes every thread's stack once no step has ended for this many seconds (and 3 step times)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=DEFAULT_MAX_MINUTES,
        help="end the run after this long, whatever it is doing (a fault too); 0: never",
    )
    args = parser.parse_args(argv)
    if args.steps < 0 or args.fault_after < 0 or args.log_every < 1 or args.checkpoint_every < 1:
        parser.error("--steps and --fault-after must be >= 0, --log-every and --checkpoint-every >= 1")
    if args.max_minutes < 0:
        parser.error("--max-minutes must be >= 0")
    return args


def build_sinks(stdout: QuietableStream, jsonl: str | None) -> list[Sink]:
    """The agent's "auto" sinks, with the stdout line on a stream the idle fault can silence."""
    sinks: list[Sink] = [EmfStdoutSink(stream=stdout)]  # type: ignore[arg-type]
    if module_available("boto3"):
        sinks.append(CloudWatchSink(require_credentials=True))
    if jsonl:
        sinks.append(JsonlSink(jsonl))
    return sinks


def hang_forever() -> None:
    """Block like a collective that never completes, while a watchdog keeps logging (NCCL's does)."""

    def watchdog() -> None:
        waited_ms = 0
        while True:
            time.sleep(HANG_LOG_EVERY_S)
            waited_ms += int(HANG_LOG_EVERY_S * 1000)
            print(
                f"[rank0]:[W ProcessGroupNCCL.cpp:1250] Watchdog: still waiting for collective ALLREDUCE "
                f"(SeqNum=1042, OpType=ALLREDUCE, NumelIn=1, NumelOut=1) after {waited_ms} ms",
                file=sys.stderr,
                flush=True,
            )

    threading.Thread(target=watchdog, name="nccl-watchdog", daemon=True).start()
    while True:
        time.sleep(1.0)


def crash() -> None:
    sys.stderr.write(CRASH_LOG)
    sys.stderr.flush()
    raise RuntimeError(CRASH_ERROR)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_cleanly)  # installed first: the agent flushes, then chains to it
    if args.max_minutes:
        signal.signal(signal.SIGALRM, _out_of_time)
        signal.setitimer(signal.ITIMER_REAL, args.max_minutes * 60)
    placement = Placement.from_environment()
    device = placement.start()
    try:
        return train(args, placement, device)
    finally:
        placement.stop()


def train(args: argparse.Namespace, placement: Placement, device: torch.device) -> int:
    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    config = GPTConfig()
    model = GPT(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    trained = model
    if placement.distributed:  # gradients averaged over the ranks in backward
        trained = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    batches = CharBatches(local_text(), args.batch_size, config.seq_len, seed=args.seed + placement.rank)
    flops_per_token = transformer_flops_per_token(
        n_params=matmul_param_count(model),
        n_layers=config.n_layers,
        n_heads=config.n_heads,
        head_dim=config.head_dim,
        seq_len=config.seq_len,
    )
    stdout = QuietableStream(sys.stdout)
    speaks = placement.local_rank == 0  # one process per host writes the progress lines
    # Global rank 0 of the process group saves; a process without a group (the local demo's hosts) is its own job.
    writes_checkpoints = placement.rank == 0 or not placement.distributed
    agent = TrainerAgent(
        flops_per_token=flops_per_token,
        peak_tflops=None,  # from the device table on GPUs; on the CPU MFU is absent (and the log says why)
        total_steps=args.steps or None,
        interval_s=args.interval,
        sinks=build_sinks(stdout, args.jsonl),
        stall_dumps=StallDumps(floor_s=args.dump_after),
    )
    tokens = args.batch_size * config.seq_len
    store = checkpoint_store(args.checkpoint_dir or os.environ.get(CHECKPOINT_URI_ENV))
    step = load_checkpoint(store, model, optimizer, stdout)
    stdout.line(f"rank {placement.rank} of {placement.world_size} ({placement.launcher}) on {device}, from step {step}")
    try:
        while args.steps == 0 or step < args.steps:
            if args.fault != "none" and step == args.fault_after:
                inject(args, agent, stdout)
            started = time.perf_counter()
            x, y = (t.to(device, non_blocking=True) for t in batches.next())
            with agent.step(tokens=tokens, samples=args.batch_size, step=step + 1):
                _, loss = trained(x, y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            agent.record(loss=loss)
            step += 1
            if speaks and step % args.log_every == 0:
                elapsed_ms = (time.perf_counter() - started) * 1000
                stdout.line(f"step {step} loss {loss.item():.4f} {elapsed_ms:.1f} ms/step")
            if store is not None and step % args.checkpoint_every == 0 and writes_checkpoints:
                with agent.phase("checkpoint", budget_s=args.checkpoint_budget):
                    save_checkpoint(store, model, optimizer, step)
                stdout.line(f"checkpoint at step {step}")
    finally:
        agent.close()
    stdout.line(f"rank {placement.rank} done at step {step}")
    return 0


def save_checkpoint(store: CheckpointStore, model: GPT, optimizer: torch.optim.Optimizer, step: int) -> None:
    """Model, optimizer and step, written whole or not at all (a stop mid-write leaves the previous one)."""
    store.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()})


def load_checkpoint(
    store: CheckpointStore | None, model: GPT, optimizer: torch.optim.Optimizer, out: QuietableStream
) -> int:
    """The step to go on from: the checkpoint's, restored into `model` and `optimizer`, else 0."""
    saved = store.load() if store is not None else None
    if saved is None:
        return 0
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    out.line(f"{RESUMED_MARKER} {saved['step']}")
    return int(saved["step"])


def inject(args: argparse.Namespace, agent: TrainerAgent, stdout: QuietableStream) -> None:
    """Run the requested fault at step --fault-after."""
    announcement = f"fault {args.fault} at step {args.fault_after}"
    if args.fault == "idle":
        stdout.last_line(announcement)
        while True:
            time.sleep(1.0)
    stdout.line(announcement)
    if args.fault == "hang":
        with agent.step():
            hang_forever()
    elif args.fault == "crash":
        with agent.step():
            crash()
    elif args.fault == "checkpoint":
        with agent.phase("checkpoint", budget_s=args.checkpoint_budget):
            time.sleep(args.checkpoint_seconds)
        stdout.line("checkpoint saved")


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _out_of_time(signum: int, frame: object) -> None:
    print("train_gpt: --max-minutes reached: ending the run", file=sys.stderr, flush=True)
    raise SystemExit(0)


if __name__ == "__main__":
    sys.exit(main())
