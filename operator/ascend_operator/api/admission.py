"""Admission rules that concern names and the pod's environment, written once for both places that check them:
the API server (CEL rules in the generated CRDs, so ``kubectl apply`` fails before anything exists) and the
operator (the same checks in Python, when it parses a spec).

* Names: an AscendTrainJob's name becomes its headless Service's name (a DNS-1035 label) and, with ``-<index>``,
  each pod's hostname (a DNS-1123 label, at most 63 characters); a DatasetPrep's or CheckpointConvert's name is
  a label value on its pod (at most 63 characters). The API server already requires a DNS-1123 subdomain of at
  most 253 characters for every custom object; these rules add what the children need and say why.
* Environment: torchrun's contract (``MASTER_ADDR`` ... ``WORLD_SIZE``, ``RANK`` and every ``PET_*`` twin) is
  the operator's to set; a user value would silently break the rendezvous, so it is rejected with its name.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESERVED_ENV = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "NNODES", "NPROC_PER_NODE", "WORLD_SIZE", "RANK")
RESERVED_ENV_PREFIX = "PET_"
_RESERVED_CEL = "[" + ", ".join(f"'{n}'" for n in RESERVED_ENV) + "]"
_IS_RESERVED = f"(e.name in {_RESERVED_CEL} || e.name.startsWith('{RESERVED_ENV_PREFIX}'))"
RESERVED_ENV_MESSAGE = ("is set by the operator (the torchrun contract: MASTER_ADDR, MASTER_PORT, NODE_RANK, NNODES, "
                        "NPROC_PER_NODE, WORLD_SIZE, RANK and PET_*); set nnodes, nprocPerNode or masterPort instead")

# kube-apiserver estimates every messageExpression's cost before it accepts the CRD (at most 10^7 units, and 10^8
# for all rules together). A string whose size it cannot bound costs "infinitely" once concatenated: the names
# come from the three-argument map over ``self`` (so each one keeps the bound of ``env[].name``'s maxLength; a
# filter(...).map(...) chain loses it), and integers are put into messages with ``format``, never ``string(int)``
# concatenated.
RESERVED_ENV_RULE = {
    "rule": f"self.all(e, !{_IS_RESERVED})",
    "messageExpression": f"'env ' + self.map(e, {_IS_RESERVED}, e.name)[0] + ' {RESERVED_ENV_MESSAGE}'",
    "reason": "FieldValueForbidden",
}

DNS1035_LABEL = "^[a-z]([-a-z0-9]*[a-z0-9])?$"
MAX_LABEL = 63

# Root-level rules (the API server gives CEL `self.metadata.name` and `self.metadata.generateName` there).
TRAIN_JOB_NAME_RULES = [
    {"rule": f"self.metadata.name.matches('{DNS1035_LABEL}')",
     "message": "must be a DNS-1035 label (lower case letters, digits and '-', starting with a letter and ending "
                "with a letter or digit): it names the job's headless Service and its pods' subdomain",
     "fieldPath": ".metadata.name", "reason": "FieldValueInvalid"},
    {"rule": f"size(self.metadata.name) + 1 + size(string(self.spec.nnodes - 1)) <= {MAX_LABEL}",
     "messageExpression": f"'is too long: pod hostnames <name>-<index> must be at most {MAX_LABEL} characters, so "
                          f"with nnodes %d the name may have at most %d characters'.format([self.spec.nnodes, "
                          f"{MAX_LABEL - 1} - size(string(self.spec.nnodes - 1))])",
     "fieldPath": ".metadata.name", "reason": "FieldValueInvalid"},
]
SINGLE_POD_NAME_RULES = [
    {"rule": f"size(self.metadata.name) <= {MAX_LABEL}",
     "message": f"may be at most {MAX_LABEL} characters: it is the value of the ascendtrain.dev/job-name label on "
                "the job's pod",
     "fieldPath": ".metadata.name", "reason": "FieldValueInvalid"},
]


def reserved_env(names: list[str]) -> str | None:
    """The first reserved variable among ``names``, or None."""
    return next((n for n in names if n in RESERVED_ENV or n.startswith(RESERVED_ENV_PREFIX)), None)


MAX_NAME = 253  # a DNS-1123 subdomain: what the API server already allows for any custom object's name


def name_schema() -> dict[str, Any]:
    """``metadata`` in the CRD: ``name`` (what the root rules' fieldPath refers to) and ``generateName``, both with
    the length the API server holds them to anyway. kube-apiserver's CEL cost estimate takes these bounds only
    when both are declared (unbounded, the 3 MB request limit, ``matches`` on the name was estimated at 2.2M of
    the CRD's 10^8 budget)."""
    return {"type": "object", "properties": {"name": {"type": "string", "maxLength": MAX_NAME},
                                             "generateName": {"type": "string", "maxLength": MAX_NAME}}}


def match_constraints(resource_rules: list[dict[str, Any]]) -> dict[str, Any]:
    """A ValidatingAdmissionPolicy's ``matchConstraints`` with the fields kube-apiserver defaults written out
    (``matchPolicy``, the two selectors, each rule's ``scope``). The struct is atomic for server-side apply: a
    manifest without them differs from the stored, defaulted object as a whole, so `kubectl apply --server-side`
    of our own file conflicted with the field manager that had installed it (the local cluster's, the chart's)."""
    return {"matchPolicy": "Equivalent", "namespaceSelector": {}, "objectSelector": {},
            "resourceRules": [{**rule, "scope": rule.get("scope", "*")} for rule in resource_rules]}


def policy_file(objects: list[dict[str, Any]], header: str, helm_value: str | None = None) -> str:
    """Admission policies as one YAML file under a ``header`` comment; for the chart (``helm_value``), inside
    ``{{- if .Values.<helm_value> }}`` (off where the API server predates ValidatingAdmissionPolicy v1, 1.30)."""
    import yaml

    text = header + yaml.safe_dump_all(objects, sort_keys=False, width=120)
    if helm_value is None:
        return text
    assert "{{" not in text
    return f"{{{{- if .Values.{helm_value} }}}}\n" + text + "{{- end }}\n"


def write_policy_files(argv: list[str] | None, description: str, render: Callable[[bool], str]) -> int:
    """The command line of a policy generator: each FILE written, as a Helm template (``render(True)``) when it
    lies in a chart's templates/."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("files", nargs="+", metavar="FILE",
                        help="where to write them (a Helm template when it lies in a chart's templates/)")
    for name in parser.parse_args(argv).files:
        path = Path(name)
        path.write_text(render(path.parent.name == "templates"))
        print(f"wrote {path}")
    return 0
