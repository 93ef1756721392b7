"""Our training step vs a bare megatron-core loop on the same model, optimizer and real batches; prints ms/step.

The data is real: a generated English-like corpus, a byte-level BPE tokenizer trained on it here (no downloads)
and ``ascend-engine preprocess`` writing a Megatron indexed dataset, which the run reads through ``dataPath``.

The bare loop is what a Megatron-core user writes by hand: ``get_forward_backward_func()`` over batches already
on the device with a masked-mean loss, then ``optimizer.step()``. Ours (``Trainer.train_step``) adds the data
pipeline (sample lookup in the indexed dataset, collation and the host-side vocabulary check per micro-batch),
the loss all-reduce for the log line, the scheduler step and the bookkeeping. Before each block the micro-batches
that ours is about to read are drawn and moved to the device untimed, and the bare loop is fed exactly those, so
both loops see the same tokens. Both run on the same Trainer's model and optimizer in alternating blocks (the
order flips every block) so drift in machine speed hits both alike. One process (world of one); ``--device cuda``
on a GPU.

    .venv/bin/python benchmarks/train_step.py [--device cpu|cuda] [--hidden-size 128 --num-layers 2 --seq-length 128]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

WORDS = ("the of and to in is was for on that with as by at from his her an which were are this be also had "
         "model data training token sequence layer attention parallel tensor pipeline device cluster node "
         "river mountain city history music science language market energy system network").split()


def make_dataset(root: Path, vocab_size: int, size_mb: float) -> tuple[str, int]:
    """A pretraining jsonl of about ``size_mb``, a BPE tokenizer trained on it, the indexed dataset; returns
    (dataset prefix, tokenizer vocabulary size)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from ascend_engine.cli import main as engine_main

    rng = random.Random(0)
    # the common words plus a long tail of made-up ones, so the BPE reaches a realistic vocabulary
    words = list(WORDS) * 50 + ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(3, 10)))
                                for _ in range(vocab_size)]
    pool = [" ".join(rng.choices(words, k=rng.randint(6, 24))).capitalize() + "." for _ in range(20000)]
    corpus = root / "corpus.jsonl"
    with open(corpus, "w") as f:
        while f.tell() < size_mb * 1e6:
            f.write(json.dumps({"text": " ".join(rng.choices(pool, k=rng.randint(5, 60)))}) + "\n")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(pool, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.save_pretrained(root / "tokenizer")
    rc = engine_main(["preprocess", "--input", str(corpus), "--tokenizer-name-or-path", str(root / "tokenizer"),
                      "--output-prefix", str(root / "corpus"), "--append-eod"])
    if rc != 0:
        raise SystemExit(f"preprocess failed ({rc})")
    return str(root / "corpus_text_document"), len(fast)


def spread(values: list[float], digits: int = 2) -> str:
    return (f"median {statistics.median(values):.{digits}f}  (min {min(values):.{digits}f}, "
            f"max {max(values):.{digits}f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "npu"])
    ap.add_argument("--hidden-size", type=int, default=128)
    ap.add_argument("--num-layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq-length", type=int, default=128)
    ap.add_argument("--micro-batch-size", type=int, default=2)
    ap.add_argument("--global-batch-size", type=int, default=4)
    ap.add_argument("--vocab-size", type=int, default=4000, help="BPE vocabulary trained on the corpus")
    ap.add_argument("--corpus-mb", type=float, default=4.0)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--steps", type=int, default=5, help="timed steps per block")
    ap.add_argument("--blocks", type=int, default=3, help="blocks of each loop, interleaved (at least 3)")
    args = ap.parse_args()
    for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"):
        os.environ.pop(k, None)

    import torch

    from ascend_engine.config.train import TrainConfig
    from ascend_engine.device import select_backend
    from ascend_engine.models.gpt import rope_positions
    from ascend_engine.train.batches import micro_batches
    from ascend_engine.models.wrappers import unwrap
    from ascend_engine.train.loop import Trainer
    from ascend_engine.train.stages.language_model import masked_mean_loss

    workdir = tempfile.TemporaryDirectory(prefix="train-step-bench-")
    prefix, vocab = make_dataset(Path(workdir.name), args.vocab_size, args.corpus_mb)
    cfg = TrainConfig.model_validate({
        "device": args.device,
        "model": {"numLayers": args.num_layers, "hiddenSize": args.hidden_size, "numAttentionHeads": args.heads,
                  "vocabSize": vocab},
        "training": {"microBatchSize": args.micro_batch_size, "globalBatchSize": args.global_batch_size,
                     "seqLength": args.seq_length, "trainIters": 10_000, "precision": args.precision},
        "optimizer": {"lrDecayStyle": "constant"}, "data": {"dataPath": [prefix]},
        "observability": {"metricsPort": 0}})
    backend = select_backend(args.device)
    trainer = Trainer(cfg, backend)
    from megatron.core.pipeline_parallel import get_forward_backward_func

    device = backend.torch_device
    gpt = unwrap(trainer.model)
    num_micro, gbs = trainer.num_micro, args.global_batch_size

    def draw(steps: int) -> list[list[dict]]:
        """The micro-batches ours reads in its next ``steps`` steps, on the device (untimed)."""
        out = []
        for s in range(steps):
            batches = micro_batches(trainer.data.sample, trainer.data.batch, trainer.consumed + s * gbs,
                                    args.micro_batch_size, 1, 0, num_micro, trainer.vocab_size)
            out.append([{k: v.to(device) for k, v in b.items()} for b in batches])
        return out

    def bare_forward(data_iterator, model):
        b = next(data_iterator)
        positions = torch.arange(b["tokens"].shape[1], device=device).unsqueeze(0).expand_as(b["tokens"])
        return (model(b["tokens"], rope_positions(gpt, positions), None, labels=b["labels"]),
                partial(masked_mean_loss, b["loss_mask"]))

    def bare_step(batches: list[dict]) -> None:
        trainer.model.zero_grad_buffer()
        trainer.optimizer.zero_grad()
        get_forward_backward_func()(forward_step_func=bare_forward, data_iterator=iter(batches),
                                    model=[trainer.model], num_microbatches=num_micro, seq_length=args.seq_length,
                                    micro_batch_size=args.micro_batch_size, forward_only=False)
        trainer.optimizer.step()

    def sync():
        if args.device == "cuda":
            torch.cuda.synchronize()

    def timed(run_steps) -> float:
        sync()
        start = time.perf_counter()
        run_steps()
        sync()
        return 1000 * (time.perf_counter() - start) / args.steps

    def ours_block():
        for _ in range(args.steps):
            trainer.train_step()

    for batches in draw(2):  # warm-up (allocations, first-call overheads)
        bare_step(batches)
    for _ in range(2):
        trainer.train_step()
    ours, bare, data = [], [], []
    for block in range(max(3, args.blocks)):
        start = time.perf_counter()
        drawn = draw(args.steps)  # what ours reads next; the bare loop gets the same tokens
        data.append(1000 * (time.perf_counter() - start) / args.steps)
        runs = [("ours", ours_block), ("bare", lambda: [bare_step(b) for b in drawn])]
        for name, run in runs if block % 2 == 0 else runs[::-1]:
            (ours if name == "ours" else bare).append(timed(run))
    ratios = [o / b for o, b in zip(ours, bare)]
    print(f"device {args.device} ({torch.cuda.get_device_name() if args.device == 'cuda' else os.cpu_count()} "
          f"{'GPU' if args.device == 'cuda' else 'CPU threads'}, torch threads {torch.get_num_threads()}), "
          f"{args.precision}, layers {args.num_layers}, hidden {args.hidden_size}, seq {args.seq_length}, "
          f"micro {args.micro_batch_size} x {num_micro} micro-batches, vocab {vocab} (BPE on "
          f"{args.corpus_mb:g} MB generated text, indexed dataset from ascend-engine preprocess), "
          f"{len(ours)} interleaved blocks of {args.steps} steps")
    print(f"ours (Trainer.train_step, reads the dataset):  {spread(ours)} ms/step")
    print(f"bare megatron-core, same batches pre-drawn:    {spread(bare)} ms/step")
    print(f"ratio ours / bare, per block pair:              {spread(ratios, 3)}")
    print(f"of which ours' data pipeline (read, collate, check, copy): {spread(data)} ms/step")
    workdir.cleanup()


if __name__ == "__main__":
    main()
