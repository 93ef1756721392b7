"""Megatron-LM's and MindSpeed-LLM's log lines -> the engine's progress fields (``ascend_engine.telemetry``).

The iteration line (``training_log`` in megatron/training/training.py, printed by the last rank):

    [2025-06-01 10:00:00] iteration       10/     100 | consumed samples:          80 | elapsed time per
    iteration (ms): 1234.5 | learning rate: 1.000000E-04 | global batch size:     8 | lm loss: 1.082600E+01 |
    loss scale: 1.0 | grad norm: 3.456 | number of skipped iterations:   0 | number of nan iterations:   0 |

Our engine prints the same line plus ``tokens/s`` and ``MFU``; Megatron's has no token rate, so it is computed
from the global batch size, the sequence length (``--seq-length`` of the command, or Megatron's argument dump)
and the time per iteration. Also read: ``validation loss at iteration N | lm loss value: ...`` (last rank) and
``successfully saved checkpoint from iteration N to ...`` (rank 0).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

_ITERATION = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|(.*)$")
_VALIDATION = re.compile(r"validation loss at iteration\s+\d+.*?\|\s*lm loss value:\s*([-+0-9.eEinfa]+)")
_SAVED = re.compile(r"successfully saved checkpoint from iteration\s+(\d+)\b")
_ARGS_SEQ_LENGTH = re.compile(r"^\s*seq_length\s+\.+\s+(\d+)\s*$")  # Megatron's `arguments` dump (rank 0)


def _number(text: str) -> float | None:
    try:
        return float(text.strip().rstrip("%"))
    except ValueError:
        return None


def _fields(rest: str) -> dict[str, str]:
    out = {}
    for part in rest.split("|"):
        key, sep, value = part.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def seq_length_from_argv(argv: list[str]) -> int | None:
    """``--seq-length N`` / ``--seq-length=N`` among a command's arguments (also inside a ``bash -c`` string)."""
    words = [w for a in argv for w in a.split()]
    for i, word in enumerate(words):
        if word.startswith("--seq-length="):
            return int(word.split("=", 1)[1]) if word.split("=", 1)[1].isdigit() else None
        if word == "--seq-length" and i + 1 < len(words) and words[i + 1].isdigit():
            return int(words[i + 1])
    return None


@dataclass
class MegatronLogReader:
    """Feed it lines; ``figures`` holds the latest progress fields (names of ``telemetry.METRIC_NAMES``)."""

    seq_length: int | None = None
    figures: dict[str, float] = field(default_factory=dict)

    def feed(self, line: str) -> bool:
        """Read one line; True when it changed the figures."""
        if m := _ITERATION.search(line):
            return self._iteration(int(m.group(1)), int(m.group(2)), _fields(m.group(3)))
        if m := _VALIDATION.search(line):
            if (value := _number(m.group(1))) is not None:
                self.figures["validationLoss"] = value
                return True
        if m := _SAVED.search(line):
            self.figures["lastCheckpointIteration"] = int(m.group(1))
            return True
        if self.seq_length is None and (m := _ARGS_SEQ_LENGTH.match(line)):
            self.seq_length = int(m.group(1))
        return False

    def _iteration(self, iteration: int, total: int, f: dict[str, str]) -> bool:
        new: dict[str, float] = {"iteration": iteration, "trainIters": total,
                                 "percent": 100.0 * iteration / total if total else None}
        ms = _number(f.get("elapsed time per iteration (ms)", ""))
        batch = _number(f.get("global batch size", ""))
        for key, name in (("lm loss", "loss"), ("learning rate", "learningRate")):
            if (value := _number(f.get(key, ""))) is not None:
                new[name] = value
        if (value := _number(f.get("load_balancing_loss", ""))) is not None:
            new["loadBalancingLoss"] = value
        if (tps := _number(f.get("tokens/s", ""))) is not None:  # our engine's line
            new["tokensPerSecond"] = tps
        elif ms and batch and self.seq_length:
            new["tokensPerSecond"] = batch * self.seq_length / (ms / 1000.0)
        if (mfu := _number(f.get("MFU", ""))) is not None:
            new["mfu"] = mfu / 100.0
        if ms and total >= iteration:
            new["etaSeconds"] = (total - iteration) * ms / 1000.0
        self.figures.update({k: v for k, v in new.items() if v is not None})
        return True
