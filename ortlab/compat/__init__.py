"""Will a model train on ORTModule: every blocker at once with its module and source line (`check`), and the
registry of fixes that remove blockers without changing the model's math (`registry.FIXES`)."""

from ortlab.compat.blockers import Blocker
from ortlab.compat.registry import FIXES, Fix, FixError

__all__ = ["FIXES", "Blocker", "Fix", "FixError"]
