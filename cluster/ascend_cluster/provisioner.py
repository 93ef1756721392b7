"""``Provisioner``: the local cluster's dynamic volume provisioner, the role rancher's local-path provisioner plays
on kind. The cluster's default StorageClass ``local`` names it; for every claim of that class it makes a hostPath
PersistentVolume on ``<root>/pvc/<namespace>/<claim>`` bound to the claim (kube-controller-manager's volume
controller completes the binding), and when a released volume's reclaim policy is Delete it deletes the volume
object (the directory stays: checkpoints outlive a deleted claim on this machine, as on a laptop one expects).

All local nodes share this machine's files, so a hostPath volume is reachable from every node and carries no node
affinity: a ReadWriteMany volume, as shared storage is on a training cluster.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from kubernetes.client.rest import ApiException

from .control_loop import ControlLoop

logger = logging.getLogger(__name__)
PROVISIONER = "ascendtrain.dev/local-path"
STORAGE_CLASS = {
    "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
    "metadata": {"name": "local", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
    "provisioner": PROVISIONER, "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate",
}


class Provisioner(ControlLoop):
    name = "volume-provisioner"

    def __init__(self, kubeconfig: str | Path, root: str | Path, poll_interval: float = 0.5):
        super().__init__(kubeconfig, poll_interval)
        self.root = Path(root).resolve()

    def sync_once(self) -> None:
        claims = json.loads(self.core.list_persistent_volume_claim_for_all_namespaces(
            _preload_content=False).data)["items"]
        volumes = json.loads(self.core.list_persistent_volume(_preload_content=False).data)["items"]
        claimed = {((v["spec"].get("claimRef") or {}).get("uid")) for v in volumes}
        classes = {c["metadata"]["name"]: c for c in json.loads(self.storage.list_storage_class(
            _preload_content=False).data)["items"]}
        for claim in claims:
            wanted = classes.get((claim.get("spec") or {}).get("storageClassName") or "")
            if (wanted or {}).get("provisioner") == PROVISIONER and not claim["spec"].get("volumeName") \
                    and claim["metadata"]["uid"] not in claimed and not claim["metadata"].get("deletionTimestamp"):
                self._provision(claim, wanted)
        for volume in volumes:
            if (volume.get("status") or {}).get("phase") == "Released" \
                    and volume["spec"].get("persistentVolumeReclaimPolicy") == "Delete" \
                    and (volume["metadata"].get("annotations") or {}).get(
                        "pv.kubernetes.io/provisioned-by") == PROVISIONER:
                self._delete(volume["metadata"]["name"])

    def _provision(self, claim: dict[str, Any], storage_class: dict[str, Any]) -> None:
        meta, spec = claim["metadata"], claim["spec"]
        path = self.root / "pvc" / meta["namespace"] / meta["name"]
        path.mkdir(parents=True, exist_ok=True)
        volume = {"metadata": {"name": f"pvc-{meta['uid']}",
                               "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER}},
                  "spec": {"capacity": {"storage": ((spec.get("resources") or {}).get("requests") or {}).get(
                               "storage", "1Gi")},
                           "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
                           "persistentVolumeReclaimPolicy": storage_class.get("reclaimPolicy", "Delete"),
                           "storageClassName": storage_class["metadata"]["name"],
                           "volumeMode": spec.get("volumeMode", "Filesystem"),
                           "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
                           "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                        "namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"]}}}
        try:
            self.core.create_persistent_volume(volume)
            logger.info("provisioned %s for claim %s/%s at %s", volume["metadata"]["name"], meta["namespace"],
                        meta["name"], path)
        except ApiException as exc:
            if exc.status != 409:
                raise

    def _delete(self, name: str) -> None:
        try:
            self.core.delete_persistent_volume(name)
        except ApiException as exc:
            if exc.status != 404:
                raise
