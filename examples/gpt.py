"""A small GPT (nanoGPT's shape) with explicit causal attention, and character data from a local text.

model = GPT(GPTConfig())
logits, loss = model(tokens, targets)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode


@dataclass(frozen=True)
class GPTConfig:
    """Model shape. The defaults train at ~20 ms/step on two CPU cores."""

    vocab_size: int = 256
    """Bytes: the character data needs no tokenizer."""
    seq_len: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_model: int = 128

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


class CausalSelfAttention(nn.Module):
    """Attention written out (QK^T, mask, softmax, x V) so FLOP counters see every matmul."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        mask = torch.ones(config.seq_len, config.seq_len, dtype=torch.bool).tril()
        self.register_buffer("mask", mask.view(1, 1, config.seq_len, config.seq_len), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, channels = x.shape
        heads, head_dim = self.config.n_heads, self.config.head_dim
        q, k, v = (t.view(batch, time, heads, head_dim).transpose(1, 2) for t in self.qkv(x).split(channels, dim=2))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(head_dim)
        scores = scores.masked_fill(~self.mask[:, :, :time, :time], float("-inf"))
        out = F.softmax(scores, dim=-1) @ v
        return self.proj(out.transpose(1, 2).contiguous().view(batch, time, channels))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(config.d_model, 4 * config.d_model), nn.GELU(), nn.Linear(4 * config.d_model, config.d_model)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token + position embeddings, pre-norm blocks, an output projection tied to the token embedding."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.d_model)
        self.wpe = nn.Embedding(config.seq_len, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        self.apply(_init_weights)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def live_step_flops(model: GPT, x: torch.Tensor, y: torch.Tensor) -> int:
    """The reference count: FlopCounterMode around one forward + backward of the live, eager model. For checking
    trainer_agent.flops (tests, bench/flops_accuracy.py); a training loop uses `measure_flops` instead."""
    counter = FlopCounterMode(display=False)
    with counter:
        _, loss = model(x, y)
        loss.backward()
    return counter.get_total_flops()


def _init_weights(module: nn.Module) -> None:
    """GPT-2's initialisation: small normal weights, zero biases (keeps the tied logits near uniform)."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


class CharBatches:
    """Random windows of a byte string: (inputs, next-byte targets)."""

    def __init__(self, text: bytes, batch_size: int, seq_len: int, seed: int = 0) -> None:
        if len(text) <= seq_len + 1:
            raise ValueError(f"text of {len(text)} bytes is too short for seq_len {seq_len}")
        self.data = torch.tensor(list(text), dtype=torch.long)
        self.batch_size, self.seq_len = batch_size, seq_len
        self.generator = torch.Generator().manual_seed(seed)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(len(self.data) - self.seq_len - 1, (self.batch_size,), generator=self.generator)
        rows = starts[:, None] + torch.arange(self.seq_len + 1)
        window = self.data[rows]
        return window[:, :-1], window[:, 1:]


def local_text() -> bytes:
    """Training text that needs no download: this package's own source files."""
    return b"\n".join(path.read_bytes() for path in sorted(Path(__file__).parent.glob("*.py")))
