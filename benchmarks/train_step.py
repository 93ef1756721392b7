"""Our training step vs a bare megatron-core loop on the same model, optimizer and data; prints ms/step.

The bare loop is what a Megatron-core user writes by hand: ``get_forward_backward_func()`` over fixed batches
with a masked-mean loss, then ``optimizer.step()``. Ours (``Trainer.train_step``) adds the data pipeline
(sample lookup and collation per micro-batch), the loss all-reduce for the log line, the scheduler step and
the bookkeeping. Both run on the same Trainer's model and optimizer, alternating blocks of steps so drift in
machine speed hits both alike. One process (world of one); ``--device cuda`` on a GPU.

    python benchmarks/train_step.py [--device cpu|cuda] [--hidden-size 256 --num-layers 4 --seq-length 256]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from functools import partial


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "npu"])
    ap.add_argument("--hidden-size", type=int, default=256)
    ap.add_argument("--num-layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq-length", type=int, default=256)
    ap.add_argument("--micro-batch-size", type=int, default=2)
    ap.add_argument("--global-batch-size", type=int, default=4)
    ap.add_argument("--vocab-size", type=int, default=32000)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--steps", type=int, default=10, help="timed steps per block")
    ap.add_argument("--blocks", type=int, default=3)
    args = ap.parse_args()
    for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"):
        os.environ.pop(k, None)

    import torch

    from ascend_engine.config.train import TrainConfig
    from ascend_engine.device import select_backend
    from ascend_engine.train.loop import Trainer
    from ascend_engine.train.stages.language_model import masked_mean_loss

    cfg = TrainConfig.model_validate({
        "device": args.device,
        "model": {"numLayers": args.num_layers, "hiddenSize": args.hidden_size, "numAttentionHeads": args.heads,
                  "vocabSize": args.vocab_size},
        "training": {"microBatchSize": args.micro_batch_size, "globalBatchSize": args.global_batch_size,
                     "seqLength": args.seq_length, "trainIters": 10_000, "precision": args.precision},
        "optimizer": {"lrDecayStyle": "constant"}, "observability": {"metricsPort": None}})
    backend = select_backend(args.device)
    trainer = Trainer(cfg, backend)
    from megatron.core.pipeline_parallel import get_forward_backward_func

    device = backend.torch_device
    fixed = trainer.data.batch([trainer.data.sample(i) for i in range(args.micro_batch_size)])
    tokens, labels = fixed["tokens"].to(device), fixed["labels"].to(device)
    loss_mask = fixed["loss_mask"].to(device)
    positions = torch.arange(tokens.shape[1], device=device).unsqueeze(0).expand_as(tokens)
    num_micro = trainer.num_micro

    def bare_forward(data_iterator, model):
        next(data_iterator)
        return model(tokens, positions, None, labels=labels), partial(masked_mean_loss, loss_mask)

    def bare_step():
        trainer.model.zero_grad_buffer()
        trainer.optimizer.zero_grad()
        get_forward_backward_func()(forward_step_func=bare_forward, data_iterator=iter(range(num_micro)),
                                    model=[trainer.model], num_microbatches=num_micro, seq_length=args.seq_length,
                                    micro_batch_size=args.micro_batch_size, forward_only=False)
        trainer.optimizer.step()

    def sync():
        if args.device == "cuda":
            torch.cuda.synchronize()

    def timed(step) -> float:
        sync()
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        sync()
        return 1000 * (time.perf_counter() - start) / args.steps

    ours_step = lambda: trainer.train_step()  # noqa: E731
    for step in (ours_step, bare_step):  # warm-up (allocations, first-call overheads)
        for _ in range(2):
            step()
    ours, bare = [], []
    for _ in range(args.blocks):
        ours.append(timed(ours_step))
        bare.append(timed(bare_step))
    o, b = statistics.median(ours), statistics.median(bare)
    print(f"device {args.device} ({torch.cuda.get_device_name() if args.device == 'cuda' else os.cpu_count()} "
          f"{'GPU' if args.device == 'cuda' else 'CPU threads'}), {args.precision}, layers {args.num_layers}, "
          f"hidden {args.hidden_size}, seq {args.seq_length}, micro {args.micro_batch_size} x "
          f"{num_micro} micro-batches, vocab {args.vocab_size}")
    print(f"ours (Trainer.train_step):            {o:9.2f} ms/step  (blocks: {', '.join(f'{x:.1f}' for x in ours)})")
    print(f"bare megatron-core forward/backward:  {b:9.2f} ms/step  (blocks: {', '.join(f'{x:.1f}' for x in bare)})")
    print(f"ratio ours / bare: {o / b:.3f}")


if __name__ == "__main__":
    main()
