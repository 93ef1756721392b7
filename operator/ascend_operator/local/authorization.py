"""Who a request comes from and whether RBAC lets them: kube-apiserver's bearer-token authentication and its RBAC
authorizer, for the local API server.

Tokens: the cluster's admin token (the kubeconfig ``LocalApiServer`` writes) is a member of ``system:masters``,
which kube-apiserver lets do anything; so is a request without a token: the server is plain HTTP on loopback,
where kubectl sends no bearer token, and kube-apiserver's insecure port (removed in 1.20) served such requests as
``system:unsecured`` in ``system:masters``. Tokens issued for a ServiceAccount (``issue``: what a pod's projected token
would carry) are ``system:serviceaccount:<namespace>:<name>`` in ``system:serviceaccounts`` and
``system:serviceaccounts:<namespace>``; an unknown token is 401 Unauthorized. Everyone but the masters is held to the Roles, ClusterRoles and their bindings stored in the
API, so the operator started by ``LocalCluster`` under its chart's rules fails here, with kube-apiserver's 403,
wherever it would fail on a cluster.

Differs from a real API server: the default ClusterRoles are not stored; discovery, ``/version`` and
``/openapi`` are open to every authenticated user (``system:discovery``, ``system:public-info-viewer``) and
nothing else is granted by default; aggregation and escalation checks on writes of RBAC objects are not made;
there is no TLS, so no anonymous user (the Python ``kubernetes`` client and kopf do send tokens over HTTP).
"""
from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

RBAC_GROUP = "rbac.authorization.k8s.io"


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...]

    @property
    def master(self) -> bool:
        return "system:masters" in self.groups


UNSECURED = User("system:unsecured", ("system:masters", "system:authenticated"))


def service_account(namespace: str, name: str) -> User:
    return User(f"system:serviceaccount:{namespace}:{name}",
                ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"))


class Tokens:
    """Bearer tokens the server knows, and whose they are."""

    def __init__(self, admin_token: str) -> None:
        self._users = {admin_token: User("kubernetes-admin", ("system:masters", "system:authenticated"))}

    def issue(self, user: User) -> str:
        token = secrets.token_urlsafe(24)
        self._users[token] = user
        return token

    def user(self, authorization: str | None) -> User | None:
        """The request's user; None for a token nobody issued (401)."""
        if not authorization:
            return UNSECURED
        scheme, _, token = authorization.partition(" ")
        return self._users.get(token.strip()) if scheme.lower() == "bearer" else None


def verb(method: str, name: str | None, watching: bool) -> str:
    """The RBAC verb of a resource request (kube-apiserver's RequestInfo)."""
    method = method.upper()
    if method == "GET":
        return "watch" if watching else ("get" if name else "list")
    return {"POST": "create", "PUT": "update", "PATCH": "patch",
            "DELETE": "delete" if name else "deletecollection"}.get(method, method.lower())


def _subject_matches(subject: dict[str, Any], user: User, binding_namespace: str | None) -> bool:
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "User":
        return name == user.name
    if kind == "Group":
        return name in user.groups
    if kind == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace
        return user.name == f"system:serviceaccount:{namespace}:{name}"
    return False


def _rule_allows(rule: dict[str, Any], verb_: str, group: str, resource: str, name: str | None) -> bool:
    if not ({"*", verb_} & set(rule.get("verbs") or [])):
        return False
    if not ({"*", group} & set(rule.get("apiGroups") or [])):
        return False
    _, _, sub = resource.partition("/")
    resources = set(rule.get("resources") or [])
    if not (resource in resources or "*" in resources or (sub and f"*/{sub}" in resources)):
        return False
    names = rule.get("resourceNames") or []
    return not names or (name is not None and name in names)


def allowed(user: User, verb_: str, group: str, resource: str, namespace: str | None, name: str | None,
            objects: Callable[[str, str | None], Iterable[dict[str, Any]]]) -> bool:
    """Whether RBAC lets ``user`` do ``verb_`` on ``resource`` (``plural[/subresource]``) of ``group``;
    ``objects(plural, namespace)`` lists the stored RBAC objects of that plural (namespace None: all)."""
    if user.master:
        return True
    roles = {(r["metadata"].get("namespace"), r["metadata"]["name"]): r for r in objects("roles", None)}
    cluster_roles = {r["metadata"]["name"]: r for r in objects("clusterroles", None)}
    bindings = [(b, None) for b in objects("clusterrolebindings", None)]
    if namespace:
        bindings += [(b, namespace) for b in objects("rolebindings", namespace)]
    for binding, binding_namespace in bindings:
        if not any(_subject_matches(s, user, binding_namespace) for s in binding.get("subjects") or []):
            continue
        ref = binding.get("roleRef") or {}
        role = cluster_roles.get(ref.get("name")) if ref.get("kind") == "ClusterRole" else \
            roles.get((binding_namespace, ref.get("name")))
        if role and any(_rule_allows(rule, verb_, group, resource, name) for rule in role.get("rules") or []):
            return True
    return False


def forbidden_message(user: User, verb_: str, group: str, resource: str, namespace: str | None,
                      name: str | None) -> str:
    """kube-apiserver's words for a 403."""
    what = f'{resource.split("/")[0]} "{name}"' if name else resource.split("/")[0]
    where = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
    return (f'{what} is forbidden: User "{user.name}" cannot {verb_} resource "{resource}" in API group "{group}" '
            f"{where}")
