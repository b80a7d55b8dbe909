"""Hugging Face models from tiny random configs (no download), written the usual way: labels passed in, the
model's own `.loss` returned."""

import torch

from ortlab import Workload


def _ids(step: int, batch_size: int, seq_len: int, vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch_size, seq_len), generator=torch.Generator().manual_seed(step))


def _own_loss(out, _target):
    return out.loss


def gpt2_own_loss(batch_size: int = 4, seq_len: int = 32):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=128, n_positions=64, n_embd=32, n_layer=2, n_head=2, use_cache=False,
                        attn_implementation="eager")

    def batch(step):
        ids = _ids(step, batch_size, seq_len, config.vocab_size)
        return {"input_ids": ids, "labels": ids}, None

    return Workload(GPT2LMHeadModel(config), batch, _own_loss, name="tiny GPT-2 (own loss)", batch_size=batch_size)


def bert_mlm(attention: str = "eager", batch_size: int = 4, seq_len: int = 32):
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, attn_implementation=attention)

    def batch(step):
        ids = _ids(step, batch_size, seq_len, config.vocab_size)
        labels = torch.where(torch.arange(seq_len) % 7 == 0, ids, torch.full_like(ids, -100))
        return {"input_ids": ids, "labels": labels}, None

    return Workload(BertForMaskedLM(config), batch, _own_loss, name=f"tiny BERT MLM ({attention})",
                    batch_size=batch_size)


def t5(batch_size: int = 4, seq_len: int = 16):
    """T5 with its default dropout (0.1), which its attention applies with nn.functional.dropout."""
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, use_cache=False,
                      decoder_start_token_id=0, pad_token_id=0)
    assert config.dropout_rate == 0.1

    def batch(step):
        ids = _ids(step, batch_size, seq_len, config.vocab_size)
        return {"input_ids": ids, "labels": ids.flip(1)}, None

    return Workload(T5ForConditionalGeneration(config), batch, _own_loss, name="tiny T5", batch_size=batch_size)
