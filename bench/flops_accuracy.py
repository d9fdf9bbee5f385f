"""FLOPs accuracy: measure_flops (meta copy) and the 6N + 12LHQT closed form vs FlopCounterMode on the live model.

    python bench/flops_accuracy.py        # targets: measure_flops within 1%, closed form within 5%

FlopCounterMode on the live eager model (forward + backward of one batch) is the reference; the GPT
uses explicit attention, so every attention matmul is visible to it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]  # a repository tool: run from a checkout
from gpt import GPT, GPTConfig, live_step_flops  # noqa: E402

from trainer_agent.flops import matmul_param_count, measure_flops, transformer_flops_per_token  # noqa: E402

MEASURE_TOLERANCE = 0.01
CLOSED_FORM_TOLERANCE = 0.05
CONFIGS = [
    GPTConfig(seq_len=64, n_layers=2, n_heads=4, d_model=128),
    GPTConfig(seq_len=256, n_layers=4, n_heads=8, d_model=256),
    GPTConfig(vocab_size=8192, seq_len=512, n_layers=6, n_heads=8, d_model=512),
]
BATCH = 2


def main() -> int:
    print(f"{'model':<34} {'live (ref)':>12} {'measure_flops':>14} {'ratio':>7} {'6N+12LHQT':>12} {'ratio':>7}")
    ok = True
    for config in CONFIGS:
        torch.manual_seed(0)
        model = GPT(config)
        x = torch.randint(config.vocab_size, (BATCH, config.seq_len))
        y = torch.roll(x, -1, dims=1)
        reference = live_step_flops(model, x, y)
        measured = measure_flops(model, x, y, loss_fn=lambda output: output[1])
        closed = (
            BATCH
            * config.seq_len
            * transformer_flops_per_token(
                n_params=matmul_param_count(model),
                n_layers=config.n_layers,
                n_heads=config.n_heads,
                head_dim=config.head_dim,
                seq_len=config.seq_len,
            )
        )
        name = f"L{config.n_layers} d{config.d_model} T{config.seq_len} V{config.vocab_size}"
        measure_ratio, closed_ratio = measured / reference, closed / reference
        print(f"{name:<34} {reference:12.4e} {measured:14.4e} {measure_ratio:7.4f} {closed:12.4e} {closed_ratio:7.4f}")
        ok &= abs(measure_ratio - 1) <= MEASURE_TOLERANCE and abs(closed_ratio - 1) <= CLOSED_FORM_TOLERANCE
    print(
        f"targets: measure_flops within {MEASURE_TOLERANCE:.0%}, closed form within {CLOSED_FORM_TOLERANCE:.0%}:",
        "met" if ok else "MISSED",
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
