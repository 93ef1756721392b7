"""Tiny fabricated copies of the hub datasets lm-eval's ``mmlu``, ``hellaswag`` and ``gsm8k`` read, in the layout
``datasets.load_dataset`` reads as a local dataset folder (what ``huggingface-cli download --repo-type dataset
<name> --local-dir <dir>/<name>`` gives for these repositories: a README.md whose YAML ``configs:`` map each config
name to its data files per split), under their hub names: ``<dir>/cais/mmlu``, ``<dir>/Rowan/hellaswag``,
``<dir>/openai/gsm8k`` (the names read from the installed task YAMLs). Random words, the fields and splits the real
datasets have; for ``evaluate --datasets-dir <dir>``."""
from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = ("the quick brown fox jumps over a lazy dog while seven small cats watch from an old red barn near "
         "green hills and the river runs past tall trees under blue sky").split()


def _lm_eval_tasks() -> Path:
    import lm_eval.tasks

    return Path(lm_eval.tasks.__file__).parent


def _field(path: Path, key: str) -> str | None:
    """A top-level scalar of a task YAML, read as text (lm-eval's YAML has ``!function`` tags)."""
    for line in path.read_text().splitlines():
        if line.strip('"').startswith(f"{key}") and ":" in line:
            name, _, value = line.partition(":")
            if name.strip().strip('"') == key:
                return value.strip().strip('"') or None
    return None


def mmlu_subjects() -> tuple[str, list[str]]:
    """lm-eval's MMLU group: its dataset (the template's ``dataset_path``) and the subjects (``dataset_name``) of
    its subtasks."""
    folder = _lm_eval_tasks() / "mmlu" / "default"
    subjects = sorted(_field(p, "dataset_name") for p in folder.glob("mmlu_*.yaml"))
    return _field(folder / "_default_template_yaml", "dataset_path"), subjects


def _write(root: Path, name: str, configs: dict[str | None, dict[str, list[dict]]]) -> Path:
    folder = root / name
    lines = ["---", "configs:"]
    for config, splits in configs.items():
        config = config or "default"
        lines += [f"- config_name: {config}", "  data_files:"]
        for split, rows in splits.items():
            path = folder / config / f"{split}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
            lines += [f"  - split: {split}", f"    path: {config}/{split}.jsonl"]
    (folder / "README.md").write_text("\n".join(lines + ["---", f"# {name} (tiny, fabricated for tests)", ""]))
    return folder


def write_lm_eval_datasets(root: Path, seed: int = 0, questions: int = 1) -> dict[str, Path]:
    """Write the three datasets under ``root``; ``questions`` test questions per MMLU subject (2 hellaswag
    validation and 2 gsm8k test questions per 1). Returns each hub name's folder."""
    rng = random.Random(seed)

    def words(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    def mmlu_question(subject: str) -> dict:
        return {"question": words(rng.randint(4, 8)) + "?", "subject": subject,
                "choices": [words(rng.randint(1, 3)) for _ in range(4)], "answer": rng.randrange(4)}

    mmlu, subjects = mmlu_subjects()
    written = {mmlu: _write(root, mmlu, {
        s: {"test": [mmlu_question(s) for _ in range(questions)], "validation": [mmlu_question(s)],
            "dev": [mmlu_question(s) for _ in range(2)]} for s in subjects})}

    def hellaswag(i: int, split: str) -> dict:
        endings = [words(rng.randint(2, 5)) for _ in range(4)]
        ctx_a, ctx_b = words(rng.randint(4, 7)), words(rng.randint(1, 3))
        return {"ind": i, "activity_label": words(2).capitalize(), "ctx_a": ctx_a, "ctx_b": ctx_b,
                "ctx": f"{ctx_a} {ctx_b}", "endings": endings, "source_id": f"tiny~{i}", "split": split,
                "split_type": "indomain", "label": str(rng.randrange(4))}

    hs = _field(_lm_eval_tasks() / "hellaswag" / "hellaswag.yaml", "dataset_path")
    written[hs] = _write(root, hs, {None: {"train": [hellaswag(i, "train") for i in range(3)],
                                           "validation": [hellaswag(10 + i, "val") for i in range(2 * questions)],
                                           "test": [{**hellaswag(20, "test"), "label": ""}]}})

    def gsm8k() -> dict:
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        return {"question": f"{words(rng.randint(3, 6))} {a} and {b}?",
                "answer": f"{words(3)} {a} + {b} = <<{a}+{b}={a + b}>>{a + b}\n#### {a + b}"}

    gsm = _field(_lm_eval_tasks() / "gsm8k" / "gsm8k.yaml", "dataset_path")
    name = _field(_lm_eval_tasks() / "gsm8k" / "gsm8k.yaml", "dataset_name")
    written[gsm] = _write(root, gsm, {name: {"train": [gsm8k() for _ in range(6)],
                                             "test": [gsm8k() for _ in range(2 * questions)]}})
    return written


if __name__ == "__main__":
    import sys

    for hub_name, folder in write_lm_eval_datasets(Path(sys.argv[1])).items():
        print(hub_name, folder)
