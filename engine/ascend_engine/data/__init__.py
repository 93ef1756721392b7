"""Training data from Megatron indexed datasets as DatasetPrep writes them (pretraining text, instruction data)."""
