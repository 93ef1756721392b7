"""Checkpoint conversion: HF <-> Megatron-core, TP/PP resharding, LoRA merge (``ascend-engine convert``)."""
