"""Models at the sizes people train, with random weights (no download): what the verdict's memory is measured on
(benchmarks/verdict_scale.py, scripts/gpu_check --scale). Each is a factory: `ortlab burst --model
ortlab.demo.sizes:gpt2 --model-arg n_layer=24 --model-arg n_embd=1024 --model-arg n_head=16` is GPT-2 medium.

- `gpt2(n_layer=12, n_embd=768, n_head=12)`: GPT-2's shapes (vocabulary 50257, tied embeddings), batch 2 x 128:
  2 layers 53M parameters, 6 layers 81M, 12 layers (GPT-2 small) 124M, `medium()` 355M;
- `llama_1b()`: Llama 3.2 1B's shapes (16 layers, hidden 2048, 32 heads and 8 key-value heads, vocabulary 128256,
  tied embeddings), 1.24B parameters, batch 1 x 256.
"""

from __future__ import annotations

import torch

from ortlab.workload import Workload


def _lm(model: torch.nn.Module, vocab: int, batch: int, seq: int, name: str) -> Workload:
    def data(step: int):
        ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(step))
        return {"input_ids": ids, "labels": ids}, None

    return Workload(model, data, lambda out, _target: out.loss, name=name, batch_size=batch)


def gpt2(n_layer: int = 12, n_embd: int = 768, n_head: int = 12, batch: int = 2, seq: int = 128) -> Workload:
    """GPT-2 of `n_layer` layers of width `n_embd`, random weights; its own loss on random token ids."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_positions=max(1024, seq), use_cache=False)
    params = "small" if (n_layer, n_embd) == (12, 768) else "medium" if (n_layer, n_embd) == (24, 1024) else \
        f"{n_layer} layers, width {n_embd}"
    return _lm(GPT2LMHeadModel(config), config.vocab_size, batch, seq, f"GPT-2 {params} (random weights)")


def medium() -> Workload:
    """GPT-2 medium's shapes: 24 layers of width 1024, 16 heads (355M parameters)."""
    return gpt2(24, 1024, 16)


def llama_1b(batch: int = 1, seq: int = 256, n_layer: int = 16) -> Workload:
    """Llama 3.2 1B's shapes, random weights (1.24B parameters with 16 layers)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=n_layer,
                         num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=max(2048, seq),
                         tie_word_embeddings=True, use_cache=False, rope_theta=500000.0)
    return _lm(LlamaForCausalLM(config), config.vocab_size, batch, seq, "Llama 1B shapes (random weights)")
