"""Per-step overhead of the agent on a CPU GPT step: throughput with vs without, interleaved, median ratio.

    python bench/agent_overhead.py                 # ~1 min on 2 cores; target: ratio >= 0.995
    python bench/agent_overhead.py --reps 21 --steps 40

Each repetition runs the same training loop twice, once bare and once with step()/record() and the
agent's background thread emitting 1 s windows to a JSONL file; the order alternates between
repetitions so drift in machine load hits both sides alike.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]  # a repository tool: run from a checkout
from gpt import GPT, CharBatches, GPTConfig, local_text  # noqa: E402

from trainer_agent import JsonlSink, TrainerAgent  # noqa: E402

TARGET_RATIO = 0.995


def train(model, optimizer, batches, steps: int, agent: TrainerAgent | None) -> tuple[float, float]:
    """Steps per second of wall time and of process CPU time, with or without the agent in the loop."""
    tokens = batches.batch_size * batches.seq_len
    started, cpu_started = time.perf_counter(), time.process_time()
    for _ in range(steps):
        x, y = batches.next()
        with agent.step(tokens=tokens, samples=batches.batch_size) if agent else nullcontext():
            _, loss = model(x, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        if agent:
            agent.record(loss=loss)
    return steps / (time.perf_counter() - started), steps / (time.process_time() - cpu_started)


def agent_call_cost_us(agent: TrainerAgent, calls: int = 20_000) -> float:
    """Microseconds of one step() + record(tensor) pair around an empty body."""
    loss = torch.tensor(1.0)
    started = time.perf_counter()
    for _ in range(calls):
        with agent.step(tokens=1, samples=1):
            pass
        agent.record(loss=loss)
    return (time.perf_counter() - started) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--steps", type=int, default=30, help="steps per side per repetition")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: steadier on a busy host)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    config = GPTConfig()
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = CharBatches(local_text(), args.batch_size, config.seq_len)
    with tempfile.TemporaryDirectory() as tmp:
        agent = TrainerAgent(
            flops_per_step=1e9, peak_tflops=1.0, interval_s=1.0, sinks=[JsonlSink(Path(tmp) / "w.jsonl")]
        )
        train(model, optimizer, batches, args.steps, None)  # warm-up
        train(model, optimizer, batches, args.steps, agent)
        wall, cpu = Sides(), Sides()
        for rep in range(args.reps):
            order = (None, agent) if rep % 2 == 0 else (agent, None)
            rates = {id(side): train(model, optimizer, batches, args.steps, side) for side in order}
            wall.add(rates[id(None)][0], rates[id(agent)][0])
            cpu.add(rates[id(None)][1], rates[id(agent)][1])
            print(f"rep {rep + 1:2d}: wall ratio {wall.ratios[-1]:.4f}   CPU-time ratio {cpu.ratios[-1]:.4f}")
        cost_us = agent_call_cost_us(agent)
        agent.close()

    step_ms = 1000 / statistics.median(wall.bare)
    params_m = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"CPU GPT {params_m:.2f}M params, torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    print(f"median bare step: {step_ms:.1f} ms wall, {1000 / statistics.median(cpu.bare):.1f} ms CPU")
    print(f"{args.reps} reps x {args.steps} steps per side, interleaved (order alternating)")
    print(f"throughput ratio with/without agent, wall clock: {wall.summary()}")
    print(f"throughput ratio with/without agent, CPU time:   {cpu.summary()}")
    print(f"agent step()+record(tensor) cost: {cost_us:.1f} us/step = {cost_us / 10 / step_ms:.3f}% of a bare step")
    verdict = "meets" if statistics.median(wall.ratios) >= TARGET_RATIO else "BELOW"
    print(f"target: wall-clock median >= {TARGET_RATIO}: {verdict}")


class Sides:
    """Bare and with-agent rates of each repetition."""

    def __init__(self) -> None:
        self.bare: list[float] = []
        self.with_agent: list[float] = []
        self.ratios: list[float] = []

    def add(self, bare: float, with_agent: float) -> None:
        self.bare.append(bare)
        self.with_agent.append(with_agent)
        self.ratios.append(with_agent / bare)

    def summary(self) -> str:
        ratios = sorted(self.ratios)
        quartiles = statistics.quantiles(ratios, n=4)
        return f"median {statistics.median(ratios):.4f} (IQR {quartiles[0]:.4f}-{quartiles[2]:.4f})"


if __name__ == "__main__":
    main()
