"""nn.MultiheadAttention (and so TransformerEncoderLayer, TransformerDecoderLayer, nn.Transformer) computed as
explicit attention on the module's own projection weights: q, k, v from `in_proj_weight` (or the separate
q/k/v weights), heads split with reshape and permute, softmax(q k^T / sqrt(d) + masks) v, then `out_proj`; the
attention mask (bool or float, 2-D or per head), key_padding_mask, batch_first (the module transposes before the
functional call), need_weights and average_attn_weights, bias_k/bias_v and add_zero_attn as torch has them.
torch's own `F.multi_head_attention_forward` computes its head split from sizes it reads at run time
(`view(tgt_len, bsz * num_heads, head_dim)`), and ORT 1.19.2's symbolic shape inference fails on the Reshape
that makes of it (an AssertionError while ORTModule builds its graph), and with dropout it passes the attention
dropout to scaled_dot_product_attention, whose ONNX Dropout lacks the mask ORT's Dropout gradient needs: ViT and
every nn.Transformer model do not train. Static k/v (`static_k`, `static_v`) are left to torch's function."""

from __future__ import annotations

import math
from typing import Any

from ortlab.compat.blockers import EXPORT_FAILED, NO_GRADIENT, ORT_FAILED
from ortlab.compat.fixes._patch import replacing
from ortlab.compat.registry import Fix, FixKind


def _float_mask(mask: Any, dtype: Any) -> Any:
    import torch

    if mask is None or mask.is_floating_point():
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, float("-inf"))


def multi_head_attention_forward(query: Any, key: Any, value: Any, embed_dim_to_check: int, num_heads: int,
                                 in_proj_weight: Any, in_proj_bias: Any, bias_k: Any, bias_v: Any,
                                 add_zero_attn: bool, dropout_p: float, out_proj_weight: Any, out_proj_bias: Any,
                                 training: bool = True, key_padding_mask: Any = None, need_weights: bool = True,
                                 attn_mask: Any = None, use_separate_proj_weight: bool = False,
                                 q_proj_weight: Any = None, k_proj_weight: Any = None, v_proj_weight: Any = None,
                                 static_k: Any = None, static_v: Any = None, average_attn_weights: bool = True,
                                 is_causal: bool = False, *, original: Any) -> tuple[Any, Any]:
    import torch
    import torch.nn.functional as F

    if static_k is not None or static_v is not None:
        return original(query, key, value, embed_dim_to_check, num_heads, in_proj_weight, in_proj_bias, bias_k,
                        bias_v, add_zero_attn, dropout_p, out_proj_weight, out_proj_bias, training, key_padding_mask,
                        need_weights, attn_mask, use_separate_proj_weight, q_proj_weight, k_proj_weight,
                        v_proj_weight, static_k, static_v, average_attn_weights, is_causal)
    batched = query.dim() == 3
    if not batched:  # (L, E): a batch of one
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
    tgt_len, bsz, embed_dim = query.shape
    head_dim = embed_dim // num_heads
    if use_separate_proj_weight:
        w_q, w_k, w_v = q_proj_weight, k_proj_weight, v_proj_weight
    else:
        w_q, w_k, w_v = in_proj_weight.chunk(3)
    b_q, b_k, b_v = in_proj_bias.chunk(3) if in_proj_bias is not None else (None, None, None)
    q, k, v = F.linear(query, w_q, b_q), F.linear(key, w_k, b_k), F.linear(value, w_v, b_v)
    attn_mask = _float_mask(attn_mask, q.dtype)
    key_padding_mask = _float_mask(key_padding_mask, q.dtype)
    if bias_k is not None and bias_v is not None:
        k = torch.cat([k, bias_k.expand(1, bsz, embed_dim)])
        v = torch.cat([v, bias_v.expand(1, bsz, embed_dim)])
        attn_mask = None if attn_mask is None else F.pad(attn_mask, (0, 1))
        key_padding_mask = None if key_padding_mask is None else F.pad(key_padding_mask, (0, 1))
    # (L, N, E) -> (N, H, L, D)
    q = q.reshape(tgt_len, bsz, num_heads, head_dim).permute(1, 2, 0, 3)
    k = k.reshape(k.shape[0], bsz, num_heads, head_dim).permute(1, 2, 0, 3)
    v = v.reshape(v.shape[0], bsz, num_heads, head_dim).permute(1, 2, 0, 3)
    if add_zero_attn:  # one more key and value of zeros (padded: ORT's gradient of one shared zeros tensor fails)
        k, v = F.pad(k, (0, 0, 0, 1)), F.pad(v, (0, 0, 0, 1))
        attn_mask = None if attn_mask is None else F.pad(attn_mask, (0, 1))
        key_padding_mask = None if key_padding_mask is None else F.pad(key_padding_mask, (0, 1))
    scores = torch.matmul(q * (1.0 / math.sqrt(head_dim)), k.transpose(-2, -1))  # (N, H, L, S)
    if attn_mask is not None:
        mask = attn_mask
        scores = scores + (mask.reshape(bsz, num_heads, tgt_len, -1) if mask.dim() == 3 else mask)
    if key_padding_mask is not None:
        scores = scores + key_padding_mask.reshape(bsz, 1, 1, -1)
    weights = torch.softmax(scores, dim=-1)
    if training and dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    out = torch.matmul(weights, v).permute(2, 0, 1, 3).reshape(tgt_len, bsz, embed_dim)
    out = F.linear(out, out_proj_weight, out_proj_bias)
    if not batched:
        out = out.squeeze(1)
    if not need_weights:
        return out, None
    if average_attn_weights:
        weights = weights.mean(dim=1)
    return out, (weights if batched else weights.squeeze(0))


def uses_attention(model: Any) -> bool:
    import torch

    return any(isinstance(m, torch.nn.MultiheadAttention) for m in model.modules())


def _removes(blocker: Any) -> bool:
    """ORT's failure inside its symbolic shape inference of the head split, and the attention dropout that torch's
    function passes to scaled_dot_product_attention (exported as a Dropout without its mask output, which ORT's
    Dropout gradient needs), on models that hold nn.MultiheadAttention (applies_to narrows it to them)."""
    return (blocker.kind in (ORT_FAILED, EXPORT_FAILED) and blocker.op in ("Reshape", "AssertionError")) or (
        blocker.kind == NO_GRADIENT and blocker.op == "Dropout")


REPLACEMENTS = {"multi_head_attention_forward": multi_head_attention_forward}  # torch.nn.functional name -> its rewrite

FIX = Fix("explicit-attention", "F.multi_head_attention_forward computed as explicit attention on the module's "
          "own weights", FixKind.MODULE, removes=_removes, apply=replacing(REPLACEMENTS), applies_to=uses_attention)
