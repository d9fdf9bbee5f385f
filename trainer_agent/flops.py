"""Model FLOPs: the PaLM/Megatron closed form, and a one-off count with FlopCounterMode on a meta-device copy.

    flops_per_token = transformer_flops_per_token(
        n_params=matmul_param_count(model), n_layers=12, n_heads=12, head_dim=64, seq_len=1024, causal=True
    )
    flops_per_step = measure_flops(model, batch_x, batch_y)   # once, before training; the live model is untouched

Both count forward + backward (3x forward) model FLOPs, so they feed TrainerAgent(flops_per_token=...)
or TrainerAgent(flops_per_step=...) directly.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

TRAINING_MULTIPLIER = 3
"""Backward costs twice the forward: forward + backward = 3 x forward."""


def transformer_flops_per_token(
    *,
    n_params: int,
    n_layers: int,
    n_heads: int,
    head_dim: int,
    seq_len: int,
    causal: bool = False,
    training: bool = True,
) -> float:
    """6·N + 12·L·H·Q·T (PaLM, appendix B; Megatron-LM): training FLOPs per token of a decoder transformer.

    Args:
        n_params: parameters multiplied per token: every weight matrix, including the output (vocabulary)
            projection, excluding embedding lookups. matmul_param_count(model) counts them, or refuses a
            model it cannot count.
        n_layers, n_heads, head_dim, seq_len: L, H, Q and T.
        causal: count only the attention scores a causal kernel computes (half; e.g. FlashAttention's
            causal path). Leave False for attention that computes the full T x T matrix and masks it.
        training: forward + backward (6N + 12LHQT); False gives the forward pass alone (2N + 4LHQT).
    """
    for name, value in {"n_params": n_params, "n_layers": n_layers, "n_heads": n_heads, "head_dim": head_dim}.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, not {value}")
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, not {seq_len}")
    attention = 2 * 2 * n_layers * n_heads * head_dim * seq_len  # QK^T and attention x V, 2 FLOPs per MAC
    if causal:
        attention /= 2
    forward = 2 * n_params + attention
    return float(forward * (TRAINING_MULTIPLIER if training else 1))


def matmul_param_count(model: Any) -> int:
    """Weights multiplied once per token: every nn.Linear (a tied output projection included), Hugging Face
    Conv1D (GPT-2) and nn.MultiheadAttention's in-projection (fused, as in nn.TransformerEncoder, or q/k/v).

    Embedding lookups and 1-D parameters (biases, norms) are not matmuls. A model holding any other
    parameter of 2 or more dimensions (a convolution, a custom projection) is refused with a ValueError
    naming it, since its FLOPs per token are unknown: count those with measure_flops. A module applied
    more than once per token (layers shared across depth) is counted once.
    """
    import torch  # imported here: the agent itself does not need torch

    matmul: dict[int, int] = {}
    lookups: set[int] = set()
    for module in model.modules():
        if isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
            lookups.add(id(module.weight))
        for weight in _matmul_weights(module, torch):
            matmul[id(weight)] = weight.numel()
    for name, parameter in model.named_parameters():
        if parameter.dim() >= 2 and id(parameter) not in matmul and id(parameter) not in lookups:
            raise ValueError(
                f"cannot count the matmul FLOPs of parameter {name!r} {tuple(parameter.shape)}: it is in no "
                "Linear, Conv1D, MultiheadAttention or Embedding; use measure_flops for this model"
            )
    return sum(matmul.values())


def _matmul_weights(module: Any, torch: Any) -> list[Any]:
    """The weights a module multiplies its input by (its own, not its submodules')."""
    if isinstance(module, torch.nn.Linear):
        return [module.weight]
    if isinstance(module, torch.nn.MultiheadAttention):  # out_proj is a Linear submodule
        if module.in_proj_weight is not None:
            return [module.in_proj_weight]
        return [module.q_proj_weight, module.k_proj_weight, module.v_proj_weight]
    if type(module).__name__ == "Conv1D" and hasattr(module, "nf"):  # transformers.pytorch_utils.Conv1D
        return [module.weight]
    return []


def measure_flops(
    model: Any,
    *inputs: Any,
    loss_fn: Callable[[Any], Any] | None = None,
    backward: bool = True,
    **kwargs: Any,
) -> int:
    """FLOPs of one forward (+ backward) of `model(*inputs, **kwargs)`, counted by FlopCounterMode on a meta copy.

    The live model is never run: parameters and inputs are replaced by meta tensors (no memory, no
    compute), so this is safe on a 70B model and does not touch torch.compile's caches. Call it once,
    before training. `loss_fn(output)` turns the output into a scalar (default: the output's `loss`, its
    first element, or its sum).
    """
    import torch
    from torch.utils._pytree import tree_map
    from torch.utils.flop_counter import FlopCounterMode

    meta_model = meta_copy(model)

    def to_meta(value: Any) -> Any:
        return torch.empty_like(value, device="meta") if isinstance(value, torch.Tensor) else value

    meta_inputs, meta_kwargs = tree_map(to_meta, (inputs, kwargs))
    counter = FlopCounterMode(display=False)
    with counter:
        output = meta_model(*meta_inputs, **meta_kwargs)
        if backward:
            (loss_fn or _default_loss)(output).backward()
    return int(counter.get_total_flops())


def meta_copy(model: Any) -> Any:
    """A copy of the model whose parameters and buffers live on the meta device (no storage is copied)."""
    import torch

    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper: count the eager module
    model = getattr(model, "module", model) if type(model).__name__ == "DistributedDataParallel" else model
    memo: dict[int, Any] = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        meta = torch.empty_like(tensor, device="meta")
        memo[id(tensor)] = (
            torch.nn.Parameter(meta, tensor.requires_grad) if isinstance(tensor, torch.nn.Parameter) else meta
        )
    return copy.deepcopy(model, memo)


def _default_loss(output: Any) -> Any:
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    if loss is None and isinstance(output, (tuple, list)):
        loss = output[0]
    if loss is None:
        loss = output.logits if hasattr(output, "logits") else output
    return loss.float().sum() if loss.dim() else loss
