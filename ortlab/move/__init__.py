"""Stay or move: what an ORTModule run's options become on the newest torch (`mapping`), and the move report that
sets its measured figures and verdict beside a torch.compile run's (`report`; `ortlab move`, the Lab's Move tab)."""

from __future__ import annotations

from ortlab.common.lazy import lazy as _lazy

_EXPORTS = {"move_report": "ortlab.move.report", "MoveReport": "ortlab.move.report",
            "MoveError": "ortlab.move.report", "MAPPING": "ortlab.move.mapping", "equivalent": "ortlab.move.mapping",
            "Fit": "ortlab.move.mapping"}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = _lazy(__name__, _EXPORTS, globals())
