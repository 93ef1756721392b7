"""Operator settings from the environment (the Helm chart sets them); read once at import."""
from __future__ import annotations

import os

# Seconds between reads of rank 0's metrics into status.progress: the bound on how stale progress can be.
# The same sweep checks deadlines, TTLs and dependencies.
PROGRESS_INTERVAL = float(os.environ.get("ASCEND_OPERATOR_PROGRESS_INTERVAL", "5"))

# Port of the operator's own Prometheus endpoint (jobs by phase, restarts, reconcile latency); 0 disables it.
METRICS_PORT = int(os.environ.get("ASCEND_OPERATOR_METRICS_PORT", "9102"))

# Port of the read-only jobs dashboard (page and /api/jobs; see ascend_operator.dashboard); 0 disables it.
DASHBOARD_PORT = int(os.environ.get("ASCEND_OPERATOR_DASHBOARD_PORT", "8080"))

# Node ports hostNetwork jobs are given, "first-last", in blocks of HOST_PORT_BLOCK (one block per job).
HOST_PORT_FIRST, HOST_PORT_LAST = (int(p) for p in os.environ.get("ASCEND_OPERATOR_HOST_PORTS",
                                                                  "40000-49999").split("-"))
HOST_PORT_BLOCK = int(os.environ.get("ASCEND_OPERATOR_HOST_PORT_BLOCK", "64"))

# Seconds the operator may take to exit after SIGTERM before it ends itself (keep it below the pod's
# terminationGracePeriodSeconds, 30 by default): in-flight API calls are not retried once it is stopping.
SHUTDOWN_GRACE_S = float(os.environ.get("ASCEND_OPERATOR_SHUTDOWN_GRACE", "20"))

# API calls that fail with 409 (conflict), 429 or 5xx are retried this many times, backing off exponentially.
API_RETRIES = int(os.environ.get("ASCEND_OPERATOR_API_RETRIES", "5"))
API_BACKOFF_S = float(os.environ.get("ASCEND_OPERATOR_API_BACKOFF", "0.2"))
# (connect, read) seconds for one API call.
REQUEST_TIMEOUT_S = (5.0, float(os.environ.get("ASCEND_OPERATOR_REQUEST_TIMEOUT", "60")))

# Leader election (``run --leader-elect``): controller-runtime's defaults, seconds.
LEASE_DURATION_S = float(os.environ.get("ASCEND_OPERATOR_LEASE_DURATION", "15"))
LEASE_RENEW_DEADLINE_S = float(os.environ.get("ASCEND_OPERATOR_LEASE_RENEW_DEADLINE", "10"))
LEASE_RETRY_PERIOD_S = float(os.environ.get("ASCEND_OPERATOR_LEASE_RETRY_PERIOD", "2"))

# What job pods may ask of the node (the chart's jobPodPolicy). hostNetwork is allowed by default because the
# operator gives each hostNetwork job its own block of ports (no clashes); hostPath is denied by default.
ALLOW_HOST_NETWORK = os.environ.get("ASCEND_OPERATOR_ALLOW_HOST_NETWORK", "true").lower() == "true"
ALLOW_HOST_PATH = os.environ.get("ASCEND_OPERATOR_ALLOW_HOST_PATH", "false").lower() == "true"
# What the Pod Security Standards' baseline and restricted levels govern in a container's securityContext:
# denied unless the chart's jobPodPolicy allows it (see kinds/pod_policy.py).
ALLOW_PRIVILEGED = os.environ.get("ASCEND_OPERATOR_ALLOW_PRIVILEGED", "false").lower() == "true"
ALLOW_PRIVILEGE_ESCALATION = os.environ.get("ASCEND_OPERATOR_ALLOW_PRIVILEGE_ESCALATION", "false").lower() == "true"
ALLOW_UNMASKED_PROC_MOUNT = os.environ.get("ASCEND_OPERATOR_ALLOW_UNMASKED_PROC_MOUNT", "false").lower() == "true"
ALLOWED_CAPABILITIES = frozenset(c.strip().upper().removeprefix("CAP_") for c in
                                 os.environ.get("ASCEND_OPERATOR_ALLOWED_CAPABILITIES", "").split(",") if c.strip())

# Scale (docs/design: "Work per event"): threads reconciling jobs from the shared work queue, threads issuing API
# calls for all jobs, and how many of those calls one job may have in flight (a gang's creates and deletes).
RECONCILE_WORKERS = int(os.environ.get("ASCEND_OPERATOR_RECONCILE_WORKERS", "8"))
API_THREADS = int(os.environ.get("ASCEND_OPERATOR_API_THREADS", "16"))
PER_JOB_CONCURRENCY = int(os.environ.get("ASCEND_OPERATOR_PER_JOB_CONCURRENCY", "8"))
