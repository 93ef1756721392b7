"""MoE router losses for the log line, TensorBoard and the status: megatron-core's aux-loss tracker, reduced.

The router records each MoE layer's load-balancing loss (and z-loss) per micro-batch, divided by its
coefficient, in megatron-core's tracker; ``track_moe_metrics`` reduces it over pipeline and data-parallel ranks
(collective: every rank calls it each step) and averages over MoE layers and micro-batches.
"""
from __future__ import annotations

from ..config.train import ModelConfig

# Tracker name per load-balancing type (megatron-core's router names them so).
_BALANCING = {"aux_loss": "load_balancing_loss", "seq_aux_loss": "seq_load_balancing_loss"}


def tracked_names(model: ModelConfig) -> list[str]:
    names = []
    if model.numExperts is not None and model.moeAuxLossCoeff > 0 and model.moeRouterLoadBalancingType in _BALANCING:
        names.append(_BALANCING[model.moeRouterLoadBalancingType])
    if model.numExperts is not None and model.moeZLossCoeff:
        names.append("z_loss")
    return names


def router_losses(model: ModelConfig, num_micro_batches: int) -> dict[str, float]:
    """This step's router losses (before their coefficients), mean over MoE layers; clears the tracker."""
    names = tracked_names(model)
    if not names:
        return {}
    from megatron.core.transformer.moe.moe_utils import track_moe_metrics

    totals: dict = {}
    track_moe_metrics(loss_scale=1.0 / num_micro_batches, iteration=0, total_loss_dict=totals,
                      force_initialize=True, track_names=names, num_layers=model.numLayers,
                      moe_layer_freq=model.moeLayerFreq)
    return {name: float(value) for name, value in totals.items()}
