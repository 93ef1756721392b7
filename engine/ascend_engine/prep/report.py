"""What a preprocessing run tells its user: bad records by file and line, and the JSON manifest.

The manifest (``<prefix>_manifest.json``) is written last and atomically: its presence means every output
it lists is complete, and its sha256 sums let anyone check that.
"""
from __future__ import annotations

import json
import os


class ErrorLog:
    """Every bad record counted, the first ``limit`` kept with their place."""

    def __init__(self, limit: int):
        self.limit, self.count, self.listed = limit, 0, []

    def add(self, where: str, message: str) -> None:
        self.count += 1
        if len(self.listed) < self.limit:
            self.listed.append({"where": where, "message": message})

    def lines(self) -> list[str]:
        out = [f"  {e['where']}: {e['message']}" for e in self.listed]
        if self.count > len(self.listed):
            out.append(f"  ... and {self.count - len(self.listed)} more")
        return out

    def as_dict(self) -> dict:
        return {"count": self.count, "listed": self.listed}


def manifest_path(output_prefix: str) -> str:
    return f"{output_prefix}_manifest.json"


def write_json_atomic(path: str, data: dict) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
