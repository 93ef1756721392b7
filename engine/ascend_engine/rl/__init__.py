"""Reinforcement learning from verifiable rewards (GRPO): rule rewards, group advantages, the policy loss.

Pure functions, no Megatron: the GRPO stage (rollouts by ``generate.batched``, the frozen reference, the update)
plugs them into the shared train loop.
"""
