"""A Hugging Face `TrainerCallback` that drives a TrainerAgent.

    agent = TrainerAgent(flops_per_token=flops_per_token)
    trainer = Trainer(model, args, train_dataset=dataset, callbacks=[StallwatchCallback(agent)])

Steps are the Trainer's optimizer steps; samples are the per-device batch times the step's micro-batches
(fewer than gradient_accumulation_steps at the end of an epoch that does not divide evenly);
tokens come from `state.num_input_tokens_seen` (TrainingArguments(include_num_input_tokens_seen=True)),
which the Trainer already sums over ranks, so it is passed as the job's count; else from `tokens_per_step`
(this rank's). Logged losses are recorded (the Trainer has already read them). The agent is closed
when training ends.
"""

from __future__ import annotations

from typing import Any

from trainer_agent.agent import TrainerAgent

try:
    from transformers import TrainerCallback
except ImportError as error:  # pragma: no cover - the message is the point
    raise ImportError("the Hugging Face callback needs transformers: pip install 'trainer-agent[hf]'") from error


class StallwatchCallback(TrainerCallback):
    """Times each optimizer step and records logged losses."""

    def __init__(self, agent: TrainerAgent, tokens_per_step: int | None = None, close_on_end: bool = True) -> None:
        """`tokens_per_step`: this rank's tokens per optimizer step, when the Trainer does not count them."""
        self.agent = agent
        self.tokens_per_step = tokens_per_step
        self.close_on_end = close_on_end
        self._tokens_seen = 0
        self._micro_batches = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.agent.total_steps is None and state.max_steps > 0:
            self.agent.total_steps = state.max_steps
        self._tokens_seen = state.num_input_tokens_seen or 0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._micro_batches = 0
        self.agent.start_step()

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # every micro-batch but the step's last, which ends in on_step_end
        self._micro_batches += 1

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        seen = state.num_input_tokens_seen or 0
        job_tokens = seen - self._tokens_seen if seen > self._tokens_seen else None
        self._tokens_seen = seen
        samples = args.per_device_train_batch_size * (self._micro_batches + 1)  # this rank's
        tokens = self.tokens_per_step if job_tokens is None else None
        self.agent.end_step(tokens=tokens, samples=samples, step=state.global_step, job_tokens=job_tokens)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        if logs and "loss" in logs:
            self.agent.record(loss=logs["loss"])

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.close_on_end:
            self.agent.close()
