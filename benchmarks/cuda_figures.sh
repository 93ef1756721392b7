#!/usr/bin/env bash
# The engine's figures on one CUDA GPU, in one pass: the training step against a bare megatron-core loop, MFU of a
# ~1B-parameter bf16 run, a conversion against a plain copy, and generation and 0-shot scoring (in process and
# whole processes) against transformers. Every step is bounded and independent (a failing one is reported and the
# rest still run); the log goes to $OUT (or a temporary folder) and ends with one summary line per step.
#
#   bash benchmarks/cuda_figures.sh            # on a machine with a GPU, torch and megatron-core importable
#   ONLY="train_step mfu" bash benchmarks/cuda_figures.sh    # some of the steps
#
# On a machine whose Python lacks our dependencies, install the wheels first into a folder on PYTHONPATH; the
# repository's folders are put on PYTHONPATH here, so no install of this project is needed.
set -u
cd "$(dirname "$0")/.."
out=${OUT:-$(mktemp -d)}
export PYTHONPATH="$PWD/engine:$PWD/operator:$PWD/cluster:$PWD/cli${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
bin=$(mktemp -d)
printf '#!/bin/sh\nexec %s -m ascend_engine "$@"\n' "$(command -v python3)" >"$bin/ascend-engine"
chmod +x "$bin/ascend-engine"
export PATH="$bin:$PATH"
summary=()

step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2 began=$SECONDS rc
    shift 2
    if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
    echo "=== $name (limit ${limit}s): $*"
    timeout "$limit" "$@" 2>&1 | tee "$out/$name.log"
    rc=${PIPESTATUS[0]}
    summary+=("$name: rc $rc in $((SECONDS - began))s")
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, megatron.core, transformers; print('torch', torch.__version__, 'megatron-core',
megatron.core.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"

step train_step 150 python3 benchmarks/train_step.py --device cuda --precision bf16 --hidden-size 1024 \
    --num-layers 8 --heads 16 --seq-length 1024 --micro-batch-size 4 --global-batch-size 8 --steps 10 --blocks 3
step mfu 150 python3 -m ascend_engine train --device cuda --mock-data --precision bf16 --num-layers 16 \
    --hidden-size 2048 --ffn-hidden-size 5632 --num-attention-heads 16 --group-query-attention \
    --num-query-groups 4 --swiglu --normalization RMSNorm --position-embedding-type rope --vocab-size 32000 \
    --seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 2 --global-batch-size 8 \
    --train-iters 20 --log-interval 5
step generate 120 python3 benchmarks/generate.py --device cuda --layers 8 --hidden 512 --vocab 32000 \
    --batch 16 --prompt 200 --spread 0.25 --new-tokens 128 --no-uncached
step evaluate 120 python3 benchmarks/evaluate.py --device cuda --questions 256 --shots 0 --batch 16
step evaluate_process 150 python3 benchmarks/evaluate.py --device cuda --whole-process --questions 256 --shots 0 \
    --batch 16
step checkpoint_save 90 python3 benchmarks/checkpoint_save.py --device cuda --hidden-size 1024 --num-layers 8 \
    --rounds 3
step grpo 150 python3 benchmarks/grpo_step.py --device cuda --blocks 3 --steps 4 --hidden-size 512 --num-layers 8
step convert 150 python3 benchmarks/convert.py --layers 10 --rounds 3

printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
