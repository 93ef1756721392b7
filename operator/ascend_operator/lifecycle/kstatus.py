"""The conditions GitOps tools read, from a job's derived status (pure; ``tests/unit/test_kstatus.py``).

kstatus (sigs.k8s.io/cli-utils/pkg/kstatus, what Flux's ``wait``/health checks and ``kubectl``-style waiters use)
reads three things on a custom resource: ``status.observedGeneration`` against ``metadata.generation`` (behind:
in progress), ``Reconciling=True`` (in progress) and ``Stalled=True`` (failed, with the condition's message); a
resource with neither is Current. ``Ready`` is the condition people and Argo CD read (the chart's
``argocd-health.lua``). For the three kinds:

=========================================  =====  ===========  =======  ==================
phase                                      Ready  Reconciling  Stalled  kstatus
=========================================  =====  ===========  =======  ==================
(no status yet: the CRD's default)           -        -           -     InProgress (generation 1, observed 0)
Pending, Running, Restarting, Suspended    False  True         False    InProgress
Succeeded (a DatasetPrep or convert done)  True   False        False    Current
Failed                                     False  False        True     Failed (the cause)
=========================================  =====  ===========  =======  ==================

Reasons are the phase's (``Running``, ``Suspended``, ...) or, when finished, the finishing condition's own
(``JobSucceeded``, ``BackoffLimitExceeded``, ``PodFailed``); messages are that condition's, so a reader of "the
newest condition" finds the same words in each. A suspended or queued job is in progress, not failed: it waits
for something that will come (Kueue's admission, a resume). Hang detection's condition is ``Progressing``
(``ascend_operator.recovery.stalls``): kstatus' ``Stalled`` means a job that will not get anywhere by itself.
"""
from __future__ import annotations

from typing import Any

from .status import condition, set_condition

READY, RECONCILING, STALLED = "Ready", "Reconciling", "Stalled"
TERMINAL = ("Succeeded", "Failed")


def _because(status: dict[str, Any], phase: str) -> tuple[str, str]:
    """(reason, message) of the condition that explains ``phase``: its own condition when it has one that holds
    (Failed, Succeeded, Suspended, Restarting, Running), else the newest condition that holds."""
    own = condition(status, phase)
    if own and own.get("status") == "True":
        return own.get("reason") or phase, own.get("message", "")
    held = [c for c in status.get("conditions") or [] if c.get("status") == "True"
            and c.get("type") not in (READY, RECONCILING, STALLED)]
    newest = max(held, key=lambda c: c.get("lastTransitionTime") or "", default={})
    return phase, newest.get("message", "")


def conditions(status: dict[str, Any], at: str) -> dict[str, Any]:
    """``status`` with Ready, Reconciling and Stalled set from its phase (each written only when it changes, its
    lastTransitionTime moving only when it flips). The other fields are left as they are."""
    phase = status.get("phase") or "Pending"
    reason, message = _because(status, phase)
    if phase == "Succeeded":
        ready, reconciling, stalled = "True", "False", "False"
    elif phase == "Failed":
        ready, reconciling, stalled = "False", "False", "True"
    else:
        ready, reconciling, stalled = "False", "True", "False"
        reason = phase
        message = message or f"{phase}: waiting for the operator"
    out = list(status.get("conditions") or [])
    for type_, value in ((READY, ready), (RECONCILING, reconciling), (STALLED, stalled)):
        current = condition({"conditions": out}, type_)
        if current and (current.get("status"), current.get("reason"), current.get("message")) == \
                (value, reason, message):
            continue
        out = set_condition(out, type_, value, reason, message, at)
    return {**status, "conditions": out}
