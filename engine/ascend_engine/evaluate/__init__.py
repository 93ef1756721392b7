"""``ascend-engine evaluate``: benchmark accuracy of a checkpoint (MMLU, CEval, CMMLU, BoolQ, HellaSwag, AGIEval,
BBH, GSM8K, HumanEval) from local files in their published formats, at any TP/PP layout."""
