"""Which files a ``dataPath`` entry names, its blending weights, and the ``--split`` document ranges.

``dataPath`` holds bare prefixes, as Megatron-LM and MindSpeed-LLM take them: ``out/wiki`` finds
``out/wiki_text_document.{bin,idx}`` (pretraining) or ``out/wiki_packed_input_ids_document.{bin,idx}`` and its
two siblings (instruction data); a prefix that already names one dataset (``out/wiki_text_document``) is used
as is. Weights come first when given: ``["0.7", "a", "0.3", "b"]``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

INSTRUCTION_KEYS = ("input_ids", "attention_mask", "labels")
PAIRWISE_KEYS = tuple(f"{side}_{k}" for side in ("chosen", "rejected") for k in INSTRUCTION_KEYS)


class DataError(ValueError):
    """Training data that cannot be used; the message names the config field and the files."""


@dataclass(frozen=True)
class Source:
    weight: float
    prefix: str  # as given by the user
    kind: str  # "pretrain" | "instruction" | "pairwise"
    files: dict[str, str]  # key ("text", an instruction or pairwise key) -> indexed-dataset prefix (no .bin/.idx)


def _exists(prefix: str) -> bool:
    return Path(prefix + ".bin").is_file() and Path(prefix + ".idx").is_file()


def resolve_pairwise(prefix: str, weight: float) -> Source:
    """``<prefix>_packed_{chosen,rejected}_{input_ids,attention_mask,labels}_document``, MindSpeed-LLM's names."""
    base = prefix.removesuffix("_packed_chosen_input_ids_document")
    files = {k: f"{base}_packed_{k}_document" for k in PAIRWISE_KEYS}
    missing = [f + ".{bin,idx}" for f in files.values() if not _exists(f)]
    if missing:
        raise DataError(f"data.dataPath: {prefix!r} is not a pairwise dataset: missing {', '.join(missing)} "
                        "(prepare it with AlpacaStylePairwiseHandler or SharegptStylePairwiseHandler)")
    return Source(weight, prefix, "pairwise", files)


def resolve(prefix: str, weight: float, instruction: bool, pairwise: bool = False) -> Source:
    """The dataset files behind one ``dataPath`` prefix; an error lists what was looked for."""
    if pairwise:
        return resolve_pairwise(prefix, weight)
    if instruction:
        base = prefix.removesuffix("_packed_input_ids_document")
        files = {k: f"{base}_packed_{k}_document" for k in INSTRUCTION_KEYS}
        missing = [f + ".{bin,idx}" for f in files.values() if not _exists(f)]
        if missing:
            raise DataError(f"data.dataPath: {prefix!r} is not an instruction dataset: missing {', '.join(missing)} "
                            "(prepare it with a DatasetPrep / `ascend-engine preprocess` instruction handler)")
        return Source(weight, prefix, "instruction", files)
    for candidate in (f"{prefix}_text_document", prefix):
        if _exists(candidate):
            return Source(weight, prefix, "pretrain", {"text": candidate})
    if _exists(f"{prefix}_packed_input_ids_document"):
        raise DataError(f"data.dataPath: {prefix!r} is instruction data; set data.isInstructionDataset "
                        "(--is-instruction-dataset)")
    raise DataError(f"data.dataPath: no dataset for prefix {prefix!r}: neither {prefix}_text_document.{{bin,idx}} "
                    f"nor {prefix}.{{bin,idx}} exists")


def parse_data_path(entries: list[str], instruction: bool, pairwise: bool = False) -> list[Source]:
    """``["a"]``, ``["a", "b"]`` (equal weights) or ``["0.7", "a", "0.3", "b"]``; weights are normalised."""
    if not entries:
        raise DataError("data.dataPath is empty")

    def number(text: str) -> float | None:
        try:
            return float(text)
        except ValueError:
            return None

    if number(entries[0]) is None:
        pairs = [(1.0, e) for e in entries]
    else:
        if len(entries) % 2:
            raise DataError(f"data.dataPath: weighted form needs weight/prefix pairs, got {len(entries)} entries")
        pairs = []
        for i in range(0, len(entries), 2):
            w = number(entries[i])
            if w is None or w < 0:
                raise DataError(f"data.dataPath[{i}]: expected a non-negative weight, got {entries[i]!r}")
            pairs.append((w, entries[i + 1]))
    total = sum(w for w, _ in pairs)
    if total <= 0:
        raise DataError("data.dataPath: the weights sum to zero")
    return [resolve(p, w / total, instruction, pairwise) for w, p in pairs]


def parse_split(split: str) -> list[float]:
    """``"969,30,1"`` or ``"98/2/0"`` -> three fractions (train, valid, test), as Megatron reads ``--split``."""
    parts = [p for p in split.replace("/", ",").split(",") if p.strip()]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise DataError(f"data.split: expected up to three numbers like '969,30,1', got {split!r}") from None
    if not values or len(values) > 3 or any(v < 0 for v in values) or sum(values) <= 0:
        raise DataError(f"data.split: expected up to three non-negative numbers with a positive sum, got {split!r}")
    values += [0.0] * (3 - len(values))
    return [v / sum(values) for v in values]


def train_range(num_documents: int, split: str) -> range:
    """The documents of the training part: the first ``round(fraction x documents)``, as Megatron splits."""
    fraction = parse_split(split)[0]
    return range(0, int(round(fraction * num_documents)))
