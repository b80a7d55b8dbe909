"""Hugging Face model families from tiny random configs (no download), written the way people train them: labels
passed in, the model's own loss returned, the attention implementation transformers picks by default. Each is a
factory: `ortlab check --model ortlab.demo.families:llama`, `ortlab burst --model ortlab.demo.families:t5`.

`docs/compatibility.md` says which of them train on ORTModule, with which fixes, for each tested transformers
release (scripts/compatibility.py writes it; tests/test_families.py checks it)."""

from __future__ import annotations

from typing import Any

import torch

from ortlab.workload import Workload

VOCAB, HIDDEN, LAYERS, HEADS, SEQ, BATCH = 128, 32, 2, 4, 16, 2


def _ids(step: int, shape: tuple[int, ...], high: int = VOCAB) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(step))


def _own_loss(out: Any, _target: Any) -> torch.Tensor:
    return out.loss


def _causal_lm(config: Any, model_class: Any, name: str) -> Workload:
    def batch(step: int):
        ids = _ids(step, (BATCH, SEQ))
        return {"input_ids": ids, "labels": ids}, None

    return Workload(model_class(config), batch, _own_loss, name=name, batch_size=BATCH)


def _masked_lm(config: Any, model_class: Any, name: str) -> Workload:
    def batch(step: int):
        ids = _ids(step, (BATCH, SEQ), VOCAB - 2) + 2  # 0 and 1 stay out: padding ids of some families
        labels = torch.where(torch.arange(SEQ) % 5 == 0, ids, torch.full_like(ids, -100))
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}, None

    return Workload(model_class(config), batch, _own_loss, name=name, batch_size=BATCH)


def _decoder_config(config_class: Any, **extra: Any) -> Any:
    return config_class(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                        num_hidden_layers=LAYERS, num_attention_heads=HEADS, max_position_embeddings=2 * SEQ,
                        use_cache=False, **extra)


def gpt2() -> Workload:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=VOCAB, n_positions=2 * SEQ, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS,
                        use_cache=False)
    return _causal_lm(config, GPT2LMHeadModel, "tiny GPT-2")


def llama() -> Workload:
    from transformers import LlamaConfig, LlamaForCausalLM

    return _causal_lm(_decoder_config(LlamaConfig, num_key_value_heads=2), LlamaForCausalLM, "tiny Llama")


def qwen2() -> Workload:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return _causal_lm(_decoder_config(Qwen2Config, num_key_value_heads=2), Qwen2ForCausalLM, "tiny Qwen2")


def mistral() -> Workload:
    from transformers import MistralConfig, MistralForCausalLM

    return _causal_lm(_decoder_config(MistralConfig, num_key_value_heads=2), MistralForCausalLM, "tiny Mistral")


def phi3() -> Workload:
    from transformers import Phi3Config, Phi3ForCausalLM

    config = _decoder_config(Phi3Config, num_key_value_heads=HEADS, pad_token_id=0)
    return _causal_lm(config, Phi3ForCausalLM, "tiny Phi-3")


def gpt_neox() -> Workload:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    return _causal_lm(_decoder_config(GPTNeoXConfig), GPTNeoXForCausalLM, "tiny GPT-NeoX")


def bert() -> Workload:
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                        intermediate_size=2 * HIDDEN, max_position_embeddings=2 * SEQ)
    return _masked_lm(config, BertForMaskedLM, "tiny BERT")


def roberta() -> Workload:
    from transformers import RobertaConfig, RobertaForMaskedLM

    config = RobertaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                           num_attention_heads=HEADS, intermediate_size=2 * HIDDEN,
                           max_position_embeddings=2 * SEQ + 2, pad_token_id=1)
    return _masked_lm(config, RobertaForMaskedLM, "tiny RoBERTa")


def t5() -> Workload:
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(vocab_size=VOCAB, d_model=HIDDEN, d_kv=HIDDEN // HEADS, d_ff=2 * HIDDEN, num_layers=LAYERS,
                      num_heads=HEADS, use_cache=False, decoder_start_token_id=0, pad_token_id=0)

    def batch(step: int):
        ids = _ids(step, (BATCH, SEQ), VOCAB - 1) + 1
        return {"input_ids": ids, "labels": ids.flip(1)}, None

    return Workload(T5ForConditionalGeneration(config), batch, _own_loss, name="tiny T5", batch_size=BATCH)


def vit() -> Workload:
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                       num_attention_heads=HEADS, intermediate_size=2 * HIDDEN, num_labels=10)

    def batch(step: int):
        g = torch.Generator().manual_seed(step)
        return {"pixel_values": torch.randn(BATCH, 3, 32, 32, generator=g),
                "labels": torch.randint(0, 10, (BATCH,), generator=g)}, None

    return Workload(ViTForImageClassification(config), batch, _own_loss, name="tiny ViT", batch_size=BATCH)


FAMILIES = ("gpt2", "llama", "qwen2", "mistral", "phi3", "gpt_neox", "bert", "roberta", "t5", "vit")
