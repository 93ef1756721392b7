"""The reconcile: one level-triggered pass per job (``reconcile.py``) and the pure decisions it makes."""
