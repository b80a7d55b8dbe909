"""timm classifiers no one here wrote, as factories for `check`, the compatibility page and the tests:
`ortlab check --model ortlab.demo.zoo:poolformerv2_s12` with timm importable (the side folder
$ORTLAB_ZOO_PACKAGES first on PYTHONPATH). Random weights (pretrained=False, no download), a small input (batch 2,
64x64), 10 classes, cross-entropy on random labels."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ortlab.workload import Workload

BATCH, SIZE, CLASSES = 2, 64, 10


def timm_model(name: str, label: str) -> Workload:
    """timm model `name` (random weights) on random images: `label` is what the tables call it."""
    try:
        import timm
    except ImportError as e:
        from ortlab.errors import InputError

        raise InputError("ortlab.demo.zoo needs timm: put the side folder $ORTLAB_ZOO_PACKAGES first on PYTHONPATH "
                         "(bin/_env.sh sets it)") from e
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=CLASSES)

    def batch(step: int) -> tuple[Any, Any]:
        g = torch.Generator().manual_seed(step)
        return torch.randn(BATCH, 3, SIZE, SIZE, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g)

    return Workload(model, batch, F.cross_entropy, name=label, batch_size=BATCH)


def poolformerv2_s12() -> Workload:
    """GroupNorm with one group and no bias (GroupNorm1NoBias): exported as InstanceNormalization."""
    return timm_model("poolformerv2_s12", "timm PoolFormerV2-S12")


def edgenext_xx_small() -> Workload:
    """Fails in ORT's symbolic shape inference after export."""
    return timm_model("edgenext_xx_small", "timm EdgeNeXt-XXS")


MODELS = {"poolformerv2_s12": poolformerv2_s12, "edgenext_xx_small": edgenext_xx_small}
