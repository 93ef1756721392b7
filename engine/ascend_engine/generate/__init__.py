"""``ascend-engine generate``: a smoke test of a trained checkpoint (greedy or top-p sampling)."""
