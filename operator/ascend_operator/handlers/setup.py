"""kopf settings: where kopf keeps its own bookkeeping."""
from __future__ import annotations

import kopf

from ..api.group import API_GROUP


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_) -> None:
    # Keep kopf's progress and diff-base in annotations: our status schema is structural and would prune
    # kopf's `status.kopf` block, and status belongs to the user-facing contract.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=API_GROUP, key="last-handled-configuration")
    settings.posting.level = 20  # INFO and above become Kubernetes events
    settings.execution.max_workers = 16
