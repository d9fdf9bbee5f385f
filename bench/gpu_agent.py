"""GPU benchmark: a ~1B-parameter GPT in bf16 on one CUDA device, with torch.cuda.set_sync_debug_mode("error").

    python bench/gpu_agent.py              # ~3 min on an H100/H200; exits 2 with a message where there is no CUDA

Reports (1) training throughput with vs without the agent (interleaved repetitions, median ratio),
(2) the MFU the agent reports against MFU from an independent CUDA-event timing of the same steps,
(3) that neither the loop nor the agent synchronized host and device: every training step runs
under sync-debug mode "error", so any synchronization raises, and any failure the agent swallowed
(it never raises into the loop) is caught from its log; and (4) that the stall's stack dump does not
either: the loop stops stepping with kernels queued, under sync-debug "error", until the agent dumps.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]  # a repository tool: run from a checkout
from gpt import GPT, GPTConfig  # noqa: E402

from trainer_agent import JsonlSink, StallDumps, TrainerAgent  # noqa: E402
from trainer_agent.flops import measure_flops  # noqa: E402
from trainer_agent.peaks import peak_tflops  # noqa: E402

# ~1.1B parameters: 12 * 2048^2 * 20 in the blocks, plus a 50304 x 2048 tied embedding.
CONFIG = GPTConfig(vocab_size=50304, seq_len=1024, n_layers=20, n_heads=16, d_model=2048)
NO_CUDA_EXIT = 2
STALL_S = 4.0  # the loop blocked this long: the stall watch (1 s floor, 1 s polls) dumps within it


class AgentWarnings(logging.Handler):
    """Collects what the agent logged at WARNING: a swallowed sync error would show up here."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--reps", type=int, default=5, help="interleaved repetitions for the throughput ratio")
    parser.add_argument("--steps", type=int, default=10, help="steps per side per repetition")
    parser.add_argument("--mfu-steps", type=int, default=60, help="steps of the MFU comparison run")
    parser.add_argument("--interval", type=float, default=2.0, help="agent window, seconds")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench/gpu_agent.py needs a CUDA device and torch.cuda.is_available() is False here.")
        print("CPU figures come from bench/agent_overhead.py; record GPU figures in docs/benchmarks.md when run.")
        return NO_CUDA_EXIT

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    device_name = torch.cuda.get_device_name()
    model = GPT(CONFIG).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x = torch.randint(CONFIG.vocab_size, (args.batch_size, CONFIG.seq_len), device="cuda")
    y = torch.roll(x, -1, dims=1)
    flops_per_step = measure_flops(model, x, y, loss_fn=lambda output: output[1])
    peak = peak_tflops(device_name, "bf16")
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{device_name}: GPT {n_params / 1e9:.2f}B params, batch {args.batch_size} x {CONFIG.seq_len}, bf16 autocast")
    print(f"measure_flops: {flops_per_step / 1e12:.1f} TFLOP per step; peak bf16 {peak} TFLOP/s")

    def train_step() -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    def run(agent: TrainerAgent | None, steps: int) -> float:
        """Seconds of `steps` steps by CUDA events, all steps under sync-debug "error"."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.set_sync_debug_mode("error")
        try:
            start.record()
            for _ in range(steps):
                if agent is None:
                    train_step()
                    continue
                with agent.step(tokens=x.numel(), samples=args.batch_size):
                    loss = train_step()
                agent.record(loss=loss)
            end.record()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        end.synchronize()
        return start.elapsed_time(end) / 1000.0

    warnings = AgentWarnings()
    logging.getLogger("trainer_agent").addHandler(warnings)
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(3):
            train_step()  # warm-up outside the timed runs
        torch.cuda.synchronize()

        ratios = []
        agent = TrainerAgent(
            flops_per_step=flops_per_step, interval_s=args.interval, sinks=[JsonlSink(f"{tmp}/a.jsonl")]
        )
        for rep in range(args.reps):
            sides = (None, agent) if rep % 2 == 0 else (agent, None)
            seconds = {id(side): run(side, args.steps) for side in sides}
            ratios.append(seconds[id(None)] / seconds[id(agent)])
        agent.close()

        windows_path = Path(tmp) / "mfu.jsonl"
        agent = TrainerAgent(flops_per_step=flops_per_step, interval_s=args.interval, sinks=[JsonlSink(windows_path)])
        seconds = run(agent, args.mfu_steps)
        agent.close()
        windows = [json.loads(line) for line in windows_path.read_text().splitlines()]

        stacks_path = Path(tmp) / "stacks.jsonl"
        agent = TrainerAgent(
            interval_s=args.interval, sinks=[JsonlSink(stacks_path)], stall_dumps=StallDumps(floor_s=1)
        )
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(5):
                with agent.step():
                    train_step()
            time.sleep(STALL_S)  # the loop blocked, its last steps' kernels still queued: the watch dumps now
        finally:
            torch.cuda.set_sync_debug_mode("default")
        agent.close()
        dumps = [r for line in stacks_path.read_text().splitlines() if (r := json.loads(line))["scope"] == "stacks"]

    full = [w for w in windows if w["scope"] == "job" and w["Steps"] > 0][1:-1]  # drop the partial edges
    independent_mfu = 100 * flops_per_step * args.mfu_steps / seconds / 1e12 / peak if peak else None
    print(f"throughput with/without agent: median {statistics.median(ratios):.4f} over {args.reps} interleaved reps")
    if full and independent_mfu is not None:
        reported = statistics.median(w["MFU"] for w in full)
        print(f"MFU: agent (median of {len(full)} full windows) {reported:.2f}%  vs CUDA events {independent_mfu:.2f}%")
        print(f"     ratio {reported / independent_mfu:.4f}")
    else:
        print(
            f"MFU comparison needs >= 3 windows with steps and a known peak (got {len(windows)} windows, peak {peak})"
        )
    innermost = dumps[0]["Main"][0] if dumps else None
    print(f"stall dump under sync-debug 'error': {len(dumps)} written (innermost frame: {innermost})")
    failures = [m for m in warnings.messages if not m.startswith("no peak FLOPs")]
    if not dumps:
        failures.append("the stall watch wrote no dump")
    if failures:  # e.g. "end_step failed ... called a synchronizing CUDA operation"
        print(f"AGENT WARNINGS (a swallowed synchronization would be here): {failures}")
        return 1
    print("sync-debug 'error': no synchronization in the loop or the agent")
    return 0


if __name__ == "__main__":
    sys.exit(main())
