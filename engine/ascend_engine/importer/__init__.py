"""``ascend-engine import-script``: a MindSpeed-LLM launch script (``tune_*.sh``, ``pretrain_*.sh``) -> an
AscendTrainJob manifest, naming every flag it could not map."""
