"""The loopback API server, checked with the `kubernetes` client and with kopf, as the operator will use it."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

GROUP, VERSION, PLURAL = "example.dev", "v1", "widgets"

WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{PLURAL}.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": PLURAL, "singular": "widget", "kind": "Widget", "shortNames": ["wg"]},
        "versions": [{
            "name": VERSION, "served": True, "storage": True,
            "subresources": {"status": {}},
            "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {
                    "spec": {
                        "type": "object",
                        "required": ["size"],
                        "properties": {
                            "size": {"type": "integer", "minimum": 1},
                            "parts": {"type": "integer", "default": 1},
                            "color": {"type": "string", "enum": ["red", "blue"], "default": "red"},
                            "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        },
                        "x-kubernetes-validations": [{
                            "rule": "self.size % self.parts == 0",
                            "message": "size must be divisible by parts", "fieldPath": ".size",
                        }],
                    },
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                },
            }},
        }],
    },
}


def widget(name: str, **spec) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Widget", "metadata": {"name": name}, "spec": spec}


def status_of(exc: ApiException) -> dict:
    return json.loads(exc.body)


def test_metadata_selectors_replace_and_patch(api_client):
    core = client.CoreV1Api(api_client)
    made = core.create_namespaced_config_map("default", {
        "metadata": {"generateName": "cfg-", "labels": {"app": "a", "tier": "x"}}, "data": {"k": "v"}})
    assert made.metadata.name.startswith("cfg-") and len(made.metadata.name) == len("cfg-") + 5
    assert made.metadata.namespace == "default" and made.metadata.uid and made.metadata.creation_timestamp
    core.create_namespaced_config_map("default", {"metadata": {"name": "other", "labels": {"app": "b"}}})
    core.create_namespaced_config_map("default", {"metadata": {"name": "bare"}})

    def names(selector=None, fields=None):
        items = core.list_namespaced_config_map("default", label_selector=selector, field_selector=fields).items
        return sorted(i.metadata.name for i in items)

    assert names("app=a") == [made.metadata.name]
    assert names("app!=a") == ["bare", "other"]
    assert names("app in (a,b)") == sorted([made.metadata.name, "other"])
    assert names("app notin (a)") == ["bare", "other"]
    assert names("!app") == ["bare"]
    assert names("app,tier") == [made.metadata.name]
    assert names(fields="metadata.name=other") == ["other"]
    listed = core.list_namespaced_config_map("default")
    assert int(listed.metadata.resource_version) >= int(made.metadata.resource_version)

    patched = core.patch_namespaced_config_map("other", "default", {"data": {"a": "1", "b": "2"}})
    patched = core.patch_namespaced_config_map("other", "default", {"data": {"a": None}})
    assert patched.data == {"b": "2"}
    replaced = core.replace_namespaced_config_map("other", "default", {
        "metadata": {"name": "other", "resourceVersion": patched.metadata.resource_version}, "data": {"c": "3"}})
    assert replaced.data == {"c": "3"} and replaced.metadata.labels is None
    assert int(replaced.metadata.resource_version) > int(patched.metadata.resource_version)
    with pytest.raises(ApiException) as stale:
        core.replace_namespaced_config_map("other", "default", {
            "metadata": {"name": "other", "resourceVersion": patched.metadata.resource_version}})
    assert stale.value.status == 409
    with pytest.raises(ApiException) as missing_ns:
        core.create_namespaced_config_map("nowhere", {"metadata": {"name": "x"}})
    assert missing_ns.value.status == 404 and 'namespaces "nowhere" not found' in status_of(missing_ns.value)["message"]


def test_owner_references_cascade_and_finalizers(api_client):
    core = client.CoreV1Api(api_client)
    owner = core.create_namespaced_config_map("default", {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    child = core.create_namespaced_config_map("default", {"metadata": {"name": "child", "ownerReferences": [ref]}})
    child_ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "child", "uid": child.metadata.uid}
    core.create_namespaced_secret("default", {"metadata": {"name": "grandchild", "ownerReferences": [child_ref]},
                                              "stringData": {"token": "abc"}})
    keeper = core.create_namespaced_config_map("default", {"metadata": {"name": "keeper"}})
    keeper_ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "keeper", "uid": keeper.metadata.uid}
    core.create_namespaced_config_map("default", {"metadata": {"name": "shared", "ownerReferences": [ref, keeper_ref]}})
    assert core.read_namespaced_secret("grandchild", "default").data == {"token": "YWJj"}
    core.create_namespaced_config_map("default", {"metadata": {"name": "held", "finalizers": ["example.dev/hold"],
                                                              "ownerReferences": [ref]}})

    core.delete_namespaced_config_map("owner", "default")
    left = {c.metadata.name: c for c in core.list_namespaced_config_map("default").items}
    assert "child" not in left and "owner" not in left
    assert not core.list_namespaced_secret("default").items  # recursive: the grandchild went too
    assert [r.uid for r in left["shared"].metadata.owner_references] == [keeper.metadata.uid]
    assert left["held"].metadata.deletion_timestamp is not None  # finalizer keeps it until released
    core.patch_namespaced_config_map("held", "default", {"metadata": {"finalizers": None}})
    assert "held" not in {c.metadata.name for c in core.list_namespaced_config_map("default").items}


def test_crd_registers_and_validates_custom_objects(api_client):
    ext = client.ApiextensionsV1Api(api_client)
    custom = client.CustomObjectsApi(api_client)
    crd = ext.create_custom_resource_definition(WIDGET_CRD)
    assert {c.type: c.status for c in crd.status.conditions}["Established"] == "True"
    groups = client.ApisApi(api_client).get_api_versions().groups
    assert GROUP in [g.name for g in groups]
    kinds = [r.kind for r in client.CustomObjectsApi(api_client).get_api_resources(GROUP, VERSION).resources]
    assert "Widget" in kinds
    made = custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, {
        **widget("w1", size=4, parts=2, extra={"free": "form"}), "status": {"ignored": True}})
    assert made["spec"] == {"size": 4, "parts": 2, "color": "red", "extra": {"free": "form"}}
    assert "status" not in made and made["metadata"]["generation"] == 1

    pruned = custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, widget("w2", size=1, bogus=3))
    assert "bogus" not in pruned["spec"] and pruned["spec"]["parts"] == 1

    with pytest.raises(ApiException) as schema_error:
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, widget("bad", size=0))
    assert schema_error.value.status == 422
    message = status_of(schema_error.value)["message"]
    assert message.startswith('Widget.example.dev "bad" is invalid: spec.size: Invalid value: 0')
    with pytest.raises(ApiException) as cel_error:
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, widget("odd", size=3, parts=2))
    assert cel_error.value.status == 422
    assert "spec.size: Invalid value" in status_of(cel_error.value)["message"]
    assert "size must be divisible by parts" in status_of(cel_error.value)["message"]
    with pytest.raises(ApiException) as patch_error:
        custom.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "w1", {"spec": {"color": "green"}})
    assert patch_error.value.status == 422 and "spec.color: Unsupported value" in status_of(patch_error.value)["message"]

    # /status changes only status; the main resource ignores status; spec changes bump generation.
    after = custom.patch_namespaced_custom_object_status(GROUP, VERSION, "default", PLURAL, "w1",
                                                         {"status": {"phase": "Running"}, "spec": {"size": 8}})
    assert after["status"] == {"phase": "Running"} and after["spec"]["size"] == 4 and after["metadata"]["generation"] == 1
    after = custom.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "w1",
                                                  {"status": {"phase": "Hacked"}, "spec": {"size": 8}})
    assert after["status"] == {"phase": "Running"} and after["spec"]["size"] == 8 and after["metadata"]["generation"] == 2

    ext.delete_custom_resource_definition(f"{PLURAL}.{GROUP}")
    with pytest.raises(ApiException) as gone:
        custom.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)
    assert gone.value.status == 404


def test_watch_resumes_and_follows_label_selector(api_client):
    core = client.CoreV1Api(api_client)
    start = core.list_namespaced_config_map("default").metadata.resource_version
    core.create_namespaced_config_map("default", {"metadata": {"name": "w", "labels": {"pick": "yes"}}})
    core.patch_namespaced_config_map("w", "default", {"metadata": {"labels": {"pick": "no"}}})
    core.create_namespaced_config_map("default", {"metadata": {"name": "skip"}})
    seen = []
    for event in watch.Watch().stream(core.list_namespaced_config_map, "default", label_selector="pick=yes",
                                      resource_version=start, timeout_seconds=1):
        seen.append((event["type"], event["object"].metadata.name))
    assert seen == [("ADDED", "w"), ("DELETED", "w")]  # leaving the selector reads as DELETED


def test_kopf_operator_runs_against_it(api_client, local_api, tmp_path: Path, monkeypatch):
    import kopf
    from kopf.testing import KopfRunner

    client.ApiextensionsV1Api(api_client).create_custom_resource_definition(WIDGET_CRD)
    operator_file = tmp_path / "widget_operator.py"
    operator_file.write_text(f'''
import kopf
from kubernetes import client, config

@kopf.on.login()
def login(**kwargs):
    return kopf.login_via_client(**kwargs)

@kopf.on.startup()
def configure(settings, **_):
    settings.posting.enabled = False
    settings.watching.server_timeout = 10

@kopf.on.create("{GROUP}", "{VERSION}", "{PLURAL}")
def create_fn(spec, name, namespace, body, patch, **_):
    config.load_kube_config()
    owner = dict(apiVersion=body["apiVersion"], kind=body["kind"], name=name, uid=body["metadata"]["uid"])
    client.CoreV1Api().create_namespaced_config_map(namespace, dict(
        metadata=dict(name=name + "-cm", ownerReferences=[owner]), data=dict(size=str(spec["size"]))))
    patch.status["phase"] = "Made"
''')
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    # The client reads $KUBECONFIG once, at import; a separate operator process would see the variable.
    monkeypatch.setattr("kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", str(tmp_path / "kubeconfig"))
    custom, core = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
    args = ["run", "--standalone", "--all-namespaces", "--verbose", str(operator_file)]
    # A registry of its own: the suite imports our operator's handlers, which kopf's default registry then holds
    # (their start-up would configure this widget operator as ours).
    ours = kopf.get_default_registry()
    try:
        with KopfRunner(args, timeout=60, registry=kopf.OperatorRegistry()) as runner:
            custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, widget("k1", size=2))
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                obj = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "k1")
                if (obj.get("status") or {}).get("phase") == "Made":
                    break
                time.sleep(0.2)
    finally:
        kopf.set_default_registry(ours)
    assert runner.exception is None, runner.output
    assert obj["status"]["phase"] == "Made", runner.output
    assert core.read_namespaced_config_map("k1-cm", "default").data == {"size": "2"}
