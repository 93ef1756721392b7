"""The ConfigMap's YAML comes from a faster path (render/yaml_text.py) than ``yaml.safe_dump``; a user reading
``kubectl get cm <job>-config -o yaml`` must see the very text safe_dump writes, byte for byte."""
from __future__ import annotations

from pathlib import Path

import yaml

from ascend_operator.api.train_job import AscendTrainJobSpec
from ascend_operator.render.train_job import engine_config_map, evaluation_config
from ascend_operator.render.yaml_text import dump

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def reference(data) -> str:
    return yaml.safe_dump(data, sort_keys=False)


def test_every_example_jobs_config_is_the_text_safe_dump_writes():
    checked = 0
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "AscendTrainJob":
                continue
            spec = AscendTrainJobSpec.model_validate(doc["spec"])
            data = engine_config_map(doc["metadata"]["name"], spec)["data"]
            if spec.train:
                config = spec.train.to_yaml_dict()
                config.setdefault("checkpoint", {}).setdefault("load", config["checkpoint"].get("save"))
                assert data["config.yaml"] == reference(yaml.safe_load(data["config.yaml"])), path.name
                assert dump(config) == reference(config), path.name
                checked += 1
            if spec.evaluation:
                assert dump(evaluation_config(spec)) == reference(evaluation_config(spec)), path.name
    assert checked >= 5


def test_scalars_quoting_floats_nesting_and_shared_objects_match():
    shared = {"k": [1, 2]}
    data = {
        "plain": "abc", "yes": "yes", "null-word": "null", "number-like": "1e3", "octal-like": "0o17",
        "colon": "a: b", "hash": "a #b", "lead space": " x", "trail": "x ", "empty": "", "multi": "l1\nl2\n",
        "unicode": "café ✓", "tab": "a\tb", "quote": "'q'", "dq": '"q"', "long": "word " * 40, "star": "*x",
        "bools": [True, False], "ints": [0, -7, 10**20], "floats": [0.1, 1e-8, 1e20, -0.0, float("inf"),
                                                                   float("-inf"), float("nan"), 3.0],
        "none": None, "empty-map": {}, "empty-list": [], "nested": [{"a": [[], {}], "b": {"c": None}}],
        "first": shared, "again": shared, "1": "one-key",
    }
    assert dump(data) == reference(data)
    assert "&id001" in dump(data)  # the same object twice: an anchor and an alias, as safe_dump writes it


def test_other_types_take_the_ordinary_path():
    data = {"tuple": (1, 2), "set": {3}, "bytes": b"x"}
    assert dump(data) == reference(data)
