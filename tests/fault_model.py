"""The fault-sequence test's oracle: what a job's status must say after the faults injected so far, written from
the documented policy (docs/faults.md), not from the operator's code.

Faults (and successes) are kept, with their pod's attempt, until the operator decides on them: right away when it
runs; after a pause or a kill, in slices of the order they happened (``outcomes``: one decision per slice; a
gang restart ends the attempt, so what follows it in older pods decides nothing). One decision:

1. failed pods (a pod's own end, or one that had ended before it was deleted): a node or device fault among them
   restarts the gang without counting it; so does a set that the cluster disrupted entirely (DisruptionTarget);
   otherwise a permanent failure (exit codes 1-127 not listed, Megatron's 17, the engine's NumericFault or a
   repeated failure) fails the job, Megatron's 16 restarts without counting, anything else restarts counted;
2. else pods deleted after they ran: a node fault or a disruption restarts uncounted, a plain deletion counted;
3. else pods deleted before they ran: replaced, nothing counted.

A counted restart beyond ``backoffLimit`` fails the job (BackoffLimitExceeded). All of the current attempt's pods
succeeded (and no fault): Succeeded. Suspension drops the attempt's undecided faults (its pods go); resuming
recreates the same attempt's pods.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

PERMANENT_CODES = range(1, 128)


@dataclass(frozen=True)
class Fault:
    pod: str
    failed: bool  # the pod's own end (else: deleted)
    ran: bool  # a container had started
    exit_code: int | None = None
    reason: str | None = None  # the engine's report's reason
    permanent_report: bool = False  # a report marked permanent
    disrupted: bool = False  # DisruptionTarget
    node_fault: bool = False  # the node or the device failed it
    cause: str = ""  # what a Failed condition must name


@dataclass(frozen=True)
class Success:
    index: int


@dataclass
class JobModel:
    nnodes: int
    backoff_limit: int
    attempt: int = 0
    restarts: int = 0
    disruptions: int = 0
    phase: str = "Active"  # Active, Suspended, Succeeded, Failed
    causes: tuple[str, ...] = ()  # one of them must be in the Failed condition's message
    pending: list[tuple[int, Fault | Success]] = field(default_factory=list)  # (attempt, what), in event order
    succeeded: set[int] = field(default_factory=set)
    suspend: bool = False  # the spec's runPolicy.suspend

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    def fault(self, attempt: int, what: Fault | Success) -> None:
        """A pod of ``attempt`` failed, was deleted or succeeded: decided when the operator sees it."""
        self.pending.append((attempt, what))

    def outcomes(self) -> list[JobModel]:
        """Every state the operator may be in once it has seen what is pending. Its pod events come in the order
        they happened, and a reconcile may run after any of them (an operator paused with SIGSTOP reads its
        buffered events one by one), so the pending events are decided as consecutive slices, each slice one
        decision; a restart makes the next slices' events an older attempt's, which decide nothing."""
        found: list[JobModel] = []

        def go(state: JobModel, rest: list) -> None:
            if not rest:
                state._decide([])
                found.append(state)
                return
            for k in range(1, len(rest) + 1):
                nxt = replace(state, pending=[], succeeded=set(state.succeeded))
                nxt._decide(rest[:k])
                go(nxt, rest[k:])

        go(replace(self, pending=[], succeeded=set(self.succeeded)), list(self.pending))
        return found

    def _decide(self, events: list[tuple[int, Fault | Success]]) -> None:
        """One decision of the operator, over the pending events it has seen."""
        if self.terminal:
            return
        if self.suspend:
            self.phase, self.succeeded = "Suspended", set()
            return
        if self.phase == "Suspended":
            self.phase = "Active"
        mine = [what for attempt, what in events if attempt == self.attempt]
        self.succeeded |= {s.index for s in mine if isinstance(s, Success)}
        faults = [f for f in mine if isinstance(f, Fault)]
        failed = [f for f in faults if f.failed]
        ran = [f for f in faults if not f.failed and f.ran]
        if failed:
            if any(f.node_fault for f in failed) or all(f.disrupted for f in failed):
                return self._restart(counted=False)
            judged = [self._judge(f) for f in failed if not f.disrupted]
            rerun = any(reason == "RerunRequested" for _, reason, _ in judged)
            permanent = [cause for retryable, reason, cause in judged
                         if not retryable and not (rerun and reason == "PodFailed")]
            if permanent:
                self.phase, self.causes = "Failed", tuple(permanent)
                return
            return self._restart(counted=not rerun, causes=tuple(c for _, _, c in judged))
        if ran:
            if any(f.node_fault or f.disrupted for f in ran):
                return self._restart(counted=False)
            return self._restart(counted=True, causes=tuple(f.cause for f in ran))
        if len(self.succeeded) == self.nnodes:
            self.phase = "Succeeded"

    @staticmethod
    def _judge(f: Fault) -> tuple[bool, str, str]:
        """(retryable, reason, cause) of one failed pod, as docs/faults.md's table says."""
        if f.reason == "Preempted":
            return True, "Preempted", f.cause
        if f.permanent_report:
            return False, f.reason or "PodFailed", f.cause
        if f.exit_code == 17 or f.reason == "NumericFault":
            return False, "NumericFault", f.cause
        if f.exit_code == 16:
            return True, "RerunRequested", f.cause
        if f.exit_code is None or f.exit_code >= 128 or f.reason == "InPlaceRecoveryExhausted":
            return True, "PodFailed", f.cause
        return f.exit_code not in PERMANENT_CODES, "PodFailed", f.cause

    def _restart(self, counted: bool, causes: tuple[str, ...] = ()) -> None:
        if counted and self.restarts - self.disruptions >= self.backoff_limit:
            self.phase, self.causes = "Failed", causes + ("backoffLimit",)
            return
        self.restarts += 1
        self.disruptions += not counted
        self.attempt += 1
        self.succeeded = set()
