"""The training data of a run: the blended datasets of ``dataPath`` (or synthetic tokens) and their batching."""
from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
import torch

from ..config.train import TrainConfig
from .batch import instruction_batch, pretrain_batch
from .blend import Blend
from .instruction import InstructionDataset
from .pairwise import PairwiseDataset, pairwise_batch
from .pretrain import PretrainDataset
from .sources import parse_data_path


class TrainData:
    """``sample(i)`` is sample ``i`` of the whole run (any rank can read any sample); ``batch(rows)`` collates."""

    def __init__(self, datasets: list, weights: list[float], batch: Callable[[list], dict[str, torch.Tensor]]):
        self.datasets, self.blend, self.batch = datasets, Blend(weights), batch

    def sample(self, index: int) -> dict[str, np.ndarray]:
        d, k = self.blend[index]
        return self.datasets[d][k]


class SyntheticData:
    """The learnable repeating pattern of ``train/synthetic.py``, when no dataPath is given."""

    def __init__(self, cfg: TrainConfig):
        from ..train.synthetic import synthetic_sample

        t = cfg.training
        self.sample = partial(synthetic_sample, seq_length=t.seqLength, vocab_size=cfg.model.vocabSize, seed=t.seed)

    @staticmethod
    def batch(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        return {key: torch.stack([r[key] for r in rows]) for key in rows[0]}


def build_train_data(cfg: TrainConfig, part: int = 0) -> TrainData | SyntheticData:
    """The training part of the data (``part`` 1: the validation part of ``split``, same blend and batching)."""
    d, t = cfg.data, cfg.training
    if cfg.pairwise_data and (d.mockData or not d.dataPath):
        from .sources import DataError

        raise DataError(f"stage {cfg.stage}: needs preference pairs in data.dataPath (no synthetic pairwise data)")
    if cfg.stage == "grpo":
        if not d.dataPath:
            from .sources import DataError

            raise DataError("stage grpo: needs R1 prompt data in data.dataPath (R1AlpacaStyleInstructionHandler "
                            "output: <prefix>_packed_{input_ids,attention_mask,labels}_document)")
        from .prompts import PromptDataset, prompt_batch

        sources = parse_data_path(d.dataPath, instruction=True)
        return TrainData([PromptDataset(s.files, t.seed, d.split, s.prefix) for s in sources],
                         [s.weight for s in sources], prompt_batch)
    if cfg.stage == "prm" and (d.mockData or not d.dataPath):
        from .sources import DataError

        raise DataError("stage prm: needs process reward data in data.dataPath (AlpacaStyleProcessRewardHandler "
                        "output: <prefix>_packed_{input_ids,attention_mask,labels}_document)")
    if d.mockData or not d.dataPath:
        return SyntheticData(cfg)
    sources = parse_data_path(d.dataPath, d.isInstructionDataset or cfg.stage == "prm", cfg.pairwise_data)
    if cfg.pairwise_data:
        datasets = [PairwiseDataset(s.files, t.seed, d.split, s.prefix, part) for s in sources]
        batch = partial(pairwise_batch, seq_length=t.seqLength, variable=d.variableSeqLengths,
                        pad_to_multiple_of=d.padToMultipleOf)
    elif cfg.stage == "prm":
        from .process_reward import process_reward_batch

        datasets = [InstructionDataset(s.files, t.seed, d.split, s.prefix, part) for s in sources]
        batch = partial(process_reward_batch, seq_length=t.seqLength, variable=d.variableSeqLengths,
                        pad_to_multiple_of=d.padToMultipleOf)
    elif d.isInstructionDataset:
        datasets = [InstructionDataset(s.files, t.seed, d.split, s.prefix, part) for s in sources]
        batch = partial(instruction_batch, seq_length=t.seqLength, variable=d.variableSeqLengths,
                        pad_to_multiple_of=d.padToMultipleOf, neat_pack=d.neatPack)
    else:
        datasets = [PretrainDataset(s.files["text"], t.seqLength, t.seed, d.split, s.prefix, part)
                    for s in sources]
        batch = pretrain_batch
    return TrainData(datasets, [s.weight for s in sources], batch)
