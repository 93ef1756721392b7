"""A training worker for the in-process restart tests: ``ascend-engine train`` itself (the real engine, launcher,
spare and store), with one addition for the test to aim a fault: before each step it writes ``D/at-<rank>``
(its pid and the iteration it is about to train); while ``D/hold`` names this rank and that iteration it waits
there (so a test can kill it at a known step once its pod's warm spare is ready); then, when ``D/raise`` names
this rank and an iteration, it raises once (the file is removed) at its first step from that iteration on once a
checkpoint has been promoted, as a rank whose step failed would. (Checkpoints are written in the background and
promoted at the first step boundary after every rank's files are on disk: on a loaded machine that can be several
steps after the save, and a fault before it finds no checkpoint in host memory.)

    python -m ascend_engine.launcher ... inprocess_worker.py D train --config job.yaml
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main() -> None:
    folder, argv = Path(sys.argv[1]), sys.argv[2:]
    from ascend_engine.train import loop

    original = loop.Trainer.train_step

    def train_step(self):
        rank, upcoming = self.info.rank, self.iteration + 1
        tmp = folder / f".at-{rank}"
        tmp.write_text(json.dumps({"pid": os.getpid(), "iteration": upcoming}))
        tmp.rename(folder / f"at-{rank}")
        hold = folder / "hold"
        while hold.exists() and json.loads(hold.read_text()) == [rank, upcoming]:
            time.sleep(0.05)
        plan = folder / "raise"
        if plan.exists() and self.last_checkpoint is not None and (
                (aim := json.loads(plan.read_text()))[0] == rank and upcoming >= aim[1]):
            plan.unlink()
            raise RuntimeError(f"injected fault at iteration {upcoming}")
        return original(self)

    loop.Trainer.train_step = train_step
    from ascend_engine import cli

    sys.argv = ["ascend-engine", *argv]
    sys.exit(cli.main())


if __name__ == "__main__":
    main()
