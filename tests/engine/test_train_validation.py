"""Validation loss during training (``--eval-interval`` / ``--eval-iters``): logged like Megatron-LM, and equal to
an independent computation over the same validation samples (plain cross-entropy on the saved model's logits).

Run as a script, this file is the reference worker: a world of one that loads the checkpoint into GPTModel and
computes the loss by hand. The two agree within float32's rounding of one forward (tests/float_bounds.py: delta =
sqrt(K = 512, the padded vocabulary) x (2 layers + 2) x 2**-24 = 5.4e-6 of the loss, about 3e-5 for these losses
near 5, and the log line's last digit; the former fixed 1e-5 was 3x tighter, a figure from one machine's runs
rather than from the arithmetic).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

VALIDATION = re.compile(r"validation loss at iteration (\d+) \| lm loss value: (\S+) \| lm loss PPL: (\S+) \|")


@pytest.mark.engine
def test_validation_loss_equals_a_hand_computation_over_the_same_samples(tmp_path, monkeypatch):
    from test_train_data import config
    from test_train_torchrun import assert_ok, free_port, run_train

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
    from prep_support import CORPUS, build_tokenizer, preprocess, write_jsonl

    tok = build_tokenizer(tmp_path / "tok")
    assert preprocess("--input", write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in CORPUS]),
                      "--tokenizer-name-or-path", tok, "--output-prefix", tmp_path / "c", "--append-eod") == 0
    cfg = config({"dataPath": [str(tmp_path / "c")], "split": "80,20,0"}, trainIters=4, evalInterval=2,
                 evalIters=2) | {"checkpoint": {"save": str(tmp_path / "ckpt")},
                                 "observability": {"metricsPort": free_port()}}
    # rank 0's last metrics outlive it as the termination message the operator reads into status.progress
    monkeypatch.setenv("ASCEND_TERMINATION_LOG", str(tmp_path / "termination-log"))
    proc, steps = run_train(tmp_path, cfg)  # two data-parallel ranks: the loss is averaged over both
    assert_ok(proc)
    found = [(int(m[1]), float(m[2]), float(m[3])) for m in VALIDATION.finditer(proc.stdout)]
    assert [f[0] for f in found] == [2, 4], proc.stdout[-2000:]
    _, loss, ppl = found[-1]
    assert ppl == pytest.approx(2.718281828 ** loss, rel=1e-5)
    ref = subprocess.run([sys.executable, __file__, str(tmp_path / "job.yaml")], capture_output=True, text=True,
                         timeout=120)
    assert_ok(ref)
    expected = json.loads(ref.stdout.strip().splitlines()[-1])
    from float_bounds import forward_atol, model_delta, printed
    from test_train_data import MODEL

    atol = forward_atol(expected["loss"], model_delta(MODEL, cfg["training"]["seqLength"])) + printed(loss)
    print(f"validation loss {abs(loss - expected['loss']):.1e} from the hand computation, bound {atol:.1e}")
    assert loss == pytest.approx(expected["loss"], abs=atol), (loss, expected)
    assert expected["loss"] != pytest.approx(steps[-1][2], abs=1e-3)  # not the training loss
    final = json.loads((tmp_path / "termination-log").read_text())
    assert final["validationLoss"] == pytest.approx(loss, rel=1e-6)


def _reference(job: Path) -> None:
    """Loss of the saved model over samples 0 .. evalIters x globalBatch - 1 of the validation part, per
    micro-batch of microBatchSize as the token mean, then the mean over micro-batches."""
    import torch
    import torch.nn.functional as F
    import yaml

    from ascend_engine.checkpoint.layout import checkpoint_file, read_latest
    from ascend_engine.config.train import TrainConfig
    from ascend_engine.data.pretrain import PretrainDataset
    from ascend_engine.device import select_backend
    from ascend_engine.models.gpt import build_gpt_model
    from ascend_engine.parallel import destroy_parallel, init_parallel

    cfg = TrainConfig.model_validate(yaml.safe_load(job.read_text()))
    t = cfg.training
    init_parallel(select_backend("cpu"), 1, 1, seed=0)
    model = build_gpt_model(cfg.model, cfg.parallel, t.seqLength)
    root = cfg.checkpoint.save
    state = torch.load(checkpoint_file(root, read_latest(root), 0, 0, 1), weights_only=False)
    model.load_state_dict(state["model"], strict=False)
    model.eval()
    valid = PretrainDataset(cfg.data.dataPath[0] + "_text_document", t.seqLength, t.seed, cfg.data.split, "c",
                            part=1)
    losses = []
    count = t.evalIters * t.globalBatchSize
    with torch.no_grad():
        for first in range(0, count, t.microBatchSize):
            text = torch.stack([torch.from_numpy(valid[i]["text"]) for i in range(first, first + t.microBatchSize)])
            tokens, labels = text[:, :-1], text[:, 1:]
            positions = torch.arange(tokens.shape[1]).unsqueeze(0).expand_as(tokens)
            logits = model(tokens, positions, None)[..., : cfg.model.padded_vocab_size(1)]
            losses.append(float(F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))))
    destroy_parallel()
    print(json.dumps({"loss": sum(losses) / len(losses)}))


if __name__ == "__main__":
    from rank_process import run_rank

    run_rank(_reference, Path(sys.argv[1]))
