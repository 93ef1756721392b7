"""A thin generic client for the command line: discovery by kind/plural/short name, apply, get, delete.

It goes through the ``kubernetes`` client's ApiClient (so the kubeconfig's server and credentials apply) and
works on plain dicts, like ``kubectl`` does for any kind the server announces.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import urllib3
from kubernetes import client, config
from kubernetes.client.rest import ApiException

# kube-apiserver's limit on a request's body (its MaxRequestBodyBytes, 3 MiB). A bigger one is refused with 413,
# but the server may close the connection before the client has sent the whole body, which the client then sees
# as a broken connection, not as the answer.
MAX_REQUEST_BYTES = 3 * 1024 * 1024


@dataclass(frozen=True)
class ApiResource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: tuple[str, ...] = field(default=())

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str = "") -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
        return base + (f"/{subresource}" if subresource else "")


class ApiRequestError(Exception):
    """An API error answered with a Status; ``message`` is the server's own words (e.g. a 422 naming the field)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class ResourceClient:
    def __init__(self, kubeconfig: str | Path):
        configuration = client.Configuration()
        config.load_kube_config(str(kubeconfig), client_configuration=configuration)
        self.api = client.ApiClient(configuration)
        self._resources: list[ApiResource] | None = None

    def close(self) -> None:
        self.api.close()

    def __enter__(self) -> ResourceClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def wait_established(self, crd_names: list[str], timeout_s: float = 60.0) -> None:
        """Wait until each CustomResourceDefinition is Established (its kind is served), as ``kubectl wait
        --for=condition=Established`` does."""
        deadline = time.monotonic() + timeout_s
        for name in crd_names:
            while True:
                crd = self.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
                if any(c["type"] == "Established" and c["status"] == "True"
                       for c in (crd.get("status") or {}).get("conditions") or []):
                    break
                if time.monotonic() > deadline:
                    raise ApiRequestError(504, f"CustomResourceDefinition {name} not established after "
                                               f"{timeout_s:.0f} s: {crd.get('status')}")
                time.sleep(0.1)
        self._resources = None  # discovery has new kinds now

    def request(self, method: str, path: str, body: Any = None, query: dict[str, str] | None = None,
                content_type: str = "application/json") -> Any:
        url = self.api.configuration.host + path + (f"?{urlencode(query)}" if query else "")
        headers = {"Accept": "application/json", "Content-Type": content_type}
        self.api.update_params_for_auth(headers, [], ["BearerToken"], path, method, body)
        try:
            response = self.api.call_api(method, url, header_params=headers, body=body)
            response.read()
        except urllib3.exceptions.MaxRetryError as exc:
            # Connected, then lost while sending: say what the server refused, not that it cannot be reached.
            if body is None or isinstance(exc.reason, urllib3.exceptions.NewConnectionError) or not self._answers():
                raise
            size = len(json.dumps(body).encode())
            if size > MAX_REQUEST_BYTES:
                raise ApiRequestError(413, f"Request entity too large: limit is {MAX_REQUEST_BYTES} (this request "
                                           f"is {size} bytes; the server closed the connection before reading it "
                                           "all)") from None
            raise ApiRequestError(0, f"the connection to the server was lost during the request ({exc.reason})") \
                from None
        except ApiException as exc:
            try:
                message = json.loads(exc.body or "{}").get("message") or exc.reason
            except ValueError:
                message = exc.body or exc.reason
            raise ApiRequestError(exc.status or 0, message) from None
        if response.status >= 400:
            try:
                message = json.loads(response.data or b"{}").get("message")
            except ValueError:
                message = None
            raise ApiRequestError(response.status, message or response.data.decode(errors="replace"))
        return json.loads(response.data) if response.data else None

    def _answers(self) -> bool:
        """Whether the server answers a small request (GET /version) now."""
        headers = {"Accept": "application/json"}
        self.api.update_params_for_auth(headers, [], ["BearerToken"], "/version", "GET", None)
        try:
            self.api.call_api("GET", self.api.configuration.host + "/version", header_params=headers,
                              _request_timeout=5).read()
            return True
        except Exception:  # noqa: BLE001  (any failure: it does not answer)
            return False

    # -- discovery -------------------------------------------------------------------------------

    def resources(self, refresh: bool = False) -> list[ApiResource]:
        if self._resources is None or refresh:
            found: list[ApiResource] = []
            versions = [("", "v1")] + [(g["name"], g["preferredVersion"]["version"])
                                       for g in self.request("GET", "/apis").get("groups", [])]
            for group, version in versions:
                listing = self.request("GET", f"/apis/{group}/{version}" if group else f"/api/{version}")
                for r in listing.get("resources", []):
                    if "/" not in r["name"]:
                        found.append(ApiResource(group, version, r["name"], r["kind"], r.get("namespaced", True),
                                                 r.get("singularName", ""), tuple(r.get("shortNames") or ())))
            self._resources = found
        return self._resources

    def resolve(self, what: str) -> ApiResource:
        """A kind, plural, singular or short name (``atj``, ``AscendTrainJob``, ``pods``, ``pods.v1``)."""
        name, _, group = what.partition(".")
        for refresh in (False, True):
            for r in self.resources(refresh):
                if group and not (r.group == group or r.version == group or r.group.startswith(group)):
                    continue
                if name.lower() in (r.plural, r.singular, r.kind.lower(), *r.short_names):
                    return r
        raise ApiRequestError(404, f'the server doesn\'t have a resource type "{what}"')

    def for_object(self, obj: dict[str, Any]) -> ApiResource:
        api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
        for refresh in (False, True):
            for r in self.resources(refresh):
                if r.api_version == api_version and r.kind == kind:
                    return r
        raise ApiRequestError(404, f'no matches for kind "{kind}" in version "{api_version}"')

    # -- verbs -----------------------------------------------------------------------------------

    def apply(self, obj: dict[str, Any], namespace: str = "default",
              field_validation: str = "Strict") -> tuple[dict[str, Any], str]:
        """Create, or merge-patch what exists; returns the object and "created", "configured" or "unchanged".
        ``field_validation`` is sent as the server's fieldValidation (Strict by default, as kubectl does): an
        unknown field such as a misspelt ``tensorModelParalelSize`` is then an error, not a silent default."""
        r = self.for_object(obj)
        ns = (obj.get("metadata") or {}).get("namespace") or namespace if r.namespaced else None
        name = obj["metadata"]["name"]
        query = {"fieldValidation": field_validation}
        try:
            return self.request("POST", r.path(ns), obj, query), "created"
        except ApiRequestError as exc:
            if exc.status != 409:
                raise
        before = self.request("GET", r.path(ns, name))
        after = self.request("PATCH", r.path(ns, name), obj, query, content_type="application/merge-patch+json")
        same = before["metadata"]["resourceVersion"] == after["metadata"]["resourceVersion"]
        return after, "unchanged" if same else "configured"

    def get(self, r: ApiResource, name: str, namespace: str | None) -> dict[str, Any]:
        return self.request("GET", r.path(namespace, name))

    def list(self, r: ApiResource, namespace: str | None) -> list[dict[str, Any]]:
        return self.request("GET", r.path(namespace))["items"]

    def delete(self, r: ApiResource, name: str, namespace: str | None) -> dict[str, Any]:
        return self.request("DELETE", r.path(namespace, name))

    def printer_columns(self, r: ApiResource) -> list[dict[str, Any]]:
        """The CRD's additionalPrinterColumns for ``r`` (empty for built-in kinds)."""
        if not r.group or r.group.endswith("k8s.io"):
            return []
        try:
            crd = self.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{r.plural}.{r.group}")
        except ApiRequestError:
            return []
        for version in crd["spec"].get("versions", []):
            if version["name"] == r.version:
                return version.get("additionalPrinterColumns") or []
        return []
