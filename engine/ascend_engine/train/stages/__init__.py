"""Training stages: what the loss is and which extra models exist, on the one shared loop.

A stage supplies the forward-and-loss function of a micro-batch, may prepare each step's micro-batches before
the pipeline schedule runs (the DPO reference pass), and names the metrics its loss function reports. The loop,
parallel set-up, optimizer, checkpointing, resume and metrics endpoint stay the loop's.
"""
from __future__ import annotations

from ...config.preference import PAIRWISE_STAGES
from ...config.train import TrainConfig
from .base import Stage


def make_stage(cfg: TrainConfig) -> Stage:
    if cfg.stage == "orm":
        from .reward import RewardModelStage

        return RewardModelStage(cfg)
    if cfg.stage == "prm":
        from .process_reward import ProcessRewardStage

        return ProcessRewardStage(cfg)
    if cfg.stage in PAIRWISE_STAGES:
        from .preference import PreferenceStage

        return PreferenceStage(cfg)
    if cfg.stage == "grpo":
        from .grpo import GrpoStage

        return GrpoStage(cfg)
    from .language_model import LanguageModelStage

    return LanguageModelStage(cfg)
