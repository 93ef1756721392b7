"""Operator settings from the environment (the Helm chart sets them); read once at import."""
from __future__ import annotations

import os

# Seconds between reads of rank 0's metrics into status.progress: the bound on how stale progress can be.
PROGRESS_INTERVAL = float(os.environ.get("ASCEND_OPERATOR_PROGRESS_INTERVAL", "5"))
