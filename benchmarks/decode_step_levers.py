"""Issue 38's decode-step levers, each alone, in one process, alternating: CPU ms per decode step of the
generation benchmark's model (8 layers, hidden 512, vocab 32000, 16 rows at ~270 keys, fp32, 1 thread), through
megatron-core's modules or ``generate/lean_forward.py``, attention by SDPA or by two batched products, MKL
(``x @ W^T``), weight-major (``(W @ x^T)^T``) or oneDNN-packed products; and each variant's logits against the
path before issue 38.

    PYTHONPATH=engine .venv/bin/python benchmarks/decode_step_levers.py      (ROUNDS=5 by default)
"""
import argparse
import functools
import os
import statistics
import sys
import time

import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import generate as G
torch.set_num_threads(1)
a = argparse.Namespace(layers=8, hidden=512, vocab=32000, batch=16, prompt=200, spread=0.25, new_tokens=32,
                       device="cpu")
gpt, model, max_len, device = G.build(a)
from ascend_engine.generate import lean_forward, ragged
from ascend_engine.models import sdpa_attention
from ascend_engine.models.ragged_cache import RaggedKVCache
from ascend_engine.models.inference_linears import direct_linears, packed_products
gen = torch.Generator().manual_seed(2)
low, high = int(a.prompt * (1 - a.spread)), G.longest(a)
lengths = torch.randint(low, high + 1, (a.batch,), generator=gen).tolist()
prompts = [torch.randint(4, a.vocab, (n,), generator=gen).tolist() for n in lengths]
onednn = packed_products(gpt, 16)
weights = {id(p): p for p in gpt.parameters()}
mkl = {k: functools.partial(torch.nn.functional.linear, weight=weights[k]) for k in onednn}
wmaj = {k: (lambda x, w=v.keywords["weight"]: torch.matmul(w, x.t()).t()) for k, v in mkl.items()}
real_da = sdpa_attention.cached_attention
def products_da(q, k, v, hidden, scale):  # two batched products and a masked softmax instead of SDPA
    b, heads, s, dim = q.shape  # s == 1: a group's queries side by side against its keys
    q = q.reshape(b, k.shape[1], heads // k.shape[1], dim)
    scores = torch.matmul(q * scale, k.transpose(-1, -2)).masked_fill_(hidden, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v).view(b, heads, s, dim)
with torch.inference_mode():
    cache = RaggedKVCache(16, max_len)
    with direct_linears(gpt, onednn):
        logits = ragged._prefill(gpt, prompts, cache, a.vocab, device, None)
    picked = logits.argmax(-1); pos = torch.tensor(lengths) + 20; mask = cache.decode(pos)
    def model(products, da):
        def f():
            sdpa_attention.cached_attention = da
            with direct_linears(gpt, products):
                return gpt(picked.unsqueeze(1), pos.unsqueeze(1), mask, inference_context=cache,
                           runtime_gather_output=True)[:, -1]
        return f
    def lean(products, da=real_da):
        step = lean_forward.LeanForward(gpt, max_len, products)
        def f():
            sdpa_attention.cached_attention = lean_forward.cached_attention = da
            return step(picked, pos, mask, cache)
        return f
    fns = {"model, MKL (before)": model({}, real_da), "model, oneDNN": model(onednn, real_da),
           "lean, MKL x@W^T": lean(mkl), "lean, weight-major": lean(wmaj),
           "lean, oneDNN, products attention": lean(onednn, products_da), "lean, oneDNN, SDPA (kept)": lean(onednn)}
    ref = fns["model, MKL (before)"]().clone()
    for k, f in fns.items():
        got = f()
        print(f"{k:34s} max rel logits diff vs before {((got - ref).abs().max() / ref.abs().max()).item():.1e}")
    times = {k: [] for k in fns}
    for _ in range(int(os.environ.get("ROUNDS", 5))):
        for k, f in fns.items():
            s = time.process_time()
            for _ in range(4): f()
            times[k].append((time.process_time() - s) / 4 * 1e3)
    for k in fns:
        print(f"{k:34s} {statistics.median(times[k]):6.1f} ms/step (min {min(times[k]):.1f}, "
              f"max {max(times[k]):.1f})")
print("load average", os.getloadavg())
