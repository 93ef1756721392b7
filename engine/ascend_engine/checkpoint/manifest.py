"""``iter_XXXXXXX/manifest.json``: the size and SHA-256 of every file of a checkpoint, written before the
checkpoint becomes ``latest``. A reader that finds a file shorter, longer or different from its entry knows the
checkpoint was damaged after it was saved (a truncated copy, a full disk on a later rewrite, bit rot) and can
fall back to an older one instead of loading garbage.

Checkpoints without a manifest (Megatron-LM's, converted ones, this engine's before it wrote manifests) load as
before, unverified. Megatron-LM's loaders ignore the extra file.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

MANIFEST_FILE = "manifest.json"
MANIFEST_VERSION = 1


def write_manifest(folder: Path, iteration: int, entries: dict[str, dict]) -> None:
    """``entries``: path relative to ``folder`` -> {"bytes", "sha256"}."""
    path = folder / MANIFEST_FILE
    with open(path, "w") as f:
        json.dump({"version": MANIFEST_VERSION, "iteration": iteration, "files": dict(sorted(entries.items()))},
                  f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def read_manifest(folder: Path) -> dict[str, dict] | None:
    """The files' entries, None when the checkpoint has no manifest. An unreadable manifest raises
    ``CorruptCheckpoint`` (it was written whole before the rename, so damage means the folder is damaged)."""
    path = folder / MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        files = json.loads(path.read_text())["files"]
        if not isinstance(files, dict):
            raise ValueError("'files' is not a mapping")
        return files
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise CorruptCheckpoint(path, f"unreadable manifest ({e})") from None


class CorruptCheckpoint(Exception):
    """A checkpoint file that does not match its manifest entry (or cannot be read)."""

    def __init__(self, path: Path, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = path, problem


def read_verified(folder: Path, relative: str, entries: dict[str, dict] | None) -> bytes:
    """The bytes of ``folder/relative``, checked against its manifest entry when there is a manifest."""
    path = folder / relative
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CorruptCheckpoint(path, "missing") from None
    except OSError as e:
        raise CorruptCheckpoint(path, f"unreadable ({e.strerror or e})") from None
    if entries is None:
        return data
    entry = entries.get(relative)
    if entry is None:
        raise CorruptCheckpoint(path, f"not listed in {MANIFEST_FILE}")
    if len(data) != entry["bytes"]:
        what = "truncated" if len(data) < entry["bytes"] else "longer than saved"
        raise CorruptCheckpoint(path, f"{what}: {len(data)} bytes, the manifest says {entry['bytes']}")
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["sha256"]:
        raise CorruptCheckpoint(path, f"checksum mismatch: sha256 {digest[:16]}..., the manifest says "
                                      f"{entry['sha256'][:16]}...")
    return data
