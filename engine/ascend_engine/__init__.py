"""ascend-engine: one engine for data preparation, checkpoint conversion and training on Megatron-core."""
__version__ = "0.1.0"
