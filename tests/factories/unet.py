"""A small U-Net as people write them: two down blocks, a bottleneck, two up blocks, each Conv-BatchNorm-ReLU (5
BatchNorms), skip connections, transposed convolutions to go up, a 1x1 head; trained with a per-pixel loss."""

import torch
from torch import nn
from torch.nn import functional as F


def block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class UNet(nn.Module):
    def __init__(self, channels=3, classes=2, width=8):
        super().__init__()
        self.down1, self.down2 = block(channels, width), block(width, 2 * width)
        self.bottleneck = block(2 * width, 4 * width)
        self.up2 = nn.ConvTranspose2d(4 * width, 2 * width, 2, stride=2)
        self.dec2 = block(4 * width, 2 * width)
        self.up1 = nn.ConvTranspose2d(2 * width, width, 2, stride=2)
        self.dec1 = block(2 * width, width)
        self.head = nn.Conv2d(width, classes, 1)

    def forward(self, x):
        d1 = self.down1(x)
        d2 = self.down2(F.max_pool2d(d1, 2))
        b = self.bottleneck(F.max_pool2d(d2, 2))
        u2 = self.dec2(torch.cat([self.up2(b), d2], 1))
        u1 = self.dec1(torch.cat([self.up1(u2), d1], 1))
        return self.head(u1)


def _batch(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(2, 3, 16, 16, generator=g), torch.randint(0, 2, (2, 16, 16), generator=g)


def unet():
    return UNet(), _batch, F.cross_entropy
