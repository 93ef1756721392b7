"""HA: two operator replicas elect one leader through a coordination.k8s.io Lease on the loopback API.

Exactly one replica serves; when it is SIGKILLed (its Lease is not released) the standby takes over once the
Lease has not been renewed for leaseDurationSeconds, and finishes the job without creating any pod twice.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from ascend_operator.leader_election import LeaderElector, LeaseTimings
from test_operator_train_job import CRDS, GROUP, PLURAL, VERSION, get_job, job, pods_of, set_pod_phase, wait_for

pytestmark = pytest.mark.operator

LEASE = {"ASCEND_OPERATOR_LEASE_DURATION": "3", "ASCEND_OPERATOR_LEASE_RENEW_DEADLINE": "2",
         "ASCEND_OPERATOR_LEASE_RETRY_PERIOD": "0.5"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def probe(port: int, path: str) -> int:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2).status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def lease_spec(api_client) -> dict:
    try:
        lease = client.CoordinationV1Api(api_client).read_namespaced_lease("ascend-train-operator", "default")
    except ApiException:
        return {}
    return {"holder": lease.spec.holder_identity, "transitions": lease.spec.lease_transitions,
            "duration": lease.spec.lease_duration_seconds, "renew": lease.spec.renew_time}


@pytest.fixture
def replicas(local_api, api_client, tmp_path):
    ext = client.ApiextensionsV1Api(api_client)
    for path in sorted(CRDS.glob("*.yaml")):
        ext.create_custom_resource_definition(yaml.safe_load(path.read_text()))
    procs = {}
    for name in ("op-a", "op-b"):
        health = free_port()
        env = dict(os.environ, KUBECONFIG=str(tmp_path / "kubeconfig"), ASCEND_OPERATOR_PROGRESS_INTERVAL="1",
                   ASCEND_OPERATOR_METRICS_PORT="0", ASCEND_OPERATOR_DASHBOARD_PORT="0", POD_NAME=name, POD_NAMESPACE="default", **LEASE)
        log = open(tmp_path / f"{name}.log", "w")
        proc = subprocess.Popen([sys.executable, "-m", "ascend_operator.main", "run", "-A", "--leader-elect",
                                 f"--health=127.0.0.1:{health}"], env=env, stdout=log, stderr=subprocess.STDOUT)
        procs[name] = (proc, health, log)
    yield procs
    for name, (proc, _, log) in procs.items():
        if proc.poll() is None:
            proc.terminate()
            proc.wait(15)
        log.close()
        print(f"--- {name}\n" + (tmp_path / f"{name}.log").read_text()[-3000:])


def test_one_replica_leads_and_the_other_takes_over_when_it_dies(replicas, api_client):
    holder = wait_for(lambda: lease_spec(api_client).get("holder"), what="a Lease holder")
    leader = holder.split("_")[0]
    standby = "op-b" if leader == "op-a" else "op-a"
    assert lease_spec(api_client)["transitions"] == 0 and lease_spec(api_client)["duration"] == 3
    # Both are live; the standby is ready (it reached the Lease), the leader once its first watch was answered.
    wait_for(lambda: all(probe(replicas[n][1], "/readyz") == 200 for n in replicas), what="both ready")
    assert all(probe(replicas[n][1], "/healthz") == 200 for n in replicas)

    custom = client.CustomObjectsApi(api_client)
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, job("ha"))
    first = wait_for(lambda: len(p := pods_of(api_client, "ha")) == 2 and p, what="2 pods")
    set_pod_phase(api_client, "ha-0-0", "Running")
    set_pod_phase(api_client, "ha-1-0", "Running")
    wait_for(lambda: get_job(api_client, "ha").get("status", {}).get("phase") == "Running", what="Running")
    # The standby served nothing: its kopf never started.
    standby_proc, _, standby_log = replicas[standby]
    standby_log.flush()
    assert "became leader" not in open(standby_log.name).read()

    leader_proc = replicas[leader][0]
    killed = time.monotonic()
    leader_proc.send_signal(signal.SIGKILL)  # no release: the standby must wait the lease out
    leader_proc.wait(10)
    new_holder = wait_for(lambda: (h := lease_spec(api_client).get("holder")) and h.startswith(standby) and h,
                          timeout=30, what="takeover")
    takeover_s = time.monotonic() - killed
    print(f"takeover after SIGKILL of the leader: {takeover_s:.2f} s (leaseDurationSeconds 3, retry 0.5 s)")
    assert 0 < takeover_s < 3 + 2 * 0.6 + 2  # lease duration + two jittered retry periods + slack
    assert lease_spec(api_client)["transitions"] == 1 and new_holder != holder

    # The new leader follows the job to its end; nothing is created twice.
    set_pod_phase(api_client, "ha-0-0", "Succeeded", exit_code=0)
    set_pod_phase(api_client, "ha-1-0", "Succeeded", exit_code=0)
    done = wait_for(lambda: (s := get_job(api_client, "ha").get("status", {})).get("phase") == "Succeeded" and s,
                    what="Succeeded under the new leader")
    assert done["completionTime"]
    after = pods_of(api_client, "ha")
    assert [p.metadata.uid for p in after] == [p.metadata.uid for p in first]
    assert standby_proc.poll() is None

    # A clean shutdown releases the Lease at once (empty holder).
    standby_proc.terminate()
    assert standby_proc.wait(15) == 0
    assert lease_spec(api_client)["holder"] in (None, "")


def test_racing_writers_get_409_and_only_one_acquires(local_api, api_client):
    """The emulator serves Leases with optimistic concurrency, so two electors racing for a fresh Lease
    cannot both win, and a held Lease is not taken before it expires."""
    api = client.CoordinationV1Api(api_client)
    timings = LeaseTimings(lease_duration=2, renew_deadline=1, retry_period=0.2)
    a = LeaderElector(api, "default", "race", "a", timings)
    b = LeaderElector(api, "default", "race", "b", timings)
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    lease = api.read_namespaced_lease("race", "default")
    stale = client.V1Lease(metadata=client.V1ObjectMeta(name="race", namespace="default",
                                                        resource_version=lease.metadata.resource_version),
                           spec=client.V1LeaseSpec(holder_identity="b"))
    assert a.try_acquire_or_renew()  # renewing moves resourceVersion on
    with pytest.raises(ApiException) as conflict:
        api.replace_namespaced_lease("race", "default", stale)
    assert conflict.value.status == 409 and "the object has been modified" in conflict.value.body
    assert not b.try_acquire_or_renew()  # b sees a's renewal: its clock for the lease starts again
    time.sleep(2.3)  # b last saw a change 2.3 s ago (> leaseDurationSeconds) and a has stopped renewing
    assert b.try_acquire_or_renew() and api.read_namespaced_lease("race", "default").spec.lease_transitions == 1
    assert not a.try_acquire_or_renew()


def test_bad_timings_are_refused():
    with pytest.raises(ValueError, match="leaseDuration > renewDeadline > retryPeriod"):
        LeaseTimings(lease_duration=5, renew_deadline=10, retry_period=2)
