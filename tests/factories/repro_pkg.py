"""The localizer's correct network with its SE blocks of a class defined in a module that imports from its own
package (relatively, as torchvision's SqueezeExcitation does): a repro script must import it as part of its
package, from wherever it runs."""

from torch.nn import functional as F

from .localize import Net, SqueezeExcite, _batch


class PackagedSqueezeExcite(SqueezeExcite):
    """SqueezeExcite, defined here."""


def correct():
    net = Net(mean=True)
    for block in net.blocks:
        block.se = PackagedSqueezeExcite(8, 4, mean=True)
    return net, _batch, F.cross_entropy
