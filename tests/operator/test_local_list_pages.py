"""Paginated lists on the loopback API server, as kube-apiserver serves them: ``limit`` pages in key order,
``continue`` tokens, one consistent snapshot across pages, and kube's errors for bad or expired tokens."""
from __future__ import annotations

import shutil
import subprocess

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from ascend_operator.local import list_pages

pytestmark = pytest.mark.operator


def config_map(name: str, team: str = "a") -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": {"team": team}},
            "data": {"k": name}}


def names(page) -> list[str]:
    return [i.metadata.name for i in page.items]


def test_pages_follow_one_snapshot_and_carry_kubes_tokens(api_client):
    core = client.CoreV1Api(api_client)
    for i in range(7):
        core.create_namespaced_config_map("default", config_map(f"cm-{i}", "a" if i % 2 else "b"))
    first = core.list_namespaced_config_map("default", limit=3)
    assert names(first) == ["cm-0", "cm-1", "cm-2"]
    assert first.metadata.remaining_item_count == 4
    rv, start = list_pages.decode(first.metadata._continue)
    assert (str(rv), start) == (first.metadata.resource_version, "default/cm-2\x00")

    # Changes after the first page: later pages still show the list as it was when it began.
    core.delete_namespaced_config_map("cm-3", "default")
    core.patch_namespaced_config_map("cm-4", "default", {"data": {"k": "changed"}})
    core.create_namespaced_config_map("default", config_map("cm-5a"))
    second = core.list_namespaced_config_map("default", limit=3, _continue=first.metadata._continue)
    assert names(second) == ["cm-3", "cm-4", "cm-5"]
    assert second.items[1].data == {"k": "cm-4"}
    assert second.metadata.resource_version == first.metadata.resource_version
    last = core.list_namespaced_config_map("default", limit=3, _continue=second.metadata._continue)
    assert names(last) == ["cm-6"] and not last.metadata._continue
    assert names(core.list_namespaced_config_map("default")) == \
        ["cm-0", "cm-1", "cm-2", "cm-4", "cm-5", "cm-5a", "cm-6"]

    # A selector fills each page with matches and gives no remaining count.
    selected = core.list_namespaced_config_map("default", limit=2, label_selector="team=a")
    assert names(selected) == ["cm-1", "cm-5"] and selected.metadata.remaining_item_count is None
    rest = core.list_namespaced_config_map("default", limit=1, label_selector="team=a",
                                           _continue=selected.metadata._continue)
    assert names(rest) == ["cm-5a"] and rest.metadata._continue  # cm-6 is left in the key range
    empty = core.list_namespaced_config_map("default", limit=1, label_selector="team=a",
                                            _continue=rest.metadata._continue)
    assert names(empty) == [] and not empty.metadata._continue  # none of it matched, as etcd pages

    with pytest.raises(ApiException) as bad:
        core.list_namespaced_config_map("default", limit=2, _continue="not-a-token")
    assert bad.value.status == 400 and "continue key is not valid" in bad.value.body
    with pytest.raises(ApiException) as both:
        core.list_namespaced_config_map("default", limit=2, _continue=first.metadata._continue,
                                        resource_version="1")
    assert both.value.status == 400 and "specifying resource version is not allowed" in both.value.body


def test_a_token_older_than_the_watch_log_is_expired(api_client, local_api):
    core = client.CoreV1Api(api_client)
    for i in range(3):
        core.create_namespaced_config_map("default", config_map(f"cm-{i}"))
    first = core.list_namespaced_config_map("default", limit=1)
    core.create_namespaced_config_map("default", config_map("cm-3"))
    local_api.api._log_floor = local_api.api._rv  # as if the log had been compacted since
    with pytest.raises(ApiException) as gone:
        core.list_namespaced_config_map("default", limit=1, _continue=first.metadata._continue)
    assert gone.value.status == 410 and "too old to display a consistent list result" in gone.value.body


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed (`make tools` installs it)")
def test_kubectl_reads_every_page(api_client, local_api, tmp_path):
    core = client.CoreV1Api(api_client)
    for i in range(5):
        core.create_namespaced_config_map("default", config_map(f"cm-{i}"))
    out = subprocess.run(["kubectl", "--kubeconfig", str(tmp_path / "kubeconfig"), "get", "configmaps",
                          "--chunk-size=2", "-o", "name"], capture_output=True, text=True, timeout=60, check=True)
    assert [line for line in out.stdout.split() if "cm-" in line] == [f"configmap/cm-{i}" for i in range(5)]
