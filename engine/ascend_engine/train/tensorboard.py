"""``--tensorboard-dir``: scalars through torch's SummaryWriter when the ``tensorboard`` package is installed.

It is optional (the training image need not carry it); without it the run says so once and goes on.
"""
from __future__ import annotations

import sys


def open_tensorboard(directory: str | None):
    """A SummaryWriter on ``directory``, or None (no directory, or tensorboard not installed)."""
    if not directory:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        print(f"observability.tensorboardDir is {directory!r} but the tensorboard package is not installed "
              "(pip install tensorboard); no TensorBoard scalars will be written", file=sys.stderr, flush=True)
        return None
    return SummaryWriter(log_dir=directory)
