"""Kueue's contract, with the operator as a real process against the loopback API: a job labelled with a Kueue
queue starts suspended (no pods, no PodGroup), runs when Kueue admits it (suspend false) with its priority class
on the pods and the Volcano PodGroup, and is suspended again when Kueue preempts it."""
from __future__ import annotations

import pytest
from kubernetes import client

from test_operator_lifecycle import create, phase_is
from test_operator_train_job import GROUP, PLURAL, VERSION, get_job, job, operator, pods_of, wait_for  # noqa: F401

pytestmark = pytest.mark.operator

# Volcano's PodGroup, as its chart installs it (schema left open: the emulator only needs to serve the kind).
PODGROUP_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "podgroups.scheduling.volcano.sh"},
    "spec": {"group": "scheduling.volcano.sh", "scope": "Namespaced",
             "names": {"kind": "PodGroup", "plural": "podgroups", "singular": "podgroup", "shortNames": ["pg"]},
             "versions": [{"name": "v1beta1", "served": True, "storage": True, "subresources": {"status": {}},
                           "schema": {"openAPIV3Schema": {"type": "object",
                                                          "x-kubernetes-preserve-unknown-fields": True}}}]},
}


def podgroups(api_client):
    return client.CustomObjectsApi(api_client).list_namespaced_custom_object(
        "scheduling.volcano.sh", "v1beta1", "default", "podgroups")["items"]


def set_suspend(api_client, name, value):
    client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, name, {"spec": {"runPolicy": {"suspend": value}}})


def test_queued_job_waits_for_admission_and_yields_to_preemption(operator, api_client):
    client.ApiextensionsV1Api(api_client).create_custom_resource_definition(PODGROUP_CRD)
    client.SchedulingV1Api(api_client).create_priority_class(  # the class Kueue's priority maps to
        {"metadata": {"name": "high-priority"}, "value": 1000})
    body = job("queued", priorityClassName="high-priority", gangScheduling="volcano")
    body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a-queue",
                                  "kueue.x-k8s.io/priority-class": "high"}
    create(api_client, body)
    suspended = phase_is(api_client, "queued", "Suspended")
    assert get_job(api_client, "queued")["spec"]["runPolicy"]["suspend"] is True
    assert {c["type"]: c["status"] for c in suspended["conditions"]}["Suspended"] == "True"
    assert pods_of(api_client, "queued") == [] and podgroups(api_client) == []

    set_suspend(api_client, "queued", False)  # Kueue admits the workload
    pods = wait_for(lambda: len(p := pods_of(api_client, "queued")) == 2 and p, what="pods after admission")
    for pod in pods:
        assert pod.spec.priority_class_name == "high-priority" and pod.spec.scheduler_name == "volcano"
        assert pod.spec.priority == 1000  # the Priority admission plugin's, from the class
        assert not any(k.startswith("kueue.x-k8s.io/") for k in pod.metadata.labels)  # not queued pod by pod
    (group,) = podgroups(api_client)
    assert group["spec"] == {"minMember": 2, "priorityClassName": "high-priority"}
    assert get_job(api_client, "queued")["spec"]["runPolicy"]["suspend"] is False  # not suspended a second time

    set_suspend(api_client, "queued", True)  # Kueue preempts it
    phase_is(api_client, "queued", "Suspended")
    wait_for(lambda: pods_of(api_client, "queued") == [], what="pods deleted on preemption")
    set_suspend(api_client, "queued", False)  # and admits it again
    wait_for(lambda: len(pods_of(api_client, "queued")) == 2, what="pods after readmission")
