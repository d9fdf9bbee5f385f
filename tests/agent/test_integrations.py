"""The Hugging Face and Lightning callbacks, against the real libraries with tiny models (no downloads)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from trainer_agent import TrainerAgent


@pytest.fixture
def agent(sink):
    agent = TrainerAgent(interval_s=3600.0, sinks=[sink], handle_sigterm=False)
    yield agent
    agent.close()


def test_hugging_face_callback_events_drive_the_agent(agent, sink):
    from transformers import TrainerControl, TrainerState
    from transformers.trainer_callback import CallbackHandler

    from trainer_agent.integrations.huggingface import StallwatchCallback

    # Given the Trainer's own callback machinery, with 2 samples x 2 accumulation per device step
    # (TrainingArguments' fields; the real class needs accelerate, which the dev requirements lack)
    args = SimpleNamespace(per_device_train_batch_size=2, gradient_accumulation_steps=2)
    state, control = TrainerState(max_steps=4), TrainerControl()
    handler = CallbackHandler([StallwatchCallback(agent)], None, None, None, None)

    # When it runs 4 steps as Trainer.train() does, 64 tokens each, logging each loss
    handler.on_train_begin(args, state, control)
    for step in range(1, 5):
        handler.on_step_begin(args, state, control)
        state.global_step, state.num_input_tokens_seen = step, 64 * step
        handler.on_step_end(args, state, control)
        handler.on_log(args, state, control, logs={"loss": float(step), "learning_rate": 1e-3})
    handler.on_train_end(args, state, control)

    # Then the agent counted the steps, samples and tokens and the losses, and closed with the last window
    (window,) = sink.job
    metrics = window.metrics
    assert (metrics["Steps"], metrics["Step"]) == (4, 4)
    assert metrics["TokensPerSecond"] == pytest.approx(metrics["SamplesPerSecond"] * 64 / 4)
    assert metrics["Loss"] == pytest.approx(2.5)
    assert agent.total_steps == 4
    assert sink.closed


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_lightning_optimizer_steps_with_gradient_accumulation_reach_the_agent(agent, sink):
    import pytorch_lightning as pl

    from trainer_agent.integrations.lightning import StallwatchCallback

    class Regression(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    # Given 3 optimizer steps of 2 accumulated batches of 4 samples
    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    trainer = pl.Trainer(
        max_steps=3,
        accumulate_grad_batches=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[StallwatchCallback(agent, tokens_per_sample=10)],
    )

    # When Lightning trains
    trainer.fit(Regression(), loader)

    # Then the agent counted optimizer steps, 8 samples (80 tokens) each, and every batch's loss
    (window,) = sink.job
    metrics = window.metrics
    assert (metrics["Steps"], metrics["Step"]) == (3, 3)
    assert metrics["TokensPerSecond"] == pytest.approx(metrics["SamplesPerSecond"] * 10)
    assert metrics["Loss"] > 0
    assert agent.total_steps == 3


@pytest.mark.parametrize(
    ("batch", "size"),
    [(torch.zeros(5, 3), 5), ((torch.zeros(7, 2), torch.zeros(7)), 7), ({"input_ids": torch.zeros(3, 8)}, 3)],
)
def test_lightning_batch_size_reads_common_batch_shapes(batch, size):
    from trainer_agent.integrations.lightning import batch_size

    assert batch_size(batch) == size
