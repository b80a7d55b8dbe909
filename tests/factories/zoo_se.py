"""torchvision 0.21's EfficientNet-B0 and RegNetY-400MF from the zoo side folder ($ORTLAB_ZOO_PACKAGES, put first
on sys.path here, in the process that builds the model): random weights, 10 classes, batch 2 at 64x64, trained
as a burst trains them (BatchNorm in train mode). ORT's CPU gradients of their squeeze-and-excitation blocks are
wrong."""

import os
import sys

import torch
from torch.nn import functional as F


def _torchvision():
    folder = os.environ.get("ORTLAB_ZOO_PACKAGES")
    if folder and folder not in sys.path:
        sys.path.insert(0, folder)
    import torchvision

    return torchvision


def _batch(step):
    g = torch.Generator().manual_seed(step)
    return (torch.randn(2, 3, 64, 64, generator=g),), torch.randint(0, 10, (2,), generator=g)


def efficientnet_b0():
    return _torchvision().models.efficientnet_b0(num_classes=10), _batch, F.cross_entropy


def regnet_y_400mf():
    return _torchvision().models.regnet_y_400mf(num_classes=10), _batch, F.cross_entropy
