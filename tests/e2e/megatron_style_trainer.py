"""A torchrun program that is not ours, for the bring-your-own e2e: it trains nothing real but behaves as
Megatron-LM's pretrain_gpt.py does where the operator can see it. It joins the gloo group torchrun sets up (from the
PET_* environment alone), all-reduces a loss, prints Megatron-LM core_v0.12.1's training_log line on the last rank,
saves Megatron's tracker file with its "successfully saved checkpoint" line on rank 0, resumes from it, and fails
with its own exception when the data is missing.

    torchrun megatron_style_trainer.py --data-path P --save DIR --train-iters N --save-interval K --seq-length S
"""
import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--data-path", required=True)
parser.add_argument("--save", required=True)
parser.add_argument("--train-iters", type=int, required=True)
parser.add_argument("--save-interval", type=int, required=True)
parser.add_argument("--seq-length", type=int, required=True)
parser.add_argument("--global-batch-size", type=int, default=8)
parser.add_argument("--seconds-per-iteration", type=float, default=0.3)
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
if not os.path.exists(args.data_path):
    raise FileNotFoundError(f"no dataset at {args.data_path}_text_document.bin")
tracker = os.path.join(args.save, "latest_checkpointed_iteration.txt")
start = int(open(tracker).read()) if os.path.exists(tracker) else 0
if start and rank == 0:
    print(f" successfully loaded checkpoint from {args.save} [ t 1/1, p 1/1 ] at iteration {start}", flush=True)
for iteration in range(start + 1, args.train_iters + 1):
    begin = time.monotonic()
    time.sleep(args.seconds_per_iteration)
    loss = torch.tensor([10.0 / iteration])
    dist.all_reduce(loss)
    loss /= world
    lr = 1e-4 * min(1.0, iteration / 5)
    if rank == world - 1:
        line = f" [{datetime.datetime.now().strftime('%Y-%m-%d %H:%M:%S')}]"
        line += " iteration {:8d}/{:8d} |".format(iteration, args.train_iters)
        line += " consumed samples: {:12d} |".format(iteration * args.global_batch_size)
        line += " elapsed time per iteration (ms): {:.1f} |".format((time.monotonic() - begin) * 1000.0)
        line += f" learning rate: {lr:.6E} |"
        line += f" global batch size: {args.global_batch_size:5d} |"
        line += " {}: {:.6E} |".format("lm loss", loss.item())
        line += " loss scale: 1.0 |"
        line += " number of skipped iterations: {:3d} |".format(0)
        line += " number of nan iterations: {:3d} |".format(0)
        print(line, flush=True)
    if iteration % args.save_interval == 0:
        dist.barrier()
        if rank == 0:
            os.makedirs(args.save, exist_ok=True)
            with open(tracker + ".tmp", "w") as f:
                f.write(str(iteration))
            os.replace(tracker + ".tmp", tracker)
            print(f"  successfully saved checkpoint from iteration {iteration:7d} to {args.save} [ t 1/1, p 1/1 ]",
                  flush=True)
dist.barrier()
dist.destroy_process_group()
