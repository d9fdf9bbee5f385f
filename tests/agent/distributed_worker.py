"""A torchrun worker (CPU, gloo) for tests/agent/test_distributed.py: `torchrun ... distributed_worker.py MODE OUT`.

hang-backward  rank 0 blocks in DDP's backward all_reduce, which rank 1 (in a recv nobody matches) never joins
hang-recv      rank 0 blocks in a recv nobody matches, likewise
dataloader     a loop fed by forked DataLoader workers, with a slow sink, until a group SIGTERM
ddp, fsdp      the core agent around DDP or FSDP2, accumulating gradients; writes the independent count
hf             the Hugging Face Trainer with StallwatchCallback, likewise
lightning      Lightning (DDP strategy) with its StallwatchCallback, likewise
stall-loader   rank 1's data loader blocks in a sleep while rank 0 waits in the next all_reduce; stacks on stdout
stall-checkpoint  rank 0 alone writes a checkpoint that never ends while rank 1 waits in the next all_reduce

Windows go to OUT/windows.jsonl (hang modes: OUT/windows-RANK.jsonl). The counting modes run the agent
on a frozen clock that jumps WINDOW_S at the end, so each rate in their single window times WINDOW_S is
an exact count.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from trainer_agent import EmfStdoutSink, JsonlSink, StallDumps, TrainerAgent

WINDOW_S = 1000.0
FLOPS_PER_TOKEN = 1e6
SEQ = 16
STEPS = 4
ACCUMULATE = 2
BLOCK_S = 600
STALL_FLOOR_S = 3.0
"""The stall modes' dump floor (their steps take milliseconds: the floor is the threshold)."""
STALL_AFTER = 3
"""Steps before the stall modes' fault."""


class FrozenClock:
    """The agent's perf_counter: still until the test's run is over, then WINDOW_S later."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class SlowSink:
    """Takes a second per window before appending it to a file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def emit(self, window: object) -> None:
        time.sleep(1.0)
        with self.path.open("a") as file:
            file.write(json.dumps(window.as_record()) + "\n")  # type: ignore[attr-defined]

    def close(self, timeout_s: float) -> None:
        pass


def publish(path: Path, text: str) -> None:
    """Write whole, then rename: the test polls for the name and must never read a half-written file."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    partial.rename(path)


def counting_agent(out: Path, clock: FrozenClock) -> TrainerAgent:
    sink = JsonlSink(out / "windows.jsonl")
    return TrainerAgent(interval_s=3600, sinks=[sink], flops_per_token=FLOPS_PER_TOKEN, peak_tflops=1.0, clock=clock)


def finish_count(out: Path, agent: TrainerAgent, clock: FrozenClock, tokens: int, samples: int) -> None:
    """Sum what every rank really consumed (the independent count), then close the agent's single window."""
    counts = torch.tensor([tokens, samples], dtype=torch.float64)
    dist.all_reduce(counts)
    if dist.get_rank() == 0:
        expected = {"tokens": counts[0].item(), "samples": counts[1].item(), "world_size": dist.get_world_size()}
        publish(out / "expected.json", json.dumps(expected))
    clock.now = WINDOW_S
    agent.close()


def hang(out: Path, blocked_in: str) -> None:
    """Rank 0 blocks inside its third step, in DDP's backward all_reduce or in a recv; rank 1 in a recv.
    Launched as 2 hosts x 1 rank, both report (host metrics), so both run the agent's SIGTERM handling."""
    rank = dist.get_rank()
    agent = TrainerAgent(interval_s=3600, sinks=[JsonlSink(out / f"windows-{rank}.jsonl")])
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
    for _ in range(2):
        with agent.step(tokens=SEQ):
            model(torch.randn(2, 8)).sum().backward()
    publish(out / f"blocked-{rank}", str(os.getpid()))
    if rank != 0:
        dist.recv(torch.empty(4), src=0, tag=7)
        return
    with agent.step(tokens=SEQ):
        if blocked_in == "backward":
            model(torch.randn(2, 8)).sum().backward()
        else:
            dist.recv(torch.empty(4), src=1, tag=7)


def dataloader(out: Path) -> None:
    agent = TrainerAgent(interval_s=3600, sinks=[JsonlSink(out / "windows.jsonl"), SlowSink(out / "slow.jsonl")])
    data = torch.utils.data.TensorDataset(torch.arange(10**6))
    loader = torch.utils.data.DataLoader(data, batch_size=4, num_workers=2, multiprocessing_context="fork")
    for step, (batch,) in enumerate(loader, start=1):
        with agent.step(samples=len(batch)):
            time.sleep(0.01)
        if step == 5:
            publish(out / "running", str(os.getpid()))


class Samples(torch.utils.data.Dataset):
    """A dataset whose item STALL_AFTER blocks when `stuck`, as a loader stuck on one host's storage."""

    def __init__(self, stuck: bool) -> None:
        self.stuck = stuck

    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.stuck and index == STALL_AFTER:
            time.sleep(BLOCK_S)  # the stuck read
        return torch.full((4,), float(index))


def save_checkpoint(path: Path) -> None:
    """Open a FIFO nobody reads for writing: blocked in C for good, as a write to a hung file system is."""
    os.mkfifo(path)
    with path.open("wb") as checkpoint:  # the write that never ends
        checkpoint.write(b"weights")


def stall(out: Path, fault: str) -> None:
    """Every rank steps (an all_reduce a step) with the agent's stack dumps on stdout, then `fault`: rank 1's loader
    blocks ("loader") or rank 0 writes a checkpoint alone ("checkpoint"); the other rank waits in the all_reduce."""
    rank = dist.get_rank()
    agent = TrainerAgent(
        interval_s=3600, sinks=[EmfStdoutSink()], stall_dumps=StallDumps(steps=3.0, floor_s=STALL_FLOOR_S)
    )
    loader = torch.utils.data.DataLoader(Samples(stuck=fault == "loader" and rank == 1), batch_size=1)
    for step, batch in enumerate(loader):
        if fault == "checkpoint" and step == STALL_AFTER and rank == 0:
            save_checkpoint(out / "checkpoint.pt")
        with agent.step():
            dist.all_reduce(batch)  # every step's collective


def counts(out: Path, sharded: bool) -> None:
    """The core agent around DDP, or FSDP2 (fully_shard), accumulating ACCUMULATE micro-batches per step."""
    clock = FrozenClock()
    agent = counting_agent(out, clock)
    if sharded:
        from torch.distributed.fsdp import fully_shard

        model = fully_shard(torch.nn.Linear(8, 8))
    else:
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    tokens = samples = 0
    for step in range(1, STEPS + 1):
        step_tokens = step_samples = 0
        agent.start_step()
        for micro in range(ACCUMULATE):
            batch = torch.randn(step + micro, SEQ, 8)  # sizes differ by step and micro-batch
            last = micro == ACCUMULATE - 1
            if sharded:
                model.set_requires_gradient_sync(last)
                model(batch).pow(2).mean().backward()
            else:
                with contextlib.nullcontext() if last else model.no_sync():
                    model(batch).pow(2).mean().backward()
            step_tokens += batch.shape[0] * SEQ
            step_samples += batch.shape[0]
        optimizer.step()
        optimizer.zero_grad()
        agent.end_step(tokens=step_tokens, samples=step_samples)
        tokens, samples = tokens + step_tokens, samples + step_samples
    finish_count(out, agent, clock, tokens, samples)


def hf(out: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from trainer_agent.integrations.huggingface import StallwatchCallback

    class Sequences(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 64

        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
            ids = torch.randint(0, 64, (SEQ,), generator=torch.Generator().manual_seed(index))
            return {"input_ids": ids, "labels": ids}

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=32))
    seen = {"tokens": 0, "samples": 0}

    def count(module: object, args: object, kwargs: dict) -> None:
        if module.training:  # type: ignore[attr-defined]
            seen["tokens"] += kwargs["input_ids"].numel()
            seen["samples"] += kwargs["input_ids"].shape[0]

    model.register_forward_pre_hook(count, with_kwargs=True)
    args = TrainingArguments(
        output_dir=str(out / "hf"),
        max_steps=STEPS,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=ACCUMULATE,
        include_num_input_tokens_seen=True,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        ddp_backend="gloo",
        disable_tqdm=True,
        logging_steps=1,
    )
    clock = FrozenClock()
    agent = counting_agent(out, clock)
    callback = StallwatchCallback(agent, close_on_end=False)
    Trainer(model=model, args=args, train_dataset=Sequences(), callbacks=[callback]).train()
    finish_count(out, agent, clock, seen["tokens"], seen["samples"])


def lightning(out: Path) -> None:
    import pytorch_lightning as pl

    from trainer_agent.integrations.lightning import StallwatchCallback

    seen = {"tokens": 0, "samples": 0}

    class Regression(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
            x, y = batch
            seen["tokens"] += x.shape[0] * SEQ
            seen["samples"] += x.shape[0]
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    clock = FrozenClock()
    agent = counting_agent(out, clock)
    trainer = pl.Trainer(
        max_steps=STEPS,
        accumulate_grad_batches=ACCUMULATE,
        accelerator="cpu",
        devices=int(os.environ["WORLD_SIZE"]),
        strategy="ddp",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[StallwatchCallback(agent, tokens_per_sample=SEQ, close_on_end=False)],
    )
    trainer.fit(Regression(), torch.utils.data.DataLoader(data, batch_size=4))
    finish_count(out, agent, clock, seen["tokens"], seen["samples"])


MODES = {
    "hang-backward": functools.partial(hang, blocked_in="backward"),
    "hang-recv": functools.partial(hang, blocked_in="recv"),
    "dataloader": dataloader,
    "ddp": functools.partial(counts, sharded=False),
    "fsdp": functools.partial(counts, sharded=True),
    "hf": hf,
    "lightning": lightning,
    "stall-loader": functools.partial(stall, fault="loader"),
    "stall-checkpoint": functools.partial(stall, fault="checkpoint"),
}


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    if mode != "lightning":  # Lightning sets up its own process group
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=BLOCK_S))
    MODES[mode](out)
    if dist.is_initialized():
        dist.barrier()  # no rank tears down gloo while a peer still talks to it
        dist.destroy_process_group()
    # Everything is written and the agent closed: skip the interpreter's teardown, where a framework's leftover
    # native thread (seen under load with the Hugging Face Trainer on gloo) can abort with std::terminate.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
