"""A Lightning `Callback` that drives a TrainerAgent.

    agent = TrainerAgent(flops_per_step=flops_per_step)
    trainer = Trainer(max_steps=10_000, callbacks=[StallwatchCallback(agent, tokens_per_sample=seq_len)])

A step is an optimizer step (several batches under gradient accumulation); samples are counted from
this rank's batches, tokens as samples x `tokens_per_sample`. The loss returned by training_step is
recorded without reading it, un-scaled (Lightning divides it by accumulate_grad_batches for backward).
With `eval_budget_s`, validation runs as a declared "eval" phase. The agent is closed when training ends.
"""

from __future__ import annotations

from typing import Any

from trainer_agent.agent import TrainerAgent

try:
    from lightning.pytorch import Callback
except ImportError:
    try:
        from pytorch_lightning import Callback
    except ImportError as error:  # pragma: no cover - the message is the point
        raise ImportError("the Lightning callback needs lightning: pip install 'trainer-agent[lightning]'") from error


class StallwatchCallback(Callback):
    """Times each optimizer step, counts its samples and records training_step's loss."""

    def __init__(
        self,
        agent: TrainerAgent,
        tokens_per_sample: int | None = None,
        eval_budget_s: float | None = None,
        close_on_end: bool = True,
    ) -> None:
        self.agent = agent
        self.tokens_per_sample = tokens_per_sample
        self.eval_budget_s = eval_budget_s
        self.close_on_end = close_on_end
        self._in_step = False
        self._samples = 0
        self._global_step = 0
        self._in_eval = False

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.agent.total_steps is None and trainer.max_steps and trainer.max_steps > 0:
            self.agent.total_steps = trainer.max_steps
        self._global_step = trainer.global_step

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if not self._in_step:
            self.agent.start_step()
            self._in_step = True

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None and pl_module.automatic_optimization and trainer.accumulate_grad_batches > 1:
            loss = loss * trainer.accumulate_grad_batches  # a tensor op on the loss's device: no read, no sync
        self.agent.record(loss=loss)
        self._samples += batch_size(batch)
        if trainer.global_step > self._global_step:  # the optimizer stepped: one agent step ends
            tokens = self._samples * self.tokens_per_sample if self.tokens_per_sample else None
            self.agent.end_step(tokens=tokens, samples=self._samples, step=trainer.global_step)
            self._global_step, self._samples, self._in_step = trainer.global_step, 0, False

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if self.eval_budget_s is not None and not trainer.sanity_checking:
            self._in_eval = bool(self.agent.start_phase("eval", self.eval_budget_s))

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self._in_eval:
            self.agent.end_phase()
            self._in_eval = False

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.close_on_end:
            self.agent.close()


def batch_size(batch: Any) -> int:
    """Samples in a batch: a tensor's first dimension, or that of the first tensor in a tuple, list or dict."""
    if hasattr(batch, "shape") and len(batch.shape):
        return int(batch.shape[0])
    if isinstance(batch, dict):
        return batch_size(next(iter(batch.values()))) if batch else 0
    if isinstance(batch, (tuple, list)):
        return batch_size(batch[0]) if batch else 0
    return 1
