"""kube-apiserver's rules for a Pod's ``affinity`` (``validateAffinity`` in pkg/apis/core/validation) and the label
selectors inside it (apimachinery's ``ValidateLabelSelector``), in its words. A job's ``affinity`` reaches its pods
unchanged, so what the real server refuses there must be refused here too, not scheduled.

Differs from a real API server: ``matchLabelKeys``/``mismatchLabelKeys`` are checked for their key syntax only.
"""
from __future__ import annotations

from typing import Any

from .label_rules import label_errors, label_value_errors, qualified_name_errors, quoted as _q
from .object_names import format_errors

Errors = list[tuple[str, str]]


def label_selector_errors(at: str, selector: dict[str, Any] | None) -> Errors:
    """``ValidateLabelSelector``: matchLabels as labels, each requirement's operator, key and values."""
    if not selector:
        return []
    errors = label_errors(f"{at}.matchLabels", selector.get("matchLabels"))
    for i, requirement in enumerate(selector.get("matchExpressions") or []):
        here = f"{at}.matchExpressions[{i}]"
        operator, values = requirement.get("operator") or "", requirement.get("values") or []
        if operator in ("In", "NotIn"):
            if not values:
                errors.append((f"{here}.values", f"{here}.values: Required value: must be specified when `operator` "
                                                 "is 'In' or 'NotIn'"))
        elif operator in ("Exists", "DoesNotExist"):
            if values:
                errors.append((f"{here}.values", f"{here}.values: Forbidden: may not be specified when `operator` is "
                                                 "'Exists' or 'DoesNotExist'"))
        else:
            errors.append((f"{here}.operator", f"{here}.operator: Invalid value: {_q(operator)}: not a valid selector "
                                               "operator"))
        errors += qualified_name_errors(f"{here}.key", requirement.get("key") or "")
        for v, value in enumerate(values):
            errors += label_value_errors(f"{here}.values[{v}]", value)
    return errors


def _node_requirement_errors(here: str, requirement: dict[str, Any]) -> Errors:
    """``ValidateNodeSelectorRequirement`` (matchExpressions)."""
    operator, values = requirement.get("operator") or "", requirement.get("values") or []
    errors: Errors = []
    if operator in ("In", "NotIn") and not values:
        errors.append((f"{here}.values", f"{here}.values: Required value: must be specified when `operator` is 'In' "
                                         "or 'NotIn'"))
    elif operator in ("Exists", "DoesNotExist") and values:
        errors.append((f"{here}.values", f"{here}.values: Forbidden: may not be specified when `operator` is "
                                         "'Exists' or 'DoesNotExist'"))
    elif operator in ("Gt", "Lt") and len(values) != 1:
        errors.append((f"{here}.values", f"{here}.values: Required value: must be specified single value when "
                                         "`operator` is 'Lt' or 'Gt'"))
    elif operator not in ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"):
        errors.append((f"{here}.operator", f"{here}.operator: Invalid value: {_q(operator)}: not a valid selector "
                                           "operator"))
    return errors + qualified_name_errors(f"{here}.key", requirement.get("key") or "")


def _node_field_requirement_errors(here: str, requirement: dict[str, Any]) -> Errors:
    """``ValidateNodeFieldSelectorRequirement`` (matchFields: only ``metadata.name``, one node name)."""
    operator, values = requirement.get("operator") or "", requirement.get("values") or []
    errors: Errors = []
    if operator in ("In", "NotIn"):
        if len(values) != 1:
            errors.append((f"{here}.values", f"{here}.values: Required value: must be only one value when `operator` "
                                             "is 'In' or 'NotIn' for node field selector"))
    else:
        errors.append((f"{here}.operator", f"{here}.operator: Invalid value: {_q(operator)}: not a valid selector "
                                           "operator"))
    key = requirement.get("key") or ""
    if key != "metadata.name":
        errors.append((f"{here}.key", f"{here}.key: Invalid value: {_q(key)}: not a valid field selector key"))
    else:
        for v, value in enumerate(values):
            errors += [(f"{here}.values[{v}]", f"{here}.values[{v}]: Invalid value: {_q(value)}: {m}")
                       for m in format_errors(str(value), "dns1123-subdomain")]
    return errors


def _node_term_errors(at: str, term: dict[str, Any]) -> Errors:
    errors: Errors = []
    for i, requirement in enumerate(term.get("matchExpressions") or []):
        errors += _node_requirement_errors(f"{at}.matchExpressions[{i}]", requirement)
    for i, requirement in enumerate(term.get("matchFields") or []):
        errors += _node_field_requirement_errors(f"{at}.matchFields[{i}]", requirement)
    return errors


def _weight_errors(at: str, weight: Any) -> Errors:
    if isinstance(weight, int) and not 1 <= weight <= 100:
        return [(f"{at}.weight", f"{at}.weight: Invalid value: {weight}: must be in the range 1-100")]
    return []


def _pod_affinity_term_errors(at: str, term: dict[str, Any]) -> Errors:
    errors = label_selector_errors(f"{at}.labelSelector", term.get("labelSelector"))
    errors += label_selector_errors(f"{at}.namespaceSelector", term.get("namespaceSelector"))
    for name in term.get("namespaces") or []:
        errors += [(f"{at}.namespace", f"{at}.namespace: Invalid value: {_q(name)}: {m}")
                   for m in format_errors(str(name), "dns1123-label")]
    for key in ("matchLabelKeys", "mismatchLabelKeys"):
        for k, label in enumerate(term.get(key) or []):
            errors += qualified_name_errors(f"{at}.{key}[{k}]", str(label))
    topology = term.get("topologyKey") or ""
    if not topology:
        errors.append((f"{at}.topologyKey", f"{at}.topologyKey: Required value: can not be empty"))
    return errors + qualified_name_errors(f"{at}.topologyKey", topology)


def affinity_errors(spec: dict[str, Any]) -> Errors:
    """Node affinity (terms, requirements, weights) and pod (anti-)affinity (terms, selectors, topology keys)."""
    affinity = spec.get("affinity") or {}
    errors: Errors = []
    node = affinity.get("nodeAffinity") or {}
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution")
    at = "spec.affinity.nodeAffinity"
    if required is not None:
        here = f"{at}.requiredDuringSchedulingIgnoredDuringExecution"
        terms = required.get("nodeSelectorTerms") or []
        if not terms:
            errors.append((f"{here}.nodeSelectorTerms", f"{here}.nodeSelectorTerms: Required value: must have at "
                                                        "least one node selector term"))
        for t, term in enumerate(terms):
            errors += _node_term_errors(f"{here}.nodeSelectorTerms[{t}]", term)
    for t, preferred in enumerate(node.get("preferredDuringSchedulingIgnoredDuringExecution") or []):
        here = f"{at}.preferredDuringSchedulingIgnoredDuringExecution[{t}]"
        errors += _weight_errors(here, preferred.get("weight"))
        errors += _node_term_errors(f"{here}.preference", preferred.get("preference") or {})
    for kind in ("podAffinity", "podAntiAffinity"):
        pod = affinity.get(kind) or {}
        at = f"spec.affinity.{kind}"
        for t, term in enumerate(pod.get("requiredDuringSchedulingIgnoredDuringExecution") or []):
            errors += _pod_affinity_term_errors(f"{at}.requiredDuringSchedulingIgnoredDuringExecution[{t}]", term)
        for t, weighted in enumerate(pod.get("preferredDuringSchedulingIgnoredDuringExecution") or []):
            here = f"{at}.preferredDuringSchedulingIgnoredDuringExecution[{t}]"
            errors += _weight_errors(here, weighted.get("weight"))
            errors += _pod_affinity_term_errors(f"{here}.podAffinityTerm", weighted.get("podAffinityTerm") or {})
    return errors
