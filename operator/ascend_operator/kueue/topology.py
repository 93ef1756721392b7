"""Kueue's topology-aware scheduling (TAS) for a job with ``spec.topology``: what its pod set says to Kueue, and
what its pods carry once Kueue admitted it with a topology assignment.

The pod set's template carries Kueue's topology annotations, as a built-in job's pod template does
(``kueue.x-k8s.io/podset-required-topology`` or ``-preferred-topology``; with ``topology.tensorParallel`` and groups
that span pods, ``podset-slice-required-topology`` and ``podset-slice-size``: each tensor-parallel group's pods in
one domain of that level), and the Workload's pod set the ``topologyRequest`` Kueue's jobframework builds from them,
with ``podIndexLabel`` the pods' index label, so Kueue assigns consecutive indices to one domain. Kueue reads only
the request on a Workload it did not build; the annotations are on the template for whoever reads it as a built-in
job's.

Kueue assigns domains (``status.admission.podSetAssignments[].topologyAssignment``); its TopologyUngater then gives
each pod its domain's node labels as nodeSelector and removes the scheduling gate ``kueue.x-k8s.io/topology``. So
the pods the operator creates after such an admission carry that gate, the annotation ``kueue.x-k8s.io/workload``
(how the ungater finds them) and the topology annotations (how Kueue tells TAS pods from others). A job that is not
queued, or not admitted by a TAS flavor, carries none of them: Kueue would count a pod annotated so as one of its
own placements.
"""
from __future__ import annotations

from typing import Any

from ..api.group import LABEL_REPLICA_INDEX

REQUIRED = "kueue.x-k8s.io/podset-required-topology"
PREFERRED = "kueue.x-k8s.io/podset-preferred-topology"
SLICE_REQUIRED = "kueue.x-k8s.io/podset-slice-required-topology"
SLICE_SIZE = "kueue.x-k8s.io/podset-slice-size"
ANNOTATIONS = (REQUIRED, PREFERRED, SLICE_REQUIRED, SLICE_SIZE)
GATE = "kueue.x-k8s.io/topology"
WORKLOAD_ANNOTATION = "kueue.x-k8s.io/workload"


def annotations(spec: Any) -> dict[str, str]:
    """Kueue's topology annotations for a job's pods (none without ``spec.topology``). Kueue takes a pod for TAS
    only with a required or preferred level: a topology with neither prefers its coarsest level."""
    topology = getattr(spec, "topology", None)
    if topology is None:
        return {}
    out = {REQUIRED: topology.required} if topology.required else {PREFERRED: topology.preferred or topology.levels[0]}
    if topology.tensorParallel and (pods := spec.tensor_parallel_pods()) > 1:
        out.update({SLICE_REQUIRED: topology.tensorParallel, SLICE_SIZE: str(pods)})
    return out


def topology_request(template_annotations: dict[str, str]) -> dict[str, Any] | None:
    """A pod set's ``topologyRequest`` from its template's annotations, as Kueue's jobframework builds it."""
    if not any(k in template_annotations for k in ANNOTATIONS):
        return None
    request: dict[str, Any] = {"podIndexLabel": LABEL_REPLICA_INDEX}
    if REQUIRED in template_annotations:
        request["required"] = template_annotations[REQUIRED]
    elif PREFERRED in template_annotations:
        request["preferred"] = template_annotations[PREFERRED]
    if SLICE_REQUIRED in template_annotations and SLICE_SIZE in template_annotations:
        request["podSetSliceRequiredTopology"] = template_annotations[SLICE_REQUIRED]
        request["podSetSliceSize"] = int(template_annotations[SLICE_SIZE])
    return request


def strip(pod: dict[str, Any]) -> dict[str, str]:
    """Take Kueue's topology annotations off a pod about to be created; what was taken."""
    held = pod["metadata"].get("annotations") or {}
    return {k: held.pop(k) for k in ANNOTATIONS if k in held}


def gate(pod: dict[str, Any], workload: str, topology_annotations: dict[str, str]) -> None:
    """A pod admitted by a TAS flavor: gated until Kueue's TopologyUngater gives it its domain."""
    pod["metadata"]["annotations"] = {**(pod["metadata"].get("annotations") or {}), **topology_annotations,
                                      WORKLOAD_ANNOTATION: workload}
    gates = list(pod["spec"].get("schedulingGates") or [])
    if not any(g.get("name") == GATE for g in gates):
        gates.append({"name": GATE})
    pod["spec"]["schedulingGates"] = gates
