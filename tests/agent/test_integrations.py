"""The Hugging Face and Lightning callbacks, against the real libraries with tiny models (no downloads)."""

from __future__ import annotations

import math

import pytest
import torch

from trainer_agent import TrainerAgent


@pytest.fixture
def agent(sink):
    agent = TrainerAgent(interval_s=3600.0, sinks=[sink], handle_sigterm=False)
    yield agent
    agent.close()


def test_hugging_face_trainer_trains_with_the_callback_attached(agent, sink, tmp_path, monkeypatch):
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from trainer_agent.integrations.huggingface import StallwatchCallback

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)

    class RandomTokens(torch.utils.data.Dataset):
        """10 sequences of 16 random token ids, each its own label."""

        def __len__(self) -> int:
            return 10

        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
            ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(index))
            return {"input_ids": ids, "labels": ids}

    # Given a tiny GPT-2 built from a config, and 6 optimizer steps accumulating batches of 2 sequences in pairs:
    # 5 batches an epoch, so each epoch's third step has 1 batch (10 batches, 20 sequences, 320 tokens in all)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=32))
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=6,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        include_num_input_tokens_seen=True,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=RandomTokens(), callbacks=[StallwatchCallback(agent)])

    # When the Trainer trains
    output = trainer.train()

    # Then training finished, and the agent counted every optimizer step, the sequences and tokens each step
    # really had (16 tokens a sequence, short steps included), averaged the logged losses, and closed
    assert output.global_step == trainer.state.global_step == 6
    windows = sink.job
    assert sum(window.metrics["Steps"] for window in windows) == 6
    metrics = windows[-1].metrics
    assert metrics["Step"] == 6
    assert metrics["SamplesPerSecond"] > 0
    assert metrics["TokensPerSecond"] == pytest.approx(metrics["SamplesPerSecond"] * 16)
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 6
    assert math.isfinite(metrics["Loss"])
    assert metrics["Loss"] == pytest.approx(sum(losses) / len(losses))
    assert agent.total_steps == 6
    assert sink.closed


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_lightning_optimizer_steps_with_gradient_accumulation_reach_the_agent(agent, sink):
    import pytorch_lightning as pl

    from trainer_agent.integrations.lightning import StallwatchCallback

    class Regression(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
            self.losses: list[float] = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.losses.append(loss.item())
            return loss

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
    module = Regression()
    trainer.fit(module, loader)

    # Then the agent counted optimizer steps, 8 samples (80 tokens) each, and every batch's loss as
    # training_step returned it (not divided by the accumulation)
    (window,) = sink.job
    metrics = window.metrics
    assert (metrics["Steps"], metrics["Step"]) == (3, 3)
    assert metrics["TokensPerSecond"] == pytest.approx(metrics["SamplesPerSecond"] * 10)
    assert len(module.losses) == 6
    assert metrics["Loss"] == pytest.approx(sum(module.losses) / 6, rel=1e-6)
    assert agent.total_steps == 3


@pytest.mark.parametrize(
    ("batch", "size"),
    [(torch.zeros(5, 3), 5), ((torch.zeros(7, 2), torch.zeros(7)), 7), ({"input_ids": torch.zeros(3, 8)}, 3)],
)
def test_lightning_batch_size_reads_common_batch_shapes(batch, size):
    from trainer_agent.integrations.lightning import batch_size

    assert batch_size(batch) == size
