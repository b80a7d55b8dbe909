"""Hugging Face Trainers a factory returns (ortlab.integrations.trainer), built from a tiny random Llama (no
download): `ortlab burst --model ortlab.demo.trainers:lora_llama --backend both --parity --fix auto`.

The Trainer is written the way people fine-tune: a PEFT LoRA adapter on q_proj and v_proj, the model's
`use_cache` left on (decoders' default: ORTModule cannot take the KV cache it returns, which the fix
no-kv-cache turns off for the burst), gradient accumulation, clipping, a warmup."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

VOCAB, HIDDEN, LAYERS, HEADS, SEQ, BATCH, SAMPLES = 128, 32, 2, 4, 16, 2, 32


class Tokens(torch.utils.data.Dataset):
    """Random token sequences, the same for a seed: the labels are the inputs (a causal LM shifts them)."""

    def __init__(self, samples: int = SAMPLES, seq: int = SEQ, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (samples, seq), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        ids = self.ids[i]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def tiny_llama() -> Any:
    """A tiny random LlamaForCausalLM, use_cache on (its default)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                         num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=2,
                         max_position_embeddings=2 * SEQ)
    return LlamaForCausalLM(config)


def lora_llama(accumulation: int = 2, max_grad_norm: float = 1.0, warmup_steps: int = 2, lr: float = 1e-3,
               out: str | None = None) -> Any:
    """A Trainer (not yet trained) of a LoRA adapter (r=4 on q_proj and v_proj) on a tiny Llama: AdamW with weight
    decay, linear warmup then decay, `accumulation` micro-batches per step, gradients clipped to
    `max_grad_norm`. `out`: the Trainer's output_dir (default: `ortlab-trainer` in the temporary folder; a burst
    writes nothing there)."""
    from peft import LoraConfig, get_peft_model
    from transformers import Trainer, TrainingArguments, default_data_collator

    model = get_peft_model(tiny_llama(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                    lora_dropout=0.0))
    # save_strategy "no": nothing is written there, so one shared name serves every call (no folder per call)
    args = TrainingArguments(output_dir=out or str(Path(tempfile.gettempdir()) / "ortlab-trainer"), report_to="none",
                             per_device_train_batch_size=BATCH, gradient_accumulation_steps=accumulation,
                             max_grad_norm=max_grad_norm, warmup_steps=warmup_steps, learning_rate=lr,
                             weight_decay=0.01, max_steps=20, seed=0, use_cpu=True, logging_steps=1,
                             save_strategy="no", dataloader_pin_memory=False, disable_tqdm=True)
    return Trainer(model=model, args=args, train_dataset=Tokens(), data_collator=default_data_collator)
