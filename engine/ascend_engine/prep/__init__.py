"""``ascend-engine preprocess``: raw records -> Megatron indexed datasets (see README.md here)."""
