"""``ascend-engine train``: pretraining and fine-tuning on Megatron-core."""
