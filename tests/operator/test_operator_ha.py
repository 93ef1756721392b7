"""HA: two operator replicas elect one leader through a coordination.k8s.io Lease on the session's kube-apiserver.

Exactly one replica serves; when it is SIGKILLed (its Lease is not released) the standby takes over once the
Lease has not been renewed for leaseDurationSeconds, and finishes the job without creating any pod twice.
"""
from __future__ import annotations

import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from ascend_operator.leader_election import LeaderElector, LeaseTimings
from test_operator_train_job import (create, free_port, get_job, job, operator_command, operator_env, phase_is,
                                     pods_of, set_pod_phase, wait_for)

pytestmark = pytest.mark.operator

LEASE = {"ASCEND_OPERATOR_LEASE_DURATION": "3", "ASCEND_OPERATOR_LEASE_RENEW_DEADLINE": "2",
         "ASCEND_OPERATOR_LEASE_RETRY_PERIOD": "0.5"}


def probe(port: int, path: str) -> int:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2).status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def lease_spec(api_client, namespace) -> dict:
    try:
        lease = client.CoordinationV1Api(api_client).read_namespaced_lease("ascend-train-operator", namespace)
    except ApiException:
        return {}
    return {"holder": lease.spec.holder_identity, "transitions": lease.spec.lease_transitions,
            "duration": lease.spec.lease_duration_seconds, "renew": lease.spec.renew_time}


@pytest.fixture
def replicas(kubeconfig, namespace, tmp_path):
    """Two replicas watching the test's namespace, their Lease in it too (as the chart puts it beside them)."""
    procs = {}
    for name in ("op-a", "op-b"):
        health = free_port()
        env = operator_env(kubeconfig, POD_NAME=name, POD_NAMESPACE=namespace, **LEASE)
        log = open(tmp_path / f"{name}.log", "w")
        proc = subprocess.Popen(operator_command(namespace, "--leader-elect", f"--health=127.0.0.1:{health}"),
                                env=env, stdout=log, stderr=subprocess.STDOUT)
        procs[name] = (proc, health, log)
    yield procs
    for name, (proc, _, log) in procs.items():
        if proc.poll() is None:
            proc.terminate()
            proc.wait(15)
        log.close()
        print(f"--- {name}\n" + (tmp_path / f"{name}.log").read_text()[-3000:])


def test_one_replica_leads_and_the_other_takes_over_when_it_dies(replicas, api_client, namespace):
    ns = namespace
    holder = wait_for(lambda: lease_spec(api_client, ns).get("holder"), what="a Lease holder")
    leader = holder.split("_")[0]
    standby = "op-b" if leader == "op-a" else "op-a"
    assert lease_spec(api_client, ns)["transitions"] == 0 and lease_spec(api_client, ns)["duration"] == 3
    # Both are live; the standby is ready (it reached the Lease), the leader once its first watch was answered.
    wait_for(lambda: all(probe(replicas[n][1], "/readyz") == 200 for n in replicas), what="both ready")
    assert all(probe(replicas[n][1], "/healthz") == 200 for n in replicas)

    create(api_client, ns, job("ha"))
    first = wait_for(lambda: len(p := pods_of(api_client, ns, "ha")) == 2 and p, what="2 pods")
    set_pod_phase(api_client, ns, "ha-0-0", "Running")
    set_pod_phase(api_client, ns, "ha-1-0", "Running")
    phase_is(api_client, ns, "ha", "Running")
    # The standby served nothing: its kopf never started.
    standby_proc, _, standby_log = replicas[standby]
    standby_log.flush()
    assert "became leader" not in open(standby_log.name).read()

    leader_proc = replicas[leader][0]
    killed = time.monotonic()
    leader_proc.send_signal(signal.SIGKILL)  # no release: the standby must wait the lease out
    leader_proc.wait(10)
    new_holder = wait_for(lambda: (h := lease_spec(api_client, ns).get("holder")) and h.startswith(standby) and h,
                          timeout=30, what="takeover")
    takeover_s = time.monotonic() - killed
    print(f"takeover after SIGKILL of the leader: {takeover_s:.2f} s (leaseDurationSeconds 3, retry 0.5 s)")
    assert 0 < takeover_s < 3 + 2 * 0.6 + 2  # lease duration + two jittered retry periods + slack
    assert lease_spec(api_client, ns)["transitions"] == 1 and new_holder != holder

    # The new leader follows the job to its end; nothing is created twice.
    set_pod_phase(api_client, ns, "ha-0-0", "Succeeded", exit_code=0)
    set_pod_phase(api_client, ns, "ha-1-0", "Succeeded", exit_code=0)
    done = wait_for(lambda: (s := get_job(api_client, ns, "ha").get("status", {})).get("phase") == "Succeeded" and s,
                    what="Succeeded under the new leader")
    assert done["completionTime"]
    after = pods_of(api_client, ns, "ha")
    assert [p.metadata.uid for p in after] == [p.metadata.uid for p in first]
    assert standby_proc.poll() is None

    # A clean shutdown releases the Lease at once (empty holder).
    standby_proc.terminate()
    assert standby_proc.wait(15) == 0
    assert lease_spec(api_client, ns)["holder"] in (None, "")


def test_racing_writers_get_409_and_only_one_acquires(api_client, namespace):
    """kube-apiserver serves Leases with optimistic concurrency, so two electors racing for a fresh Lease
    cannot both win, and a held Lease is not taken before it expires."""
    api = client.CoordinationV1Api(api_client)
    timings = LeaseTimings(lease_duration=2, renew_deadline=1, retry_period=0.2)
    a = LeaderElector(api, namespace, "race", "a", timings)
    b = LeaderElector(api, namespace, "race", "b", timings)
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    lease = api.read_namespaced_lease("race", namespace)
    stale = client.V1Lease(metadata=client.V1ObjectMeta(name="race", namespace=namespace,
                                                        resource_version=lease.metadata.resource_version),
                           spec=client.V1LeaseSpec(holder_identity="b"))
    assert a.try_acquire_or_renew()  # renewing moves resourceVersion on
    with pytest.raises(ApiException) as conflict:
        api.replace_namespaced_lease("race", namespace, stale)
    assert conflict.value.status == 409 and "the object has been modified" in conflict.value.body
    assert not b.try_acquire_or_renew()  # b sees a's renewal: its clock for the lease starts again
    time.sleep(2.3)  # b last saw a change 2.3 s ago (> leaseDurationSeconds) and a has stopped renewing
    assert b.try_acquire_or_renew() and api.read_namespaced_lease("race", namespace).spec.lease_transitions == 1
    assert not a.try_acquire_or_renew()


def test_bad_timings_are_refused():
    with pytest.raises(ValueError, match="leaseDuration > renewDeadline > retryPeriod"):
        LeaseTimings(lease_duration=5, renew_deadline=10, retry_period=2)
