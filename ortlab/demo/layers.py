"""The common torch.nn layers, each in a small model built around it, as a new user would write it: which train on
ORTModule as they are, which with an ortlab fix, which are blocked and why (`docs/compatibility.md`, "torch.nn
layers", written by scripts/compatibility.py; tests/test_layers.py checks it). Each is a factory:
`ortlab check --model ortlab.demo.layers:hardswish`. `mobilenet` and `vit` are small whole models made of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ortlab.workload import Workload

BATCH, CHANNELS, SIZE, SEQ, WIDTH, VOCAB = 2, 8, 8, 6, 16, 32


def _randn(step: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(step))


def _ints(step: int, high: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(1000 + step))


def _mse(out: Any, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out, target)


def _own(out: torch.Tensor, _target: Any) -> torch.Tensor:
    return out


def _image(model: nn.Module, name: str, out_shape: tuple[int, ...], channels: int = CHANNELS,
           size: int = SIZE, dims: int = 2) -> Workload:
    def batch(step: int):
        return _randn(step, BATCH, channels, *(size,) * dims), _randn(10_000 + step, BATCH, *out_shape)

    return Workload(model, batch, _mse, name=name, batch_size=BATCH)


def _sequence(model: nn.Module, name: str, out_width: int = WIDTH, time_first: bool = True) -> Workload:
    def batch(step: int):
        shape = (SEQ, BATCH) if time_first else (BATCH, SEQ)
        return _randn(step, *shape, WIDTH), _randn(10_000 + step, *shape, out_width)

    return Workload(model, batch, _mse, name=name, batch_size=BATCH)


class _Stack(nn.Sequential):
    """nn.Sequential that keeps the first output of modules returning tuples (RNNs, attention)."""

    def forward(self, x):
        for module in self:
            x = module(x)
            if isinstance(x, tuple):
                x = x[0]
        return x


def _conv_block(*layers: nn.Module) -> nn.Module:
    return nn.Sequential(nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1), *layers)


# ---------------------------------------------------------------- the layers

def conv_bn_relu() -> Workload:
    model = nn.Sequential(nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1, bias=False), nn.BatchNorm2d(CHANNELS),
                          nn.ReLU())  # no bias before a norm that removes it (its gradient is zero)
    return _image(model, "Conv2d + BatchNorm2d + ReLU", (CHANNELS, SIZE, SIZE))


def conv1d_bn() -> Workload:
    model = nn.Sequential(nn.Conv1d(CHANNELS, CHANNELS, 3, padding=1, bias=False), nn.BatchNorm1d(CHANNELS),
                          nn.ReLU())
    return _image(model, "Conv1d + BatchNorm1d", (CHANNELS, SIZE), dims=1)


def conv3d() -> Workload:
    return _image(nn.Sequential(nn.Conv3d(CHANNELS, 4, 3, padding=1), nn.ReLU()), "Conv3d", (4, 4, 4, 4),
                  size=4, dims=3)


def groupnorm_silu() -> Workload:
    return _image(_conv_block(nn.GroupNorm(2, CHANNELS), nn.SiLU()), "GroupNorm + SiLU", (CHANNELS, SIZE, SIZE))


def adaptive_avg_pool() -> Workload:
    return _image(_conv_block(nn.AdaptiveAvgPool2d(4)), "AdaptiveAvgPool2d(4)", (CHANNELS, 4, 4))


def depthwise_relu6() -> Workload:
    model = nn.Sequential(nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1, groups=CHANNELS), nn.ReLU6())
    return _image(model, "depthwise Conv2d + ReLU6", (CHANNELS, SIZE, SIZE))


def hardswish() -> Workload:
    return _image(_conv_block(nn.Hardswish()), "Hardswish", (CHANNELS, SIZE, SIZE))


def hardsigmoid() -> Workload:
    return _image(_conv_block(nn.Hardsigmoid()), "Hardsigmoid", (CHANNELS, SIZE, SIZE))


def mish() -> Workload:
    return _image(_conv_block(nn.Mish()), "Mish", (CHANNELS, SIZE, SIZE))


def elu() -> Workload:
    return _image(_conv_block(nn.ELU()), "ELU", (CHANNELS, SIZE, SIZE))


def prelu() -> Workload:
    return _image(_conv_block(nn.PReLU(CHANNELS)), "PReLU", (CHANNELS, SIZE, SIZE))


def pixel_shuffle() -> Workload:
    model = nn.Sequential(nn.Conv2d(CHANNELS, 4 * 4, 3, padding=1), nn.PixelShuffle(2))
    return _image(model, "PixelShuffle", (4, 2 * SIZE, 2 * SIZE))


def instance_norm() -> Workload:
    model = nn.Sequential(nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1, bias=False),  # a bias the norm removes
                          nn.InstanceNorm2d(CHANNELS, affine=True), nn.ReLU())
    return _image(model, "InstanceNorm2d", (CHANNELS, SIZE, SIZE))


def conv_transpose() -> Workload:
    model = nn.Sequential(nn.ConvTranspose2d(CHANNELS, 4, 4, stride=2, padding=1), nn.ReLU())
    return _image(model, "ConvTranspose2d", (4, 2 * SIZE, 2 * SIZE))


def upsample_bilinear() -> Workload:
    model = nn.Sequential(nn.Conv2d(CHANNELS, 4, 1), nn.Upsample(scale_factor=2, mode="bilinear"))
    return _image(model, "Upsample(bilinear)", (4, 2 * SIZE, 2 * SIZE))


def upsample_nearest() -> Workload:
    model = nn.Sequential(nn.Conv2d(CHANNELS, 4, 1), nn.Upsample(scale_factor=2, mode="nearest"))
    return _image(model, "Upsample(nearest)", (4, 2 * SIZE, 2 * SIZE))


def dropout() -> Workload:
    return _image(_conv_block(nn.ReLU(), nn.Dropout(0.1)), "Dropout", (CHANNELS, SIZE, SIZE))


def dropout2d() -> Workload:
    return _image(_conv_block(nn.ReLU(), nn.Dropout2d(0.1)), "Dropout2d", (CHANNELS, SIZE, SIZE))


def alpha_dropout() -> Workload:
    return _image(_conv_block(nn.SELU(), nn.AlphaDropout(0.1)), "SELU + AlphaDropout", (CHANNELS, SIZE, SIZE))


def layernorm_gelu() -> Workload:
    return _sequence(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.LayerNorm(WIDTH), nn.GELU()), "LayerNorm + GELU")


def layernorm_no_bias() -> Workload:
    return _sequence(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.LayerNorm(WIDTH, bias=False), nn.GELU(),
                                   nn.Linear(WIDTH, WIDTH), nn.LayerNorm(WIDTH, bias=False)),
                     "LayerNorm(bias=False), twice")


def groupnorm_no_bias() -> Workload:
    norm = nn.GroupNorm(1, CHANNELS)  # timm's GroupNorm1NoBias (PoolFormerV2): one group, no bias
    norm.bias = None
    return _image(_conv_block(norm, nn.SiLU()), "GroupNorm(1 group, no bias)", (CHANNELS, SIZE, SIZE))


def rms_norm() -> Workload:
    return _sequence(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.RMSNorm(WIDTH)), "RMSNorm")


def softmax() -> Workload:
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Softmax(-1), nn.Linear(WIDTH, WIDTH), nn.LogSoftmax(-1))
    return _sequence(model, "Softmax + LogSoftmax")


def lstm() -> Workload:
    return _sequence(_Stack(nn.LSTM(WIDTH, WIDTH, num_layers=2)), "LSTM (2 layers)")


def lstm_bidirectional() -> Workload:
    return _sequence(_Stack(nn.LSTM(WIDTH, WIDTH // 2, bidirectional=True)), "LSTM(bidirectional)")


def gru_bidirectional() -> Workload:
    return _sequence(_Stack(nn.GRU(WIDTH, WIDTH // 2, bidirectional=True)), "GRU(bidirectional)")


def rnn() -> Workload:
    return _sequence(_Stack(nn.RNN(WIDTH, WIDTH)), "RNN")


class _CausalAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)

    def forward(self, x):
        q, k, v = self.qkv(x).reshape(x.shape[0], x.shape[1], 3, 4, WIDTH // 4).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(1, 2).reshape(x.shape)


def sdpa_causal() -> Workload:
    return _sequence(_CausalAttention(), "scaled_dot_product_attention(causal)", time_first=False)


class _SelfAttention(nn.Module):
    """nn.MultiheadAttention as people call it: batch first, a key padding mask, the weights returned."""

    def __init__(self):
        super().__init__()
        self.attention = nn.MultiheadAttention(WIDTH, 4, batch_first=True)

    def forward(self, x):
        padding = torch.zeros(x.shape[:2], dtype=torch.bool, device=x.device)
        padding[:, -1] = True
        out, _weights = self.attention(x, x, x, key_padding_mask=padding, need_weights=True)
        return out


def multihead_attention() -> Workload:
    return _sequence(_SelfAttention(), "MultiheadAttention", time_first=False)


def transformer_encoder_layer() -> Workload:
    return _sequence(nn.TransformerEncoderLayer(WIDTH, 4, 2 * WIDTH, dropout=0.1, batch_first=True),
                     "TransformerEncoderLayer", time_first=False)


class _Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.transformer = nn.Transformer(WIDTH, 4, 1, 1, 2 * WIDTH, dropout=0.1)

    def forward(self, x):
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[0])
        return self.transformer(x, x, tgt_mask=mask)


def transformer() -> Workload:
    return _sequence(_Transformer(), "Transformer")


class _Ids(nn.Module):
    def __init__(self, embedding: nn.Module):
        super().__init__()
        self.embedding = embedding
        self.head = nn.Linear(WIDTH, WIDTH)

    def forward(self, ids):
        return self.head(self.embedding(ids))


def _ids(model: nn.Module, name: str, bags: bool = False) -> Workload:
    def batch(step: int):
        ids = _ints(step, VOCAB, BATCH, SEQ)
        ids[:, -1] = 0  # padding
        return ids, _randn(10_000 + step, BATCH, *(() if bags else (SEQ,)), WIDTH)

    return Workload(model, batch, _mse, name=name, batch_size=BATCH)


def embedding_padding() -> Workload:
    return _ids(_Ids(nn.Embedding(VOCAB, WIDTH, padding_idx=0)), "Embedding(padding_idx)")


def embedding_max_norm() -> Workload:
    return _ids(_Ids(nn.Embedding(VOCAB, WIDTH, max_norm=1.0)), "Embedding(max_norm)")


def embedding_bag() -> Workload:
    return _ids(_Ids(nn.EmbeddingBag(VOCAB, WIDTH, mode="mean", padding_idx=0)), "EmbeddingBag(mean)", bags=True)


def embedding_bag_2d() -> Workload:
    return _ids(_Ids(nn.EmbeddingBag(VOCAB, WIDTH, mode="mean")), "EmbeddingBag(mean), 2-D ids, no offsets",
                bags=True)


class _Classifier(nn.Module):
    """A loss computed inside forward, as Hugging Face models compute theirs."""

    def __init__(self, loss: Callable[..., torch.Tensor]):
        super().__init__()
        self.head = nn.Linear(WIDTH, 5)
        self.loss = loss

    def forward(self, x, labels):
        return self.loss(self.head(x), labels)


def _classifier(loss: Callable[..., torch.Tensor], name: str, targets: Callable[[int], Any]) -> Workload:
    def batch(step: int):
        return (_randn(step, SEQ, BATCH, WIDTH), targets(step)), None

    return Workload(_Classifier(loss), batch, _own, name=name, batch_size=BATCH)


def _smoothed(logits, labels):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), label_smoothing=0.1)


def cross_entropy_smoothing() -> Workload:
    return _classifier(_smoothed, "CrossEntropyLoss(label_smoothing)", lambda step: _ints(step, 5, SEQ, BATCH))


def _ctc(logits, labels):
    lengths = torch.full((logits.shape[1],), logits.shape[0], dtype=torch.long)
    return F.ctc_loss(logits.log_softmax(-1), labels, lengths, torch.full_like(lengths, labels.shape[1]))


def ctc() -> Workload:
    return _classifier(_ctc, "CTCLoss", lambda step: _ints(step, 4, BATCH, 3) + 1)


# name -> factory, in the table's order: the 19 layers a first survey tried first, then the rest of the common ones
LAYERS: dict[str, Callable[[], Workload]] = {f.__name__: f for f in (
    conv_bn_relu, groupnorm_silu, adaptive_avg_pool, depthwise_relu6, layernorm_gelu, lstm, sdpa_causal,
    embedding_padding, hardswish, mish, pixel_shuffle, instance_norm, rms_norm, gru_bidirectional,
    multihead_attention, transformer_encoder_layer, embedding_bag, conv_transpose, upsample_bilinear,
    conv1d_bn, conv3d, hardsigmoid, elu, prelu, dropout, dropout2d, alpha_dropout, softmax, upsample_nearest,
    lstm_bidirectional, rnn, transformer, embedding_max_norm, cross_entropy_smoothing, ctc, layernorm_no_bias,
    groupnorm_no_bias, embedding_bag_2d)}


# ---------------------------------------------------------------- whole models made of the layers above

class _SqueezeExcite(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.reduce = nn.Conv2d(channels, channels // 4, 1)
        self.expand = nn.Conv2d(channels // 4, channels, 1)

    def forward(self, x):
        return x * F.hardsigmoid(self.expand(F.relu(self.reduce(self.pool(x)))))


class _InvertedResidual(nn.Module):
    """MobileNetV3's block: 1x1 expansion, depthwise 3x3, squeeze-and-excitation, 1x1 projection, Hardswish."""

    def __init__(self, channels: int, expanded: int):
        super().__init__()
        self.block = nn.Sequential(
            nn.Conv2d(channels, expanded, 1, bias=False), nn.BatchNorm2d(expanded), nn.Hardswish(),
            nn.Conv2d(expanded, expanded, 3, padding=1, groups=expanded, bias=False), nn.BatchNorm2d(expanded),
            nn.Hardswish(), _SqueezeExcite(expanded), nn.Conv2d(expanded, channels, 1, bias=False),
            nn.BatchNorm2d(channels))

    def forward(self, x):
        return x + self.block(x)


class MobileNetV3Small(nn.Module):
    """A small MobileNetV3: Hardswish stem, two inverted residual blocks with squeeze-and-excitation, a
    Hardswish classifier head."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16),
                                  nn.Hardswish())
        self.blocks = nn.Sequential(_InvertedResidual(16, 32), _InvertedResidual(16, 48))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 32), nn.Hardswish(),
                                  nn.Dropout(0.2), nn.Linear(32, classes))

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)))


class ViT(nn.Module):
    """A small vision transformer: patch embedding by a strided convolution, a class token, learned positions,
    pre-norm TransformerEncoderLayers (nn.MultiheadAttention inside), a LayerNorm and a linear head."""

    def __init__(self, image: int = 16, patch: int = 4, width: int = 32, depth: int = 2, classes: int = 10):
        super().__init__()
        self.patches = nn.Conv2d(3, width, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, width))
        self.positions = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, width) * 0.02)
        layer = nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.1, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        x = self.patches(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.positions
        return self.head(self.norm(self.encoder(x))[:, 0])


def _classify(model: nn.Module, name: str, image: int) -> Workload:
    def batch(step: int):
        return _randn(step, BATCH * 2, 3, image, image), _ints(step, 10, BATCH * 2)

    return Workload(model, batch, F.cross_entropy, name=name, batch_size=BATCH * 2)


def mobilenet() -> Workload:
    return _classify(MobileNetV3Small(), "MobileNetV3-style (small)", 32)


def vit() -> Workload:
    return _classify(ViT(), "ViT-style (small)", 16)


class _AllLayers(nn.Module):
    """Several layer models side by side, each on its own input, their outputs concatenated."""

    def __init__(self, models: dict[str, nn.Module]):
        super().__init__()
        self.layers = nn.ModuleDict(models)

    def forward(self, **inputs):
        return torch.cat([self.layers[name](x).reshape(-1) for name, x in inputs.items()])


def all_layers() -> Workload:
    """The first 19 layers of LAYERS in one model: what `ortlab check` meets on a model holding all of them."""
    workloads = {name: LAYERS[name]() for name in list(LAYERS)[:19]}

    def batch(step: int):
        pairs = {name: w.batch(step) for name, w in workloads.items()}
        return ({name: x for name, (x, _) in pairs.items()},
                torch.cat([t.reshape(-1) for _, t in pairs.values()]))

    return Workload(_AllLayers({name: w.model for name, w in workloads.items()}), batch, _mse,
                    name="19 torch.nn layers", batch_size=BATCH)
