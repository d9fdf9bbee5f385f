"""Per-step overhead of the agent on a CPU GPT step: throughput with vs without, interleaved, median ratio.

    python bench/agent_overhead.py                 # ~1 min on 2 idle cores; target: ratio >= 0.995
    python bench/agent_overhead.py --pairs 1500

The loop alternates bare steps and steps with `agent.step()` / `agent.record(loss=tensor)` (the order
within each pair alternating too), while the agent's background thread emits 1 s windows to a JSONL
file. The result is the ratio of the median throughputs (median bare step time / median agent step
time): medians over interleaved samples are robust to the bursts of load a shared machine has. The
median of the per-pair ratios is shown too (noisier: each is a ratio of two single steps), and so are
the medians of the loop thread's CPU time, which other processes preempting the loop do not inflate.
The agent's own cost per step is also timed directly: step() + record() around an empty body.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]  # a repository tool: run from a checkout
from gpt import GPT, CharBatches, GPTConfig, local_text  # noqa: E402

from trainer_agent import JsonlSink, TrainerAgent  # noqa: E402

TARGET_RATIO = 0.995


class Loop:
    """One training step of the small GPT, timed, with or without the agent."""

    def __init__(self, batch_size: int) -> None:
        torch.manual_seed(0)
        self.config = GPTConfig()
        self.model = GPT(self.config)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.batches = CharBatches(local_text(), batch_size, self.config.seq_len)
        self.tokens = batch_size * self.config.seq_len

    def bare(self) -> tuple[float, float]:
        """Wall and main-thread CPU seconds of one step."""
        started, cpu_started = time.perf_counter(), time.thread_time()
        x, y = self.batches.next()
        self._train(x, y)
        return time.perf_counter() - started, time.thread_time() - cpu_started

    def with_agent(self, agent: TrainerAgent) -> tuple[float, float]:
        started, cpu_started = time.perf_counter(), time.thread_time()
        x, y = self.batches.next()
        with agent.step(tokens=self.tokens, samples=self.batches.batch_size):
            loss = self._train(x, y)
        agent.record(loss=loss)
        return time.perf_counter() - started, time.thread_time() - cpu_started

    def _train(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        _, loss = self.model(x, y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return loss


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
    parser.add_argument("--pairs", type=int, default=800, help="interleaved (bare, agent) step pairs")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: steadier on a busy host)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    loop = Loop(args.batch_size)
    with tempfile.TemporaryDirectory() as tmp:
        agent = TrainerAgent(
            flops_per_step=1e9, peak_tflops=1.0, interval_s=1.0, sinks=[JsonlSink(Path(tmp) / "windows.jsonl")]
        )
        for _ in range(10):  # warm-up
            loop.bare()
            loop.with_agent(agent)
        bare, with_agent = [], []
        for pair in range(args.pairs):
            if pair % 2:
                with_agent.append(loop.with_agent(agent))
                bare.append(loop.bare())
            else:
                bare.append(loop.bare())
                with_agent.append(loop.with_agent(agent))
        cost_us = agent_call_cost_us(agent)
        agent.close()

    bare_ms, agent_ms = (statistics.median(wall for wall, _ in side) * 1000 for side in (bare, with_agent))
    bare_cpu_ms, agent_cpu_ms = (statistics.median(cpu for _, cpu in side) * 1000 for side in (bare, with_agent))
    ratios = [b[0] / a[0] for b, a in zip(bare, with_agent, strict=True)]
    quartiles = statistics.quantiles(ratios, n=4)
    params_m = sum(p.numel() for p in loop.model.parameters()) / 1e6
    ratio = bare_ms / agent_ms
    print(f"CPU GPT {params_m:.2f}M params, batch {args.batch_size} x {loop.config.seq_len}, torch {torch.__version__}")
    print(f"  {torch.get_num_threads()} thread(s); {args.pairs} interleaved pairs (order alternating)")
    print(f"median step: bare {bare_ms:.2f} ms, with agent {agent_ms:.2f} ms")
    print(f"median throughput ratio with/without agent: {ratio:.4f}")
    print(f"median main-thread CPU per step: bare {bare_cpu_ms:.2f} ms, with agent {agent_cpu_ms:.2f} ms")
    print(f"  ratio {bare_cpu_ms / agent_cpu_ms:.4f} (not disturbed by other processes preempting the loop)")
    print(f"per-pair ratios: median {statistics.median(ratios):.4f} (IQR {quartiles[0]:.4f}-{quartiles[2]:.4f})")
    print(f"agent step()+record(tensor) cost: {cost_us:.1f} us/step = {cost_us / 10 / bare_ms:.3f}% of a bare step")
    print(f"target >= {TARGET_RATIO}: {'met' if ratio >= TARGET_RATIO else 'MISSED'}")


if __name__ == "__main__":
    main()
