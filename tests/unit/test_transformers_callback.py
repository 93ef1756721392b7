"""HuggingFace Transformers' Trainer with AscendProgressCallback serves the engine's metric names while it trains
(the operator's scraper reads them into status.progress fields) and leaves the last figures as the termination
message."""
from __future__ import annotations

import json
import socket

import pytest


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_trainer_reports_progress_in_the_engines_metrics(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    from ascend_engine.transformers_callback import AscendProgressCallback
    from ascend_operator.progress.scrape import scrape

    monkeypatch.setenv("ASCEND_TERMINATION_LOG", str(tmp_path / "termination-log"))
    monkeypatch.setenv("POD_IP", "127.0.0.1")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=32))
    ids = torch.randint(0, 64, (16, 16))
    data = [{"input_ids": row, "labels": row} for row in ids]
    port = _free_port()
    scraped = []

    class Scrape(TrainerCallback):  # what the operator sees from outside while the run goes on
        def on_log(self, args, state, control, **kwargs):
            scraped.append(scrape(f"http://127.0.0.1:{port}/metrics"))

    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=6, per_device_train_batch_size=4,
                             logging_steps=2, save_steps=3, learning_rate=1e-3, report_to=[], use_cpu=True,
                             include_num_input_tokens_seen=True)
    progress = AscendProgressCallback(port=port)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[progress, Scrape()])
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert [s["iteration"] for s in scraped[:3]] == [2, 4, 6]
    assert scraped[0]["trainIters"] == 6 and scraped[0]["percent"] == pytest.approx(33.333)
    assert scraped[0]["loss"] == pytest.approx(logged[0]["loss"], rel=1e-4)
    assert scraped[1]["learningRate"] == pytest.approx(logged[1]["learning_rate"], rel=1e-4)
    assert scraped[1]["tokensPerSecond"] > 0 and scraped[1]["lastCheckpointIteration"] == 3
    final = json.loads((tmp_path / "termination-log").read_text())
    assert final["iteration"] == 6 and final["lastCheckpointIteration"] == 6
