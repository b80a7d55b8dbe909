"""Classifiers no one at ortlab wrote, as a new user would train them: torchvision 0.21 and timm 1.0.31 (the zoo side
folder, $ORTLAB_ZOO_PACKAGES, first on PYTHONPATH), random weights, stochastic depth off (a random op parity mode
does not know), batch 2 of 64x64 images (32x32 for the heavier ones), 10 classes, cross-entropy; and two small
conv nets with BatchNorm and InstanceNorm. A factory with `seed` starts from another initialization. The verdict's
zoo (tests/test_verdict_zoo.py, docs/convergence.md)."""
import torch
import torch.nn.functional as F

from ortlab import Workload

BATCH, CLASSES = 2, 10


def _images(size: int):
    def batch(step: int):
        g = torch.Generator().manual_seed(step)
        return torch.randn(BATCH, 3, size, size, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g)

    return batch


def _classifier(model: torch.nn.Module, name: str, size: int = 64) -> Workload:
    return Workload(model, _images(size), F.cross_entropy, name=name, batch_size=BATCH)


def resnet18():
    from torchvision.models import resnet18

    return _classifier(resnet18(num_classes=CLASSES), "torchvision ResNet-18")


def mnasnet0_5(seed: int | None = None):
    """`seed`: another start (torch seeded with it before the model is made; `--model-arg seed=7`)."""
    from torchvision.models import mnasnet0_5

    if seed is not None:
        torch.manual_seed(seed)
    return _classifier(mnasnet0_5(num_classes=CLASSES), "torchvision MNASNet 0.5" + (
        f" (start {seed})" if seed is not None else ""))


def efficientnet_b0():
    from torchvision.models import efficientnet_b0

    return _classifier(efficientnet_b0(num_classes=CLASSES, stochastic_depth_prob=0.0), "torchvision EfficientNet-B0")


def regnet_y_400mf():
    from torchvision.models import regnet_y_400mf

    return _classifier(regnet_y_400mf(num_classes=CLASSES), "torchvision RegNetY-400MF")


def convnext_tiny():
    from torchvision.models import convnext_tiny

    return _classifier(convnext_tiny(num_classes=CLASSES, stochastic_depth_prob=0.0), "torchvision ConvNeXt-T", size=32)


def timm_efficientnet_b0():
    import timm

    return _classifier(timm.create_model("efficientnet_b0", num_classes=CLASSES), "timm EfficientNet-B0")


def timm_levit_128s():
    import timm

    return _classifier(timm.create_model("levit_128s", num_classes=CLASSES, img_size=64), "timm LeViT-128S")


class _Norms(torch.nn.Module):
    """A small conv net as a new user writes it: conv (with its bias) + norm + ReLU, twice, then a linear head."""

    def __init__(self, norm):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), norm(8), torch.nn.ReLU(),
                                        torch.nn.Conv2d(8, 8, 3, padding=1), norm(8), torch.nn.ReLU())
        self.head = torch.nn.Linear(8, CLASSES)

    def forward(self, x):
        return self.head(self.body(x).mean((-2, -1)))


def batch_norm():
    return _classifier(_Norms(torch.nn.BatchNorm2d), "Conv2d + BatchNorm2d + ReLU", size=32)


def instance_norm():
    return _classifier(_Norms(lambda c: torch.nn.InstanceNorm2d(c, affine=True)), "Conv2d + InstanceNorm2d + ReLU",
                       size=32)
