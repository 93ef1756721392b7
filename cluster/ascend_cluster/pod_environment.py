"""How a pod's container turns into a local process: env, ``$(VAR)`` expansion, volumes, paths and pod DNS.

There is no container and no mount namespace, so paths are translated instead of mounted: any container path
under a volumeMount's mountPath that appears in command, args, env values, workingDir or a projected
ConfigMap/Secret file is rewritten to the host directory that backs the volume. Pod DNS names
(``<hostname>.<subdomain>.<namespace>.svc[.cluster.local]``) are rewritten to the pod's loopback IP the same way.
These two rewrites are the runner's differences from a kubelet; a program that builds such a path or name at
run time from pieces will not see them translated.

What the pod prints is read back the other way (``ContainerPathView``): the host directories behind its mounts
(and its root file system's stand-in) are shown as the container paths, so ``kubectl logs``, ``ascend-train
logs`` and a failure's termination message read as they would on a cluster (``/workspace/ckpt``, not
``.local-cluster/pvc/default/work/ckpt``). The pod directory's ``mounts.json`` records the mapping.
"""
from __future__ import annotations

import base64
import json
import os
import re
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_POD_DNS = re.compile(r"\b([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.([a-z0-9]([-a-z0-9]*[a-z0-9])?)\."
                      r"([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.svc(\.cluster\.local)?\b")
_FIELD_LABEL = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


class PodSetupError(Exception):
    """The pod cannot start (a missing ConfigMap key, an unknown volume); reported as CreateContainerConfigError."""


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: defined names are replaced, unknown ones stay, ``$$`` escapes."""
    def replace(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR_REF.sub(replace, text)


class IpAllocator:
    """One loopback IP per pod (``<prefix>.0.1``, ``<prefix>.0.2``, ...), stable, allocated on first use or first
    mention; ``prefix`` is the cluster's own loopback /16 (see ``pod_network``).

    A pod is known by ``(namespace, hostname, subdomain)`` when it sets them, else by ``(namespace, name, "")``,
    so a worker that names ``job-0.job.ns.svc`` gets the IP that pod ``job-0`` will bind later.
    """

    def __init__(self, prefix: str = "127.1") -> None:
        self.prefix = prefix
        self._ips: dict[tuple[str, str, str], str] = {}
        self._lock = threading.Lock()  # the nodes of a cluster share one allocator

    def ip(self, key: tuple[str, str, str]) -> str:
        with self._lock:
            return self._allocate(key)

    def _allocate(self, key: tuple[str, str, str]) -> str:
        if key not in self._ips:
            n = len(self._ips) + 1
            if n > 254 * 256:
                raise RuntimeError("out of loopback addresses")
            self._ips[key] = f"{self.prefix}.{(n - 1) // 254}.{1 + (n - 1) % 254}"
        return self._ips[key]

    @staticmethod
    def pod_key(pod: Mapping[str, Any]) -> tuple[str, str, str]:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        if spec.get("hostname") and spec.get("subdomain"):
            return meta["namespace"], spec["hostname"], spec["subdomain"]
        return meta["namespace"], meta["name"], ""

    def map_dns(self, text: str) -> str:
        """Replace pod DNS names with their IPs."""
        return _POD_DNS.sub(lambda m: self.ip((m.group(5), m.group(1), m.group(3))), text)


@dataclass
class ContainerLaunch:
    """Everything needed to start the process for a pod's first container."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    mounts: dict[str, Path] = field(default_factory=dict)  # container mountPath -> host path


def host_base_env() -> dict[str, str]:
    """The "image" environment: the host's, with the venv's bin first on PATH, minus the host's kubeconfig."""
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG",)}
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bindir] + [p for p in env.get("PATH", "").split(os.pathsep) if p and p != bindir])
    return env


class PathTranslator:
    """Rewrites container paths under mountPaths (longest first) to host paths."""

    def __init__(self, mounts: Mapping[str, Path]):
        ordered = sorted(mounts.items(), key=lambda kv: len(kv[0]), reverse=True)
        self._rules = [(re.compile(r"(?<![\w.-])" + re.escape(m.rstrip("/") or "/") + r"(?=/|$|[^\w.-])"), str(h))
                       for m, h in ordered]

    def __call__(self, text: str) -> str:
        for pattern, host in self._rules:
            text = pattern.sub(lambda _m, host=host: host, text)
        return text


MOUNTS_RECORD = "mounts.json"  # in the pod's directory: container path -> host path of its last start


class ContainerPathView:
    """Rewrites the host paths behind a pod's mounts back to their container paths (the longest host path first),
    and the pod's stand-in root file system (``<pod dir>/rootfs``) to ``/``."""

    def __init__(self, mounts: Mapping[str, Path], rootfs: Path | None = None):
        hosts: dict[str, str] = {}
        for container, host in mounts.items():
            for spelling in (str(host), str(Path(host).resolve())):  # either may be printed
                hosts.setdefault(spelling.rstrip("/"), container.rstrip("/"))
        if rootfs is not None:
            for spelling in (str(rootfs), str(rootfs.resolve())):
                hosts.setdefault(spelling.rstrip("/"), "")
        self._hosts = hosts
        alternatives = "|".join(re.escape(h) for h in sorted(hosts, key=len, reverse=True) if h)
        self._pattern = re.compile(r"(?<![\w.-])(?:" + alternatives + r")(?=/|$|[^\w.-])") if alternatives else None

    @classmethod
    def of_pod(cls, pod_dir: Path) -> ContainerPathView:
        """The view recorded when the pod's container last started (no rewriting before it has started)."""
        try:
            mounts = {c: Path(h) for c, h in json.loads((pod_dir / MOUNTS_RECORD).read_text()).items()}
        except (OSError, ValueError):
            return cls({})
        return cls(mounts, pod_dir / "rootfs")

    def text(self, text: str) -> str:
        if self._pattern is None:
            return text

        def container(m: re.Match[str]) -> str:
            path = self._hosts[m.group(0)]
            return path if path or m.string.startswith("/", m.end()) else "/"

        return self._pattern.sub(container, text)

    def bytes(self, data: bytes) -> bytes:
        """The same on raw output; bytes that are not UTF-8 pass through unchanged."""
        if self._pattern is None:
            return data
        return self.text(data.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")


# (plural "configmaps", "secrets", "persistentvolumeclaims" or "persistentvolumes", namespace, name) -> the object
Lookup = Callable[[str, str, str], dict[str, Any] | None]
TokenSource = Callable[[dict[str, Any], dict[str, Any]], str]  # (pod, its serviceAccountToken source) -> a token


def _object_data(obj: dict[str, Any], kind: str) -> dict[str, str]:
    if kind == "secrets":
        return {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
    return dict(obj.get("data") or {})


def _key_ref(ref: dict[str, Any], kind: str, namespace: str, lookup: Lookup) -> str | None:
    obj = lookup(kind, namespace, ref.get("name", ""))
    data = _object_data(obj, kind) if obj else None
    if data is None or ref.get("key") not in data:
        if ref.get("optional"):
            return None
        what = "configmap" if kind == "configmaps" else "secret"
        raise PodSetupError(f'{what} "{ref.get("name")}" or its key "{ref.get("key")}" not found')
    return data[ref["key"]]


def _field_ref(pod: dict[str, Any], path: str) -> str:
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    if m := _FIELD_LABEL.match(path):
        return (meta.get(m.group(1)) or {}).get(m.group(2), "")
    simple = {"metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace"),
              "metadata.uid": meta.get("uid"), "spec.nodeName": spec.get("nodeName"),
              "spec.serviceAccountName": spec.get("serviceAccountName"),
              "status.podIP": status.get("podIP"), "status.hostIP": status.get("hostIP")}
    if path not in simple:
        raise PodSetupError(f"unsupported fieldRef {path!r}")
    return simple[path] or ""


def _confined(base: Path, relative: str, what: str) -> Path:
    """``base / relative``, refused unless it stays inside ``base`` after resolving ``..`` and symbolic links:
    a kubelet mounts only what the volume names, so no spelling of a claim, subPath or hostPath may reach the
    rest of this machine (kube-apiserver already refuses absolute subPaths and ``..`` components)."""
    if relative.startswith("/") or ".." in Path(relative).parts:
        raise PodSetupError(f"{what} {relative!r}: must be a relative path without '..'")
    target = (base / relative).resolve()
    if not target.is_relative_to(base.resolve()):
        raise PodSetupError(f"{what} {relative!r}: resolves outside the volume ({target})")
    return target


def prepare_volumes(pod: dict[str, Any], pod_dir: Path, cluster_root: Path, lookup: Lookup,
                    translate_text: Callable[[str], str], token_for: TokenSource | None = None) -> dict[str, Path]:
    """Create the host directories behind the pod's volumes; returns mountPath -> host path for its container."""
    namespace = pod["metadata"]["namespace"]
    spec = pod.get("spec") or {}
    volumes: dict[str, Path] = {}
    projected: dict[str, dict[str, str]] = {}
    for volume in spec.get("volumes") or []:
        name = volume["name"]
        if "emptyDir" in volume:
            volumes[name] = pod_dir / "volumes" / name
        elif "persistentVolumeClaim" in volume:
            volumes[name] = claimed_directory(volume["persistentVolumeClaim"]["claimName"], namespace, lookup, name)
        elif "hostPath" in volume:
            # Differs from a kubelet: the "node's" filesystem is <root>/hostpath, never this machine's own.
            host = volume["hostPath"]["path"]
            volumes[name] = _confined(cluster_root / "hostpath", host.lstrip("/"), f'volume "{name}": hostPath')
        elif "configMap" in volume or "secret" in volume:
            kind = "configmaps" if "configMap" in volume else "secrets"
            source = volume.get("configMap") or volume.get("secret") or {}
            obj_name = source.get("name") or source.get("secretName", "")
            obj = lookup(kind, namespace, obj_name)
            if obj is None:
                if source.get("optional"):
                    obj = {}
                else:
                    what = "configmap" if kind == "configmaps" else "secret"
                    raise PodSetupError(f'{what} "{obj_name}" not found (volume "{name}")')
            data = _object_data(obj, kind)
            items = source.get("items")
            projected[name] = ({item["path"]: data[item["key"]] for item in items if item["key"] in data}
                               if items else data)
            for rel in projected[name]:
                _confined(pod_dir / "volumes" / name, rel, f'volume "{name}": items path')
            volumes[name] = pod_dir / "volumes" / name
        elif "downwardAPI" in volume:
            volumes[name] = pod_dir / "volumes" / name
            for rel in downward_api_files(pod, volume["downwardAPI"], name):
                _confined(volumes[name], rel, f'volume "{name}": items path')
        elif "projected" in volume:
            projected[name] = projected_files(pod, volume["projected"], name, lookup, token_for)
            for rel in projected[name]:
                _confined(pod_dir / "volumes" / name, rel, f'volume "{name}": sources path')
            volumes[name] = pod_dir / "volumes" / name
        else:
            # Differs from a kubelet: other volume types (csi, nfs, ephemeral...) are not run here.
            raise PodSetupError(f'volume "{name}": only emptyDir, configMap, secret, downwardAPI, projected, '
                                "persistentVolumeClaim and hostPath are supported by the local node agent")
    for path in volumes.values():
        path.mkdir(parents=True, exist_ok=True)
    container = (spec.get("containers") or [{}])[0]
    mounts: dict[str, Path] = {}
    for mount in container.get("volumeMounts") or []:
        if mount["name"] not in volumes:
            raise PodSetupError(f'volumeMount "{mount["name"]}" names no volume of the pod')
        host = _confined(volumes[mount["name"]], mount["subPath"], f'volumeMount "{mount["name"]}": subPath') \
            if mount.get("subPath") else volumes[mount["name"]]
        mounts[mount["mountPath"]] = host
    # Projected files are written after all mounts are known, so paths inside them translate too.
    translate = PathTranslator(mounts)
    for name, files in projected.items():
        for rel, content in files.items():
            target = volumes[name] / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.tmp")
            tmp.write_text(translate_text(translate(content)))
            tmp.replace(target)
    refresh_downward_api(pod, pod_dir)
    return mounts


def claimed_directory(claim: str, namespace: str, lookup: Lookup, volume: str) -> Path:
    """The host directory behind a claim: its bound PersistentVolume's ``hostPath`` or ``local`` path (the local
    cluster's provisioner makes hostPath volumes; an administrator may make either)."""
    pvc = lookup("persistentvolumeclaims", namespace, claim)
    if pvc is None:
        raise PodSetupError(f'persistentvolumeclaim "{claim}" not found (volume "{volume}")')
    bound = (pvc.get("spec") or {}).get("volumeName")
    pv = lookup("persistentvolumes", "", bound) if bound else None
    if pv is None:
        raise PodSetupError(f'persistentvolumeclaim "{claim}" is not bound to a volume (volume "{volume}")')
    source = (pv.get("spec") or {}).get("hostPath") or (pv.get("spec") or {}).get("local")
    if not source:
        raise PodSetupError(f'persistentvolume "{bound}" is neither hostPath nor local: the local node agent '
                            f'cannot mount it (volume "{volume}")')
    return Path(source["path"])


def projected_files(pod: dict[str, Any], source: dict[str, Any], volume: str, lookup: Lookup,
                    token_for: TokenSource | None) -> dict[str, str]:
    """A projected volume's files (path -> content): service-account tokens (from the TokenRequest API, bound to
    the pod), ConfigMap and Secret keys and downward API fields, as the kubelet writes them."""
    namespace = pod["metadata"]["namespace"]
    files: dict[str, str] = {}
    for part in source.get("sources") or []:
        if "serviceAccountToken" in part:
            if token_for is None:
                raise PodSetupError(f'volume "{volume}": no token source for serviceAccountToken')
            files[part["serviceAccountToken"]["path"]] = token_for(pod, part["serviceAccountToken"])
        elif "configMap" in part or "secret" in part:
            kind = "configmaps" if "configMap" in part else "secrets"
            ref = part.get("configMap") or part.get("secret") or {}
            obj = lookup(kind, namespace, ref.get("name", ""))
            if obj is None:
                if ref.get("optional"):
                    continue
                raise PodSetupError(f'{kind[:-1]} "{ref.get("name")}" not found (volume "{volume}")')
            data = _object_data(obj, kind)
            items = ref.get("items")
            files.update({item["path"]: data[item["key"]] for item in items if item["key"] in data}
                         if items else data)
        elif "downwardAPI" in part:
            files.update(downward_api_files(pod, part["downwardAPI"], volume))
        else:
            raise PodSetupError(f'volume "{volume}": projected sources other than serviceAccountToken, configMap, '
                                "secret and downwardAPI are not supported by the local node agent")
    return files


def _format_map(values: Mapping[str, str]) -> str:
    """The kubelet's ``fieldpath.FormatMap``: ``key="value"`` lines sorted by key, each value quoted as Go's %q
    does (a JSON string for printable text), no newline after the last."""
    return "\n".join(f"{key}={json.dumps(values[key], ensure_ascii=False)}" for key in sorted(values))


def downward_api_files(pod: dict[str, Any], source: dict[str, Any], volume: str) -> dict[str, str]:
    """A downwardAPI volume's files for the pod as it is now (path -> content)."""
    meta = pod["metadata"]
    files: dict[str, str] = {}
    for item in source.get("items") or []:
        path = (item.get("fieldRef") or {}).get("fieldPath")
        if path is None:  # resourceFieldRef (limits and requests) is not emulated
            raise PodSetupError(f'volume "{volume}": items[].resourceFieldRef is not supported by the local runner')
        if path in ("metadata.labels", "metadata.annotations"):
            files[item["path"]] = _format_map(meta.get(path.split(".")[1]) or {})
        elif path in ("metadata.name", "metadata.namespace", "metadata.uid") or _FIELD_LABEL.match(path):
            files[item["path"]] = _field_ref(pod, path)
        else:  # the kubelet allows only these in a volume (spec and status fields go to env vars)
            raise PodSetupError(f'volume "{volume}": fieldRef {path!r} is not supported in a downwardAPI volume')
    return files


def refresh_downward_api(pod: dict[str, Any], pod_dir: Path) -> None:
    """(Re)write the pod's downwardAPI files where their content changed, each atomically: the kubelet does this
    on every pod sync, so a running container sees labels and annotations changed after it started. Differs
    from a kubelet only in timing: the local runner syncs every fraction of a second, a kubelet about once a
    minute (its syncFrequency plus jitter), so nothing may depend on how soon a change shows."""
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        if "downwardAPI" not in volume:
            continue
        for rel, content in downward_api_files(pod, volume["downwardAPI"], volume["name"]).items():
            target = pod_dir / "volumes" / volume["name"] / rel
            if target.exists() and target.read_text() == content:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.tmp")
            tmp.write_text(content)
            tmp.replace(target)


TERMINATION_MESSAGE_PATH = "/dev/termination-log"  # the Pod API's default terminationMessagePath


def termination_message_file(pod_dir: Path) -> Path:
    return pod_dir / "termination-log"


SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"  # where kube-api-access-* is mounted
IN_CLUSTER_KUBECONFIG = "in-cluster-kubeconfig"  # in the pod's directory


def in_cluster_env(pod_dir: Path, mounts: Mapping[str, Path], api_server: str, namespace: str) -> dict[str, str]:
    """What lets a pod's process reach the API server as its ServiceAccount. A kubelet gives every pod
    ``KUBERNETES_SERVICE_HOST``/``PORT``, and clients read the token and CA at the fixed path
    ``/var/run/secrets/kubernetes.io/serviceaccount``, which a local process cannot see (its mount is a folder of the
    pod's directory, and only paths in argv and env are rewritten). So a pod that mounts a service-account token
    there also gets ``KUBECONFIG``: a kubeconfig of exactly what the in-cluster config would hold (the server, the
    mounted ``ca.crt`` and ``tokenFile`` pointing at the mounted token), which client-go, the Python client, kopf
    and helm all read. Empty when the pod mounts no token (automountServiceAccountToken: false)."""
    folder = mounts.get(SERVICE_ACCOUNT_DIR)
    if folder is None:
        return {}
    from urllib.parse import urlsplit

    address = urlsplit(api_server)
    kubeconfig = pod_dir / IN_CLUSTER_KUBECONFIG
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "in-cluster",
        "clusters": [{"name": "in-cluster", "cluster": {"server": api_server,
                                                         "certificate-authority": str(Path(folder) / "ca.crt")}}],
        "users": [{"name": "service-account", "user": {"tokenFile": str(Path(folder) / "token")}}],
        "contexts": [{"name": "in-cluster", "context": {"cluster": "in-cluster", "user": "service-account",
                                                        "namespace": namespace}}],
    }, indent=1))
    return {"KUBERNETES_SERVICE_HOST": address.hostname or "", "KUBERNETES_SERVICE_PORT": str(address.port or 443),
            "KUBECONFIG": str(kubeconfig)}


def container_launch(pod: dict[str, Any], pod_dir: Path, cluster_root: Path, lookup: Lookup,
                     ips: IpAllocator, token_for: TokenSource | None = None,
                     api_server: str | None = None) -> ContainerLaunch:
    """The argv, env and cwd of the pod's first container, with all the rewrites applied. ``api_server``: the
    address pods reach the API server at (``in_cluster_env``)."""
    namespace = pod["metadata"]["namespace"]
    container = (pod.get("spec") or {}).get("containers", [{}])[0]
    mounts = prepare_volumes(pod, pod_dir, cluster_root, lookup, ips.map_dns, token_for)
    # The kubelet bind-mounts a file for the container's final message; here it is a file in the pod's dir.
    mounts[container.get("terminationMessagePath", TERMINATION_MESSAGE_PATH)] = termination_message_file(pod_dir)
    translate = PathTranslator(mounts)
    pod_dir.mkdir(parents=True, exist_ok=True)
    (pod_dir / MOUNTS_RECORD).write_text(json.dumps({c: str(h) for c, h in mounts.items()}))

    def rewrite(text: str) -> str:
        return ips.map_dns(translate(text))

    env = host_base_env()
    env["HOSTNAME"] = (pod.get("spec") or {}).get("hostname") or pod["metadata"]["name"]
    if api_server:
        env.update(in_cluster_env(pod_dir, mounts, api_server, pod["metadata"]["namespace"]))
    defined: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        kind = "configmaps" if "configMapRef" in source else "secrets"
        ref = source.get("configMapRef") or source.get("secretRef") or {}
        obj = lookup(kind, namespace, ref.get("name", ""))
        if obj is None and not ref.get("optional"):
            raise PodSetupError(f'{kind[:-1]} "{ref.get("name")}" not found (envFrom)')
        for k, v in (_object_data(obj, kind) if obj else {}).items():
            defined[source.get("prefix", "") + k] = rewrite(v)
    for item in container.get("env") or []:
        if "valueFrom" in item:
            src = item["valueFrom"]
            if "fieldRef" in src:
                value: str | None = _field_ref(pod, src["fieldRef"]["fieldPath"])
            elif "configMapKeyRef" in src:
                value = _key_ref(src["configMapKeyRef"], "configmaps", namespace, lookup)
            elif "secretKeyRef" in src:
                value = _key_ref(src["secretKeyRef"], "secrets", namespace, lookup)
            else:
                # resourceFieldRef (limits/requests) is not emulated: there are no cgroup limits locally.
                continue
            if value is None:
                continue
        else:
            value = expand(item.get("value", ""), defined)
        defined[item["name"]] = rewrite(value)
    env.update(defined)
    if not container.get("command"):
        raise PodSetupError("the container has no command: images' entrypoints cannot be known locally")
    command = [expand(a, defined) for a in container["command"] + (container.get("args") or [])]
    argv = [rewrite(a) for a in command]
    workdir = container.get("workingDir")
    cwd = Path(rewrite(workdir)) if workdir else pod_dir / "rootfs"
    if workdir and not cwd.exists() and workdir == str(cwd):
        cwd = pod_dir / "rootfs" / workdir.lstrip("/")  # a path inside the "image": created per pod
    cwd.mkdir(parents=True, exist_ok=True)
    return ContainerLaunch(argv, env, cwd, mounts)
