"""The operator's access to the Kubernetes API: the official client's configuration and credentials, plain JSON
dicts in and out (over ``json_transport``'s connections; watches over the client's).

Loads in-cluster credentials in a pod and ``KUBECONFIG`` elsewhere (the local cluster writes one). Calls that
meet a conflict (409), throttling (429) or a server error (5xx) are retried with exponential backoff; every
failure is counted in ``ascend_operator_api_errors``.
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from functools import cached_property, lru_cache
from urllib.parse import quote, urlencode
from typing import Any, Callable, TypeVar

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from .. import metrics
from .event_correlator import EventCorrelator
from .json_transport import JsonTransport
from ..api.group import API_GROUP, API_VERSION, CLUSTER_TRAINING_RUNTIME, KINDS, POD_FINALIZER, TRAINING_RUNTIME
from .permissions import uses, uses_on_kinds
from ..settings import API_BACKOFF_S, API_RETRIES, REQUEST_TIMEOUT_S

logger = logging.getLogger(__name__)
_PLURALS = {k.kind: k.plural for k in KINDS}
_CORE_PLURALS = {"Pod": "pods", "Service": "services", "ConfigMap": "configmaps"}
# PodGroups of the gang schedulers (render/gang.py): apiVersion -> plural.
_POD_GROUPS = {"scheduling.volcano.sh/v1beta1": "podgroups", "scheduling.x-k8s.io/v1alpha1": "podgroups"}
# kube-scheduler's own PodGroup (render/gang.py): the versions whose spec holds schedulingPolicy.gang.minCount and
# schedulingConstraints.topology as rendered, newest first (1.37 serves v1alpha3, 1.36 v1alpha2).
SCHEDULING_GROUP = "scheduling.k8s.io"
SCHEDULING_VERSIONS = ("v1alpha3", "v1alpha2")

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_API = f"/apis/{KUEUE_GROUP}/v1beta2"
# How often the kubeconfig's credentials are checked for expiry. The client checks before every request, and
# its check sets the whole configuration again (the proxy from the environment included): a third of the
# operator's CPU under a burst of creates. Tokens are refreshed five minutes before they expire anyway.
TOKEN_CHECK_S = 10.0

T = TypeVar("T")
LIST_CHUNK = 500  # items per list page (limit/continue), as kube's own informers page their lists

# Set when the operator is shutting down (SIGTERM): calls are no longer retried and no new reconcile starts, so
# the process exits within its termination grace period even against an API server that is gone.
STOPPING = threading.Event()


class ShuttingDown(Exception):
    """No new API call once the operator is stopping: a reconcile in flight ends at its next call."""


def _retrying(call: Callable[[], T], retry_conflict: bool = True, answers: tuple[int, ...] = ()) -> T:
    """``call``, again after a transient failure. A status in ``answers`` is what the caller asked to learn (a
    GET's 404: there is none), raised at once and not counted in ``ascend_operator_api_errors``."""
    for attempt in range(API_RETRIES + 1):
        if STOPPING.is_set():
            raise ShuttingDown("the operator is stopping")
        try:
            return call()
        except ApiException as e:
            if e.status in answers:
                raise
            metrics.API_ERRORS.labels(str(e.status)).inc()
            transient = e.status in (429,) or (e.status or 0) >= 500 or (e.status == 409 and retry_conflict)
            if not transient or attempt == API_RETRIES or STOPPING.wait(API_BACKOFF_S * 2 ** attempt):
                raise
    raise AssertionError("unreachable")


def _check_token_at_most_every(period_s: float, configuration: Any) -> None:
    """Run the configuration's credential hook at most once every ``period_s`` (the kubeconfig loader's hook
    installs itself anew each time it runs, so the throttle wraps whichever hook is current)."""
    last, lock = [-period_s], threading.Lock()
    hook = [configuration.refresh_api_key_hook]

    def throttled(conf: Any) -> None:
        with lock:
            if time.monotonic() - last[0] < period_s:
                return
            last[0] = time.monotonic()
            hook[0](conf)
            if conf.refresh_api_key_hook is not throttled:
                hook[0], conf.refresh_api_key_hook = conf.refresh_api_key_hook, throttled
    configuration.refresh_api_key_hook = throttled


class Kube:
    def __init__(self) -> None:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        self.api = client.ApiClient()
        # The client waits forever by default: an API server that stops answering would hold a worker (and the
        # operator's exit) for good. Calls that name their own timeout keep it.
        request = self.api.rest_client.request

        def with_timeout(*args: Any, _request_timeout: Any = None, **kwargs: Any) -> Any:
            return request(*args, _request_timeout=_request_timeout or REQUEST_TIMEOUT_S, **kwargs)
        self.api.rest_client.request = with_timeout
        if self.api.configuration.refresh_api_key_hook is not None:
            _check_token_at_most_every(TOKEN_CHECK_S, self.api.configuration)
        # Plain request/response calls on connections of their own (a third of the CPU of the client's path); a
        # server reached through a proxy keeps the client's.
        self._transport = None if self.api.configuration.proxy else \
            JsonTransport(self.api.configuration, REQUEST_TIMEOUT_S)

    def _headers(self, method: str, path: str, body: Any, query: dict[str, Any] | None,
                 content_type: str) -> tuple[dict[str, str], str]:
        """The request's headers (credentials included) and its query string."""
        headers = {"Content-Type": content_type, "Accept": "application/json", "User-Agent": self.api.user_agent}
        queries: list[tuple[str, Any]] = [(k, v) for k, v in (query or {}).items() if v is not None]
        self.api.update_params_for_auth(headers, queries, ["BearerToken"], path, method, body)
        return headers, f"?{urlencode(queries)}" if queries else ""

    def request(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None,
                content_type: str = "application/json") -> Any:
        """One request on the client's connection pool and credentials; the answer unread (a watch streams).

        Every call of the operator goes through here, not through the client's generated API methods: those
        validate their arguments with pydantic (built on each method's first call: seconds, on a loaded node)
        and, with their model classes, doubled the CPU of a pod create; a gang is thousands of them. Errors
        raise ApiException as the generated methods do. Patches are JSON merge patches
        (``application/merge-patch+json``): custom resources take no strategic merge, and on the maps the
        operator patches (annotations, data, an Event's count) the two mean the same."""
        headers, query_string = self._headers(method, path, body, query, content_type)
        response = self.api.call_api(method, self.api.configuration.host + path + query_string,
                                     header_params=headers, body=body)
        if not 200 <= response.status < 300:
            response.read()
            raise ApiException(http_resp=response)
        return response

    def _json(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None,
              content_type: str = "application/json") -> dict[str, Any]:
        """A request whose answer is one JSON document; errors raise ApiException as ``request`` does."""
        if self._transport is None:
            return json.loads(self.request(method, path, body, query, content_type).read())
        headers, query_string = self._headers(method, path, body, query, content_type)
        answer = self._transport.call(method, path + query_string, headers,
                                      None if body is None else json.dumps(body).encode())
        if not 200 <= answer.status < 300:
            error = ApiException(status=answer.status, reason=answer.reason)
            error.body, error.headers = answer.body.decode("utf-8", "replace"), answer.headers
            raise error
        return json.loads(answer.body)

    def _merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self._json("PATCH", path, patch, content_type=MERGE_PATCH)

    def _get(self, path: str) -> dict[str, Any] | None:
        """The object at ``path``, or None when there is none (404)."""
        try:
            return _retrying(lambda: self._json("GET", path), answers=(404,))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    @uses("", "pods", "create")
    @uses("", "services", "create")
    @uses("", "configmaps", "create")
    @uses("scheduling.volcano.sh", "podgroups", "create")
    @uses("scheduling.x-k8s.io", "podgroups", "create")
    @uses(SCHEDULING_GROUP, "podgroups", "create")
    def create(self, namespace: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """Create if absent: the created object, or None when it already existed (reconciling twice creates
        nothing twice)."""
        kind = body["kind"]
        if kind == "PodGroup" and body["apiVersion"].startswith(f"{SCHEDULING_GROUP}/"):
            body = {**body, "apiVersion": f"{SCHEDULING_GROUP}/{self.scheduling_version()}"}
            path = f"/apis/{body['apiVersion']}/namespaces/{quote(namespace)}/podgroups"
        elif kind == "PodGroup":
            path = f"/apis/{body['apiVersion']}/namespaces/{quote(namespace)}/{_POD_GROUPS[body['apiVersion']]}"
        else:
            path = f"/api/v1/namespaces/{quote(namespace)}/{_CORE_PLURALS[kind]}"
        # A pod is strict: a field the API does not know (a misspelt toleration key) is refused, never silently
        # dropped (the server's default, Warn, would drop it and the pod would tolerate what the user did not ask).
        query = {"fieldValidation": "Strict"} if kind == "Pod" else None
        try:
            return _retrying(lambda: self._json("POST", path, body, query), retry_conflict=False)
        except ApiException as e:
            if e.status == 409:
                return None
            raise

    def scheduling_version(self) -> str:
        """The newest version of kube-scheduler's PodGroup API this cluster serves (asked once; a cluster that
        serves none is asked again on the next call). Raises a 404 ApiException that says what the cluster needs."""
        if (found := self.__dict__.get("_scheduling_version")) is not None:
            return found
        served = {v.get("version") for v in (self._get(f"/apis/{SCHEDULING_GROUP}") or {}).get("versions") or []}
        for version in SCHEDULING_VERSIONS:
            if version in served:
                self.__dict__["_scheduling_version"] = version
                return version
        error = ApiException(status=404, reason="Not Found")
        error.body = json.dumps({"message": (
            f"this cluster serves no PodGroup API ({', '.join(f'{SCHEDULING_GROUP}/{v}' for v in SCHEDULING_VERSIONS)}"
            f"; it serves {', '.join(sorted(served)) or 'none of ' + SCHEDULING_GROUP}): gangScheduling kubernetes needs "
            "Kubernetes 1.36 or later with feature gate GenericWorkload on kube-apiserver and kube-scheduler and the "
            f"API enabled (--runtime-config={SCHEDULING_GROUP}/{SCHEDULING_VERSIONS[0]}=true)")})
        raise error

    @uses(SCHEDULING_GROUP, "podgroups", "deletecollection")
    def delete_pod_groups(self, namespace: str, selector: str) -> None:
        """Delete kube-scheduler's PodGroups matching the label ``selector`` (one request)."""
        path = f"/apis/{SCHEDULING_GROUP}/{self.scheduling_version()}/namespaces/{quote(namespace)}/podgroups"
        _retrying(lambda: self._json("DELETE", path, {"apiVersion": "v1", "kind": "DeleteOptions"},
                                     {"labelSelector": selector}), retry_conflict=False)

    @uses("", "configmaps", "patch")
    def update_config_map(self, namespace: str, body: dict[str, Any], exists: bool = False) -> None:
        """Make the ConfigMap say what ``body`` says (a restart may resume from a different checkpoint): patched
        when it ``exists`` (created if it turns out not to), else created (patched if it turns out to exist)."""
        path = f"/api/v1/namespaces/{quote(namespace)}/configmaps/{quote(body['metadata']['name'])}"
        if exists:
            try:
                _retrying(lambda: self._merge_patch(path, {"data": body["data"]}))
                return
            except ApiException as e:
                if e.status != 404:
                    raise
        if not self.create(namespace, body):
            _retrying(lambda: self._merge_patch(path, {"data": body["data"]}))

    @uses("", "configmaps", "get")
    def get_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(f"/api/v1/namespaces/{quote(namespace)}/configmaps/{quote(name)}")

    @uses("", "configmaps", "list")
    def list_config_maps(self, labels: str) -> list[dict[str, Any]]:
        """ConfigMaps in every namespace that match a label selector."""
        return self._list_all("/api/v1/configmaps", {"labelSelector": labels})

    @uses("", "pods", "list")
    def list_pods(self, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        """Pods matching the labels, LIST_CHUNK at a time (``limit``/``continue``)."""
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        return self._list_all(f"/api/v1/namespaces/{quote(namespace)}/pods", {"labelSelector": selector})

    def _list_all(self, path: str, query: dict[str, Any]) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        token = None
        while True:
            page = _retrying(lambda: self._json("GET", path, query={**query, "limit": LIST_CHUNK, "continue": token}))
            items.extend(page["items"])
            token = page["metadata"].get("continue")
            if not token:
                return items

    @uses("", "nodes", "get")
    def get_node(self, name: str) -> dict[str, Any] | None:
        """One Node (its topology labels: ``topology.placement``), or None when it is gone."""
        return self._get(f"/api/v1/nodes/{quote(name)}")

    @uses("", "nodes", "list")
    def list_nodes(self) -> list[dict[str, Any]]:
        """Every Node (an elastic job's capacity: allocatable, taints, readiness)."""
        return self._list_all("/api/v1/nodes", {})

    @uses("", "pods", "list")
    def list_live_pods(self) -> list[dict[str, Any]]:
        """The non-terminal pods of every namespace (those bound to a node hold its capacity)."""
        return self._list_all("/api/v1/pods", {"fieldSelector": "status.phase!=Succeeded,status.phase!=Failed"})

    @uses("", "pods", "delete")
    def delete_pod(self, namespace: str, name: str, uid: str, grace_seconds: int | None = None) -> bool:
        """Delete this very pod (the uid guards against deleting a newer pod of the same name), with the pod's own
        grace period or ``grace_seconds``. False: it was already gone (404) or is a newer pod of that name (409).
        ``grace_seconds=0``: force, without waiting for a kubelet to confirm (for a pod whose node is gone)."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        try:
            _retrying(lambda: self._json("DELETE", f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}", body),
                      retry_conflict=False)
            return True
        except ApiException as e:
            if e.status not in (404, 409):
                raise
            return False

    @uses("", "pods", "deletecollection")
    def delete_pods(self, namespace: str, labels: dict[str, str], unfinished_only: bool = False,
                    grace_seconds: int | None = None) -> list[dict[str, Any]]:
        """Delete every pod with ``labels`` (only those still pending or running with ``unfinished_only``) in one
        request, as ``kubectl delete pods -l`` does: a gang of N pods is one DELETE, not N. The pods deleted, as the
        server answered."""
        query = {"labelSelector": ",".join(f"{k}={v}" for k, v in labels.items())}
        if unfinished_only:
            query["fieldSelector"] = "status.phase!=Succeeded,status.phase!=Failed"
        body = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        answer = _retrying(lambda: self._json("DELETE", f"/api/v1/namespaces/{quote(namespace)}/pods", body, query),
                           retry_conflict=False)
        return answer.get("items") or []

    @staticmethod
    def _custom_path(kind: str, namespace: str | None = None, name: str | None = None) -> str:
        path = f"/apis/{API_GROUP}/{API_VERSION}"
        if namespace is not None:
            path += f"/namespaces/{quote(namespace)}"
        path += f"/{_PLURALS[kind]}"
        return path if name is None else f"{path}/{quote(name)}"

    @uses_on_kinds("", "get")
    def get_custom(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(self._custom_path(kind, namespace, name))

    @uses(API_GROUP, TRAINING_RUNTIME.plural, "get")
    @uses(API_GROUP, CLUSTER_TRAINING_RUNTIME.plural, "get")
    def get_runtime(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A training runtime a job names (runtimes.py): namespaced in the job's namespace, or cluster-wide."""
        base = f"/apis/{API_GROUP}/{API_VERSION}"
        if kind == CLUSTER_TRAINING_RUNTIME.kind:
            return self._get(f"{base}/{CLUSTER_TRAINING_RUNTIME.plural}/{quote(name)}")
        return self._get(f"{base}/namespaces/{quote(namespace)}/{TRAINING_RUNTIME.plural}/{quote(name)}")

    @uses_on_kinds("", "list")
    def list_custom(self, kind: str) -> list[dict[str, Any]]:
        """All objects of one of our kinds in every namespace."""
        return self._list_all(self._custom_path(kind), {})

    @uses("", "pods", "patch")
    def annotate_pod_of_uid(self, namespace: str, name: str, uid: str,
                            annotations: dict[str, str]) -> dict[str, Any] | None:
        """Set annotations on this very pod (the uid in the patch makes it fail on a newer pod of that name). The pod
        as it is now, or None: gone, or another pod of that name (404, 409, 422)."""
        path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}"
        patch = {"metadata": {"uid": uid, "annotations": annotations}}
        try:
            return _retrying(lambda: self._json("PATCH", path, patch, content_type=STRATEGIC_MERGE_PATCH),
                             retry_conflict=False)
        except ApiException as e:
            if e.status in (404, 409, 422):
                return None
            raise

    @uses("", "pods", "patch")
    def release_pod(self, namespace: str, name: str, uid: str) -> dict[str, Any] | None:
        """Remove the operator's finalizer (``POD_FINALIZER``) from this very pod: a strategic merge patch with
        ``$deleteFromPrimitiveList``, so another controller's finalizers stay and a pod without ours is left as it
        is; the uid in the patch makes it fail on a newer pod of that name. The pod as it is now (a pod being
        deleted goes once its last finalizer does), or None: gone, or another pod of that name (404, 409, 422).
        One request a pod: a gang of N pods is N patches (the API has no way to patch several pods at once)."""
        path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}"
        patch = {"metadata": {"uid": uid, "$deleteFromPrimitiveList/finalizers": [POD_FINALIZER]}}
        try:
            return _retrying(lambda: self._json("PATCH", path, patch, content_type=STRATEGIC_MERGE_PATCH),
                             retry_conflict=False)
        except ApiException as e:
            if e.status not in (404, 409, 422):
                raise
            return None

    @uses("", "pods", "patch")
    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> bool:
        """Merge ``annotations`` into the pod's (asking its running containers for something through a
        downwardAPI file, as stall detection asks for stacks). False: the pod is gone."""
        path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}"
        try:
            _retrying(lambda: self._merge_patch(path, {"metadata": {"annotations": annotations}}))
            return True
        except ApiException as e:
            if e.status != 404:
                raise
            return False

    @uses_on_kinds("", "patch")
    def patch_custom(self, kind: str, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """A merge patch of one of our objects (the spec: suspending a job queued in Kueue)."""
        _retrying(lambda: self._merge_patch(self._custom_path(kind, namespace, name), patch))

    @uses_on_kinds("", "delete")
    def delete_custom(self, kind: str, namespace: str, name: str) -> None:
        """Delete a job; its pods, Service and ConfigMap follow by owner references (background cascade)."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        try:
            _retrying(lambda: self._json("DELETE", self._custom_path(kind, namespace, name), body))
        except ApiException as e:
            if e.status != 404:
                raise

    @uses_on_kinds("/status", "patch")
    def patch_status(self, kind: str, namespace: str, name: str, status: dict[str, Any],
                     resource_version: str | None = None) -> dict[str, Any]:
        """Merge ``status`` into the object's; the object as the server stored it. With ``resource_version``, only
        if the object is still at that version: else 409 Conflict, not retried (the status was decided on an
        object that has changed since, and has to be decided again)."""
        patch: dict[str, Any] = {"status": status}
        if resource_version is not None:
            patch["metadata"] = {"resourceVersion": resource_version}
        return _retrying(lambda: self._merge_patch(self._custom_path(kind, namespace, name) + "/status", patch),
                         retry_conflict=resource_version is None)

    # -- Kueue (kueue/integration.py: the operator is the controller of its kinds' Workloads) -----------------------

    @uses(KUEUE_GROUP, "workloads", "create")
    def create_workload(self, namespace: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """The Workload created, or None when one of that name exists (409)."""
        try:
            return _retrying(lambda: self._json("POST", f"{KUEUE_API}/namespaces/{quote(namespace)}/workloads", body),
                             retry_conflict=False)
        except ApiException as e:
            if e.status == 409:
                return None
            raise

    @uses(KUEUE_GROUP, "workloads", "get")
    def get_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(f"{KUEUE_API}/namespaces/{quote(namespace)}/workloads/{quote(name)}")

    @uses(KUEUE_GROUP, "workloads", "patch")
    def patch_workload(self, namespace: str, name: str, patch: dict[str, Any], status: bool = False) -> dict[str, Any]:
        """A merge patch of a Workload (its finalizers, its spec) or, with ``status``, of its status. A patch that
        names ``metadata.resourceVersion`` is refused with 409 when the Workload moved on (not retried: it was
        decided on what the Workload said then)."""
        path = f"{KUEUE_API}/namespaces/{quote(namespace)}/workloads/{quote(name)}" + ("/status" if status else "")
        return _retrying(lambda: self._merge_patch(path, patch),
                         retry_conflict="resourceVersion" not in patch.get("metadata", {}))

    @uses(KUEUE_GROUP, "workloads/status", "patch")
    def patch_workload_status(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self.patch_workload(namespace, name, patch, status=True)

    @uses(KUEUE_GROUP, "resourceflavors", "get")
    def get_resource_flavor(self, name: str) -> dict[str, Any] | None:
        return self._get(f"{KUEUE_API}/resourceflavors/{quote(name)}")

    @uses(KUEUE_GROUP, "workloadpriorityclasses", "get")
    def get_workload_priority_class(self, name: str) -> dict[str, Any] | None:
        return self._get(f"{KUEUE_API}/workloadpriorityclasses/{quote(name)}")

    @uses("scheduling.k8s.io", "priorityclasses", "get")
    def get_priority_class(self, name: str) -> dict[str, Any] | None:
        return self._get(f"/apis/scheduling.k8s.io/v1/priorityclasses/{quote(name)}")

    @uses("scheduling.k8s.io", "priorityclasses", "list")
    def list_priority_classes(self) -> list[dict[str, Any]]:
        return self._list_all("/apis/scheduling.k8s.io/v1/priorityclasses", {})

    @cached_property
    def _events(self) -> EventCorrelator:
        def create(body: dict[str, Any]) -> None:
            _retrying(lambda: self._json("POST", f"/api/v1/namespaces/{quote(body['metadata']['namespace'])}/events",
                                         body))

        def patch(namespace: str, name: str, change: dict[str, Any]) -> None:
            try:
                _retrying(lambda: self._merge_patch(f"/api/v1/namespaces/{quote(namespace)}/events/{quote(name)}",
                                                    change))
            except ApiException as e:
                if e.status == 404:
                    raise LookupError(name) from e
                raise
        return EventCorrelator(create, patch)

    @uses("", "events", "create")
    @uses("", "events", "patch")
    def post_event(self, obj: dict[str, Any], reason: str, message: str, warning: bool = False,
                   name: str | None = None) -> None:
        """A core/v1 Event on one of our objects (``kubectl describe`` shows it); a repeat bumps the first one's
        count (``event_correlator``); losing one is not fatal. A ``name`` of its own posts it once: the same name
        again is refused (409) and dropped."""
        meta = obj["metadata"]
        at = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1", "kind": "Event",
            # client-go's naming: <object>.<UnixNano in hex>, so a listing in key order is in time order
            "metadata": {"name": name or f"{meta['name']}.{time.time_ns():x}", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta["uid"]},
            "reason": reason, "message": message[:1024], "type": "Warning" if warning else "Normal",
            "firstTimestamp": at, "lastTimestamp": at, "count": 1,
            "source": {"component": "ascend-train-operator"}, "reportingComponent": "ascend-train-operator",
        }
        try:
            if name:  # once only: no correlation, a second post is refused by the server
                _retrying(lambda: self._json("POST", f"/api/v1/namespaces/{quote(meta['namespace'])}/events", body),
                          retry_conflict=False)
            else:
                self._events.record(body)
        except ApiException as e:  # counted in ascend_operator_api_errors; the status carries the same message
            logger.warning("event %s on %s %s/%s not recorded: HTTP %s %s", reason, obj["kind"], meta["namespace"],
                           meta["name"], e.status, e.reason)


@lru_cache(maxsize=1)
def kube() -> Kube:
    """The operator's one client (its transport keeps its connections alive across reconciles)."""
    return Kube()
