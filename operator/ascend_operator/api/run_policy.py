"""``runPolicy``: what the operator does when pods fail, run too long, finish, or the job is suspended.

The decisions themselves are small pure methods here, so they are unit-tested without a cluster.
"""
from __future__ import annotations

import datetime as dt
from typing import Annotated, Literal

from pydantic import Field

from ascend_engine.rendezvous import MASTER_UNREACHABLE_EXIT  # noqa: F401  (re-exported for status.py)

from .kube import KubeModel


def parse_time(text: str) -> dt.datetime:
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)


class StallDetection(KubeModel):
    """When a running job whose iteration stops advancing is declared Stalled: every rank's stacks go to its pod's
    log, then the gang restarts from the last checkpoint (counted against backoffLimit). The iteration is rank
    0's, read every few seconds; the timeout is the larger of minSeconds and stepTimeFactor x the median time
    between advances, or a floor of its own while starting or saving."""

    enabled: bool = True
    """Watch for stalls (engine jobs only: a trainer's own command has no stall floor the operator knows)."""
    timeoutSeconds: Annotated[int | None, Field(ge=1)] = None
    """A fixed timeout for the iteration to advance, instead of the one derived from the step time."""
    stepTimeFactor: Annotated[float, Field(ge=1, le=1000)] = 10.0
    """The derived timeout in median times between advances of the iteration."""
    minSeconds: Annotated[int, Field(ge=1)] = 300
    """The derived timeout is never shorter (garbage collection, a slow validation, a shared filesystem)."""
    startupSeconds: Annotated[int, Field(ge=1)] = 1800
    """From all pods running to the first advance: rendezvous, model build, checkpoint load and the first step
    (graph compilation on NPUs). A rendezvous that never completes is a stall after this long."""
    checkpointSeconds: Annotated[int, Field(ge=1)] = 1800
    """While rank 0 reports a checkpoint save in progress (status.progress.savingCheckpoint)."""
    stackDumpSeconds: Annotated[int, Field(ge=0, le=3600)] = 90
    """From asking every rank for its stacks to the restart: the kubelet shows a pod's new annotation to the
    container within about a minute (its sync period)."""


class RunPolicy(KubeModel):
    """Restarts, deadlines, clean-up and suspension (the training operator's RunPolicy, plus exit-code rules)."""

    backoffLimit: Annotated[int, Field(ge=0, le=1000)] = 3
    """Gang restarts allowed after retryable failures: all pods are deleted and created anew together, and
    training resumes from its latest checkpoint (checkpoint.load defaults to checkpoint.save)."""
    retryableExitCodes: list[Annotated[int, Field(ge=1, le=255)]] = []
    """Exit codes in 1-127 that should also restart the job. 128 and above (killed by a signal: OOM kill,
    node loss, preemption) are always retryable; other codes in 1-127 are permanent and fail at once, except
    Megatron's rerun state machine's: 16 (re-run a faulty step) restarts without counting against backoffLimit,
    17 (a reproducible numeric fault) fails as NumericFault."""
    activeDeadlineSeconds: Annotated[int | None, Field(ge=1)] = None
    """Fail the job (reason DeadlineExceeded) when it has had pods for longer than this; suspended time
    does not count."""
    ttlSecondsAfterFinished: Annotated[int | None, Field(ge=0)] = None
    """Delete the finished job (and, by owner references, everything it created) this long after it ended."""
    cleanPodPolicy: Literal["All", "Running", "None"] = "Running"
    """Pods to delete when the job ends: All, Running (pods still pending or running: no zombies left
    holding devices) or None (keep every pod for inspection)."""
    suspend: bool = False
    """Remove the pods and keep the job (phase Suspended); setting it back to false recreates them and
    training resumes from its checkpoint. A job queued in Kueue (label kueue.x-k8s.io/queue-name) stays suspended
    until its Workload is admitted; the operator then clears it, and sets it again when Kueue evicts the job."""

    def is_retryable(self, exit_code: int | None) -> bool:
        """Signals (128+) and listed codes restart the gang; an unknown code (pod evicted, node lost) too."""
        if exit_code is None or exit_code >= 128:
            return True
        return exit_code in self.retryableExitCodes

    def deadline_passed(self, active_since: str | None, at: dt.datetime) -> bool:
        if self.activeDeadlineSeconds is None or not active_since:
            return False
        return (at - parse_time(active_since)).total_seconds() > self.activeDeadlineSeconds

    def deadline_remaining(self, active_since: str | None, at: dt.datetime) -> float | None:
        """Seconds until activeDeadlineSeconds passes (None: no deadline, or not started)."""
        if self.activeDeadlineSeconds is None or not active_since:
            return None
        return max(0.0, self.activeDeadlineSeconds - (at - parse_time(active_since)).total_seconds()) + 1

    def ttl_remaining(self, completion_time: str | None, at: dt.datetime) -> float | None:
        """Seconds until a finished job's TTL is due (None: no TTL, or not finished)."""
        if self.ttlSecondsAfterFinished is None or not completion_time:
            return None
        return max(0.0, self.ttlSecondsAfterFinished - (at - parse_time(completion_time)).total_seconds())

    def ttl_expired(self, completion_time: str | None, at: dt.datetime) -> bool:
        if self.ttlSecondsAfterFinished is None or not completion_time:
            return False
        return (at - parse_time(completion_time)).total_seconds() >= self.ttlSecondsAfterFinished

    def pods_to_clean(self, pods: list[dict]) -> list[dict]:
        """The pods to delete once the job has ended."""
        if self.cleanPodPolicy == "All":
            return list(pods)
        if self.cleanPodPolicy == "Running":
            return [p for p in pods if (p.get("status") or {}).get("phase", "Pending") in ("Pending", "Running")]
        return []


class RecoveryPolicy(KubeModel):
    """The recovery ladder, cheapest level first. In process: when a rank raises or its process dies, the other
    ranks restart the training function in their own processes (imports, tokenizer and data index kept), a warm
    spare takes a dead process's place, and the last checkpoint comes from host memory. In place: a worker process
    that fails (a crash, a collective that timed out, a killed process) makes torchrun's agents restart every pod's
    workers, which load the last checkpoint; the pods stay, nothing is scheduled or pulled. When those restarts run
    out the gang is replaced (runPolicy.backoffLimit), avoiding a node known to be faulty; a node that is lost
    resizes an elastic job (elasticPolicy). A failure the engine reports as its input's (exit code 2: a bad config,
    missing data) is not retried in process or in place."""

    inProcessRestarts: Annotated[int, Field(ge=0, le=100)] = 3
    """Restarts of the training function in the workers' own processes (one count for the job) before a failure
    goes to the in-place level; 0 turns the level off. Needs the c10d rendezvous (its store coordinates the
    ranks), which it renders even when inPlaceRestarts is 0."""
    warmSpares: Annotated[int, Field(ge=0, le=8)] = 1
    """Spare processes per pod that have already imported torch and Megatron-core, each taking a dead worker's
    place in an in-process restart (about 0.9 GiB of host memory each on CPU, no device memory; none is started
    when the pod has less than 2 GiB available). 0: a dead process goes to the in-place level."""
    stateFromMemory: bool = True
    """Keep the newest checkpoint's files in host memory, replicated to a peer rank in another pod, and load them
    from there in an in-process restart instead of from the shared file system (which stays the source of truth
    for the other levels). Costs one checkpoint shard and one replica of host memory per writing rank."""
    inPlaceRestarts: Annotated[int, Field(ge=0, le=100)] = 3
    """Worker restarts in place (torchrun --max-restarts, with the c10d rendezvous on pod 0's masterPort) before
    the gang is replaced; 0 turns the level off (a worker's failure is then the pod's; with inProcessRestarts 0 too
    the rendezvous is static)."""


class TrainRunPolicy(RunPolicy):
    """An AscendTrainJob's run policy: the common one plus hang detection and the recovery ladder."""

    stallDetection: StallDetection = StallDetection()
    """Hang detection: a job whose iteration stops advancing is restarted (reason Stalled)."""
    recovery: RecoveryPolicy = RecoveryPolicy()
    """In-process and in-place restarts of the workers before the gang is replaced (engine jobs; a trainer's own
    command runs as written)."""
