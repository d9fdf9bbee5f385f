"""FLOPs: the closed form, the meta-device count, and the peak table."""

from __future__ import annotations

import pytest
import torch

from examples.gpt import GPT, GPTConfig, live_step_flops
from trainer_agent.flops import matmul_param_count, measure_flops, meta_copy, transformer_flops_per_token
from trainer_agent.peaks import PEAK_TFLOPS, device_key, peak_tflops, precision_key

CONFIG = GPTConfig(seq_len=32, n_layers=2, n_heads=4, d_model=64)


@pytest.fixture
def batch() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randint(CONFIG.vocab_size, (2, CONFIG.seq_len))
    return x, torch.roll(x, -1, dims=1)


def test_measure_flops_matches_flop_counter_on_the_live_model(batch):
    torch.manual_seed(0)
    model = GPT(CONFIG)
    measured = measure_flops(model, *batch, loss_fn=lambda output: output[1])
    assert measured == pytest.approx(live_step_flops(model, *batch), rel=0.01)


def test_measure_flops_leaves_the_live_model_untouched(batch):
    model = GPT(CONFIG)
    before = {name: param.clone() for name, param in model.named_parameters()}
    measure_flops(model, *batch, loss_fn=lambda output: output[1])
    for name, param in model.named_parameters():
        assert param.device.type == "cpu"
        assert param.grad is None
        assert torch.equal(param, before[name])


def test_meta_copy_keeps_parameter_sharing_and_shapes():
    copy = meta_copy(GPT(CONFIG))
    assert copy.lm_head.weight is copy.wte.weight
    assert {p.device.type for p in copy.parameters()} == {"meta"}


def test_the_closed_form_is_within_5_percent_of_the_counted_flops(batch):
    model = GPT(CONFIG)
    per_token = transformer_flops_per_token(
        n_params=matmul_param_count(model),
        n_layers=CONFIG.n_layers,
        n_heads=CONFIG.n_heads,
        head_dim=CONFIG.head_dim,
        seq_len=CONFIG.seq_len,
    )
    tokens = batch[0].numel()
    assert per_token * tokens == pytest.approx(live_step_flops(model, *batch), rel=0.05)


class EncoderLM(torch.nn.Module):
    """Embedding, nn.TransformerEncoder (fused attention in-projection) and an output projection."""

    def __init__(self, vocab: int = 256, d_model: int = 64, n_heads: int = 4, n_layers: int = 2) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d_model)
        layer = torch.nn.TransformerEncoderLayer(d_model, n_heads, 2 * d_model, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(d_model, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(ids)))


def hf_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(
        GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=256, n_positions=64, bos_token_id=0, eos_token_id=0)
    )


def hf_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config)


@pytest.mark.parametrize(
    ("build", "call"),
    [
        (hf_gpt2, lambda model, ids: measure_flops(model, input_ids=ids, labels=ids)),
        (hf_llama, lambda model, ids: measure_flops(model, input_ids=ids, labels=ids)),
        (EncoderLM, lambda model, ids: measure_flops(model, ids, loss_fn=lambda logits: logits.float().sum())),
    ],
    ids=["gpt2-conv1d", "llama", "transformer-encoder"],
)
def test_the_closed_form_counts_every_matmul_weight_within_5_percent_of_flop_counter(build, call):
    # Given a 2-layer, 4-head, d=64 model: GPT-2 (Conv1D), Llama (grouped-query attention, SwiGLU) or
    # nn.TransformerEncoder (fused in-projection); 2 sequences of 64 tokens
    torch.manual_seed(0)
    model = build()
    ids = torch.randint(0, 256, (2, 64))

    # When the closed form counts it, and FlopCounterMode counts a forward + backward (on a meta copy)
    per_token = transformer_flops_per_token(
        n_params=matmul_param_count(model), n_layers=2, n_heads=4, head_dim=16, seq_len=64
    )
    counted = call(model, ids)

    # Then they agree within 5 %
    assert per_token * ids.numel() == pytest.approx(counted, rel=0.05)


def test_matmul_param_count_counts_conv1d_and_fused_in_projections():
    gpt2 = hf_gpt2()
    # Per layer: c_attn 64x192, attn c_proj 64x64, c_fc 64x256, mlp c_proj 256x64; plus the tied 256x64 head
    assert matmul_param_count(gpt2) == 2 * (64 * 192 + 64 * 64 + 64 * 256 + 256 * 64) + 256 * 64
    encoder = EncoderLM()
    # Per layer: in_proj 192x64, out_proj 64x64, linear1 128x64, linear2 64x128; plus the 256x64 head
    assert matmul_param_count(encoder) == 2 * (192 * 64 + 64 * 64 + 2 * 128 * 64) + 256 * 64
    separate = torch.nn.MultiheadAttention(64, 4, kdim=32, vdim=48)
    assert matmul_param_count(separate) == 64 * 64 + 64 * 32 + 64 * 48 + 64 * 64


def test_matmul_param_count_refuses_a_model_it_cannot_count():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Flatten(), torch.nn.Linear(8, 10))
    with pytest.raises(ValueError, match=r"'0.weight' \(8, 3, 3, 3\).*measure_flops"):
        matmul_param_count(model)


def test_closed_form_arithmetic_and_causal_halving():
    # 6N + 12 L H Q T with N=1000, L=2, H=4, Q=8, T=16
    assert transformer_flops_per_token(n_params=1000, n_layers=2, n_heads=4, head_dim=8, seq_len=16) == 6000 + 12288
    assert (
        transformer_flops_per_token(n_params=1000, n_layers=2, n_heads=4, head_dim=8, seq_len=16, causal=True)
        == 6000 + 6144
    )
    assert (
        transformer_flops_per_token(n_params=1000, n_layers=2, n_heads=4, head_dim=8, seq_len=16, training=False)
        == 2000 + 4096
    )


def test_closed_form_rejects_a_bad_shape_naming_it():
    with pytest.raises(ValueError, match="n_layers"):
        transformer_flops_per_token(n_params=10, n_layers=0, n_heads=1, head_dim=1, seq_len=1)


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA A10G", "A10G"),
        ("Tesla V100-SXM2-16GB", "V100 SXM"),
        ("Tesla V100-PCIE-32GB", "V100 PCIe"),
        ("Tesla T4", "T4"),
        ("NeuronCore-v2", "NeuronCore-v2"),
        ("NeuronCore-v3 LNC=2", "NeuronCore-v3 LNC=2"),
        ("NeuronCore-v3", "NeuronCore-v3"),
        ("Trainium2", "NeuronCore-v3"),
    ],
)
def test_device_names_as_torch_reports_them_find_their_row(name, key):
    assert device_key(name) == key


def test_peaks_are_dense_figures():
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.4
    assert peak_tflops("NVIDIA H200", torch.bfloat16) == 989.4
    assert peak_tflops("NVIDIA A100-SXM4-40GB", "tf32") == 156.0


def test_unknown_devices_and_missing_precisions_are_none_never_a_guess():
    assert peak_tflops("NVIDIA GeForce GTX 1080", "bf16") is None
    assert peak_tflops("cpu", "bf16") is None
    assert peak_tflops("Tesla T4", "bf16") is None  # Turing has no bf16 tensor cores


def test_every_table_precision_is_a_known_key():
    assert {precision for row in PEAK_TFLOPS.values() for precision in row} <= {
        precision_key(p) for p in ("bf16", "fp16", "tf32", "fp32", "fp8")
    }
    with pytest.raises(ValueError, match="int3"):
        precision_key("int3")
