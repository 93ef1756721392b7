"""lm-evaluation-harness's task index for ``ascend-engine evaluate --backend lm-eval``: which task definitions a run
reads (lm-eval's own, ``includePath``'s, or only the folders the requested names need) and, with ``datasetsDir``,
their hub datasets from local copies, all checked before the model loads."""
from __future__ import annotations

import os
from pathlib import Path

from .questions import TaskDataError


def offline() -> None:
    """No hub at run time: datasets and models come from local files and caches (set before ``datasets`` is
    imported; an explicit setting in the environment wins)."""
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        os.environ.setdefault(name, "1")


def task_manager(cfg):
    """lm-eval's task index (its own tasks plus ``includePath``), with every requested name known to it."""
    from lm_eval.tasks import TaskManager

    for folder in cfg.includePath or []:
        if not Path(folder).is_dir():
            raise TaskDataError(f"includePath: {folder}: no such directory")
    if cfg.includePath:  # indexing lm-eval's own thousands of tasks takes seconds: only when a name needs them
        manager = TaskManager(include_path=cfg.includePath, include_defaults=False)
        if all(t in manager.all_tasks for t in cfg.lm_eval_tasks):
            return manager
    manager = _own_folders(cfg)
    if manager is not None:
        return manager
    manager = TaskManager(include_path=cfg.includePath)
    unknown = [t for t in cfg.lm_eval_tasks if t not in manager.all_tasks]
    if unknown:
        raise TaskDataError(f"task: {', '.join(unknown)}: not an lm-eval task, group or tag (lm-eval {_version()} "
                            f"knows {len(manager.all_tasks)}; local task YAML folders go in includePath)")
    return manager


def use_local_datasets(manager, cfg):
    """With ``datasetsDir``: every task ``manager`` builds reads its hub dataset from ``<datasetsDir>/<dataset_path>``
    (lm-eval's task definitions unchanged: its task factory's config gets the local folder as ``dataset_path``),
    and every requested task's dataset is checked to be there now, before the model loads."""
    if cfg.datasetsDir is None:
        return manager
    if not Path(cfg.datasetsDir).is_dir():
        raise TaskDataError(f"datasetsDir: {cfg.datasetsDir}: no such directory")
    manager._factory = LocalDatasets(cfg.datasetsDir, meta=manager._factory._meta)
    for name in cfg.lm_eval_tasks:
        _check_datasets(manager, name, {}, set())
    return manager


def _is_hub_name(dataset_path) -> bool:
    """A hub dataset's name (``cais/mmlu``), not a packaged builder (``json``, ``parquet``) or a local folder."""
    from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES

    return isinstance(dataset_path, str) and dataset_path not in _PACKAGED_DATASETS_MODULES \
        and not Path(dataset_path).is_absolute() and not Path(dataset_path).exists()


def local_dataset(folder: str, task, dataset_path) -> str | None:
    """The local copy of hub dataset ``dataset_path`` in ``folder`` (None where the task names no hub dataset);
    a hub dataset that is not there is an error naming the task, the dataset and the folder looked in."""
    if not _is_hub_name(dataset_path):
        return None
    local = Path(folder) / dataset_path
    if not local.is_dir():
        raise TaskDataError(f"{task}: its dataset {dataset_path} is not in datasetsDir: no folder {local} (fill it on "
                            f"a connected machine: huggingface-cli download --repo-type dataset {dataset_path} "
                            f"--local-dir {local})")
    return str(local)


try:
    from lm_eval.tasks._factory import GROUP_FIELD_NAMES, TaskFactory
except ImportError:  # an lm-eval without the task factory (before 0.4.10): datasetsDir is refused at use
    TaskFactory, GROUP_FIELD_NAMES = object, set()


class LocalDatasets(TaskFactory):
    """lm-eval's task factory, with each task config's hub ``dataset_path`` replaced by its local copy."""

    def __init__(self, folder: str, meta=None):
        if TaskFactory is object:
            raise TaskDataError(f"datasetsDir needs lm-eval 0.4.10 or later (this is {_version()})")
        super().__init__(meta=meta)
        self.folder = folder

    def _load_full_config(self, entry, overrides=None):
        cfg = super()._load_full_config(entry, overrides)
        local = local_dataset(self.folder, cfg.get("task", entry.name), cfg.get("dataset_path"))
        if local is not None:
            cfg["dataset_path"] = local
        return cfg


def _check_datasets(manager, name: str, overrides: dict, seen: set) -> None:
    """Walk a task, group or tag's members as lm-eval's factory does (without building them: no data read) and
    resolve each task's dataset, so a missing one fails before the model loads."""
    from lm_eval.tasks._index import Kind

    entry = manager._index.get(name)
    if entry is None or (name, str(overrides)) in seen:
        return
    seen.add((name, str(overrides)))
    if entry.kind == Kind.TAG:
        for member in sorted(entry.tags):
            _check_datasets(manager, member, overrides, seen)
        return
    cfg = manager._factory._load_full_config(entry, overrides if entry.kind != Kind.GROUP else None)
    if entry.kind != Kind.GROUP:
        return
    merged = {**{k: v for k, v in cfg.items() if k not in GROUP_FIELD_NAMES}, **overrides}
    for item in cfg.get("task") if isinstance(cfg.get("task"), list) else []:
        if isinstance(item, str):
            _check_datasets(manager, item, merged, seen)
        elif isinstance(item, dict) and isinstance(item.get("task") or item.get("group"), str):
            member = item.get("task") or item.get("group")
            _check_datasets(manager, member, {**merged, **{k: v for k, v in item.items() if k not in
                                                           ("task", "group")}}, seen)


def _own_folders(cfg):
    """lm-eval's task index over only the folders of its own tasks named like the requested ones
    (``lm_eval/tasks/mmlu``, ``.../hellaswag``, ``.../gsm8k``) and ``includePath``: some 15 s less than its whole
    index on two cores. Used only where it builds what the whole index would: every task, group and tag the
    requested names reach is in it, and no YAML file outside those folders defines one of those tasks or groups
    again or names one of those tags (a tag's members may live anywhere); None otherwise."""
    import re

    import lm_eval.tasks
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._index import Kind

    root = Path(lm_eval.tasks.__file__).parent
    folders = [root / name for name in dict.fromkeys(cfg.lm_eval_tasks)]
    if not all(f.is_dir() and f.parent == root for f in folders):
        return None
    manager = TaskManager(include_path=[*map(str, folders), *(cfg.includePath or [])], include_defaults=False)
    reached: dict[str, object] = {}
    pending = list(cfg.lm_eval_tasks)
    while pending:
        name = pending.pop()
        if name in reached:
            continue
        entry = manager._index.get(name)
        if entry is None:
            return None
        reached[name] = entry.kind
        if entry.kind == Kind.TAG:
            pending += entry.tags
        elif entry.kind == Kind.GROUP:
            members = manager._factory._load_full_config(entry).get("task")
            for item in members if isinstance(members, list) else [members]:
                member = item if isinstance(item, str) else (item or {}).get("task") or (item or {}).get("group")
                if not isinstance(member, str):
                    return None
                pending.append(member)
    defined = [n for n, kind in reached.items() if kind != Kind.TAG]
    tags = [n for n, kind in reached.items() if kind == Kind.TAG]
    word = r"(?<![\w./-])(?:{})(?![\w./-])"
    definition = re.compile(r"^\s*[\"']?(?:task|group)[\"']?\s*:\s*[\"']?" + word.format(
        "|".join(map(re.escape, defined))) + r"[\"']?\s*$", re.M) if defined else None
    mention = re.compile(word.format("|".join(map(re.escape, tags)))) if tags else None
    for path in root.rglob("*.yaml"):
        if any(f in path.parents for f in folders):
            continue
        text = path.read_text(encoding="utf-8", errors="ignore")
        if (definition and definition.search(text)) or (mention and mention.search(text)):
            return None
    return manager


def _version() -> str:
    from importlib.metadata import version

    return version("lm_eval")
