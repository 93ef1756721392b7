"""``torch.compile`` of the lean decode step (``generate/lean_forward.py``) against the eager step, in one process,
alternating: CPU ms per step, the first compiled call's CPU seconds, and the logits' largest relative difference.

Shapes: ``grpo`` (benchmarks/grpo_step.py's model: hidden 256, 4 layers, vocab 1000, 32 rows at ~96 keys) or
``generate`` (benchmarks/generate.py's: hidden 512, 8 layers, vocab 32000, 16 rows at ~270 keys); fp32, 1 thread.

    PYTHONPATH=engine .venv/bin/python benchmarks/decode_step_compiled.py [grpo|generate]   (ROUNDS=5 by default)
"""
import argparse
import functools
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import generate as G  # noqa: E402

torch.set_num_threads(1)
shape = sys.argv[1] if len(sys.argv) > 1 else "grpo"
a = (argparse.Namespace(layers=4, hidden=256, vocab=1000, batch=32, prompt=32, spread=0.0, new_tokens=64,
                        device="cpu") if shape == "grpo" else
     argparse.Namespace(layers=8, hidden=512, vocab=32000, batch=16, prompt=200, spread=0.25, new_tokens=32,
                        device="cpu"))
gpt, model, max_len, device = G.build(a)
from ascend_engine.generate import lean_forward, ragged  # noqa: E402
from ascend_engine.models.inference_linears import direct_linears, packed_products  # noqa: E402
from ascend_engine.models.ragged_cache import RaggedKVCache  # noqa: E402

gen = torch.Generator().manual_seed(2)
low, high = int(a.prompt * (1 - a.spread)), G.longest(a)
lengths = torch.randint(low, high + 1, (a.batch,), generator=gen).tolist()
prompts = [torch.randint(4, a.vocab, (n,), generator=gen).tolist() for n in lengths]
onednn = packed_products(gpt, a.batch)
weights = {id(p): p for p in gpt.parameters()}
plain = {k: functools.partial(torch.nn.functional.linear, weight=weights[k]) for k in onednn}
with torch.inference_mode():
    cache = RaggedKVCache(a.batch, max_len)
    with direct_linears(gpt, onednn):
        logits = ragged._prefill(gpt, prompts, cache, a.vocab, device, None)
    picked, base = logits.argmax(-1), torch.tensor(lengths)
    eager, eager_plain = lean_forward.LeanForward(gpt, max_len, onednn), lean_forward.LeanForward(gpt, max_len, plain)
    # inductor traces plain products (it cannot trace the packed oneDNN weights); dynamic: keys grow every step
    compiled = torch.compile(eager_plain.__call__, dynamic=True)

    def run(step, offset):
        pos = base + offset
        return step(picked, pos, cache.decode(pos, int(pos.max()) + 1), cache)

    start = time.process_time()
    run(compiled, 1)
    print(f"first compiled call: {time.process_time() - start:.1f} CPU s")
    got, ref = run(compiled, 2), run(eager, 2)
    print(f"compiled against eager (oneDNN): max relative logits difference "
          f"{((got - ref).abs().max() / ref.abs().max()).item():.1e}")
    variants = {"eager, oneDNN packed": eager, "eager, plain products": eager_plain, "compiled": compiled}
    times = {k: [] for k in variants}
    for r in range(int(os.environ.get("ROUNDS", 5))):
        for k, step in variants.items():
            start = time.process_time()
            for i in range(8):
                run(step, 3 + r * 8 + i)
            times[k].append((time.process_time() - start) / 8 * 1e3)
    for k, v in times.items():
        print(f"{k:24s} {statistics.median(v):7.2f} CPU ms/step (min {min(v):.2f}, max {max(v):.2f})")
print("load average", os.getloadavg())
