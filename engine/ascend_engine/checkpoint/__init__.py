"""Megatron-layout checkpoints: path helpers (layout), Megatron's args namespace, atomic save and load."""
