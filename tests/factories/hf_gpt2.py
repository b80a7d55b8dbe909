"""A Hugging Face GPT-2 from a tiny random config (no download) through ortlab's factory protocol."""

import torch

from ortlab import Workload


def tiny_gpt2(batch_size: int = 4, seq_len: int = 32):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=128, n_positions=64, n_embd=32, n_layer=2, n_head=2, use_cache=False,
                        attn_implementation="eager")
    model = GPT2LMHeadModel(config)

    def batch(step):
        g = torch.Generator().manual_seed(step)
        ids = torch.randint(0, config.vocab_size, (batch_size, seq_len), generator=g)
        return {"input_ids": ids}, ids

    def loss(out, ids):  # computed outside the model, in PyTorch, as the verified GPT-2 recipe does
        logits = out["logits"][:, :-1]
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))

    return Workload(model, batch, loss, name="tiny GPT-2", batch_size=batch_size)
