"""matplotlib behind the `plots` extra, for the training plots (`rmkit.trainer.logging.plots`) and the eval report's
figures (`rmkit.report.plots`)."""

from __future__ import annotations

import sys


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only), or None with a note when matplotlib is absent."""
    try:
        import matplotlib
    except ImportError:
        print("rmkit: matplotlib is not installed; no plots (pip install 'rmkit[plots]')", file=sys.stderr)
        return None
    matplotlib.use("Agg")  # files only; never open a window
    import matplotlib.pyplot as plt

    return plt
