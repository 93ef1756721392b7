"""Would the imported job train what the script trains? The gaps that make the answer no.

A script whose variables could not be resolved still parses, and the defaults would fill the holes: a default
model, synthetic data, one device per pod. That job would run and train something else, so each such gap is a
reason for ``import-script`` to exit non-zero (``--allow-incomplete`` writes the manifest anyway).
"""
from __future__ import annotations

from typing import Any


def gaps(train: dict[str, Any], launcher: dict[str, str], unset_variables: list[str]) -> list[str]:
    """What the imported job lost from the script, one sentence each; empty when it is faithful."""
    found = []
    model = train.get("model") or {}
    missing = [flag for field, flag in (("numLayers", "--num-layers"), ("hiddenSize", "--hidden-size"),
                                        ("numAttentionHeads", "--num-attention-heads")) if field not in model]
    if missing:
        found.append(f"no model shape: {', '.join(missing)} not resolved, so the job would build a default model")
    data = train.get("data") or {}
    if not data.get("dataPath") and not data.get("mockData"):
        found.append("no data: --data-path not resolved, so the job would train on synthetic data")
    for option in ("nproc-per-node", "nnodes"):
        if option in launcher and not launcher[option].strip():
            found.append(f"device count lost: torchrun --{option} is empty (a variable the script does not set); "
                         "give it with --set VAR=VALUE")
    if unset_variables:
        found.append("variables used but not set in the script: " + ", ".join(f"${v}" for v in unset_variables)
                     + " (give them with --set VAR=VALUE)")
    return found
