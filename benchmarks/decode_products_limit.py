"""A decode step's products against this core's physical limits: what is left for issue 38's generation goal.

A decode step of the generation benchmark's model (16 rows, hidden 512, ffn 2048 by SwiGLU, 8 layers, vocab
32000, fp32) multiplies 16 rows by every weight once: 200 MB of weights read from memory each step (beside a KV cache
as large, they do not stay in the last-level cache), 2 x 16 FLOP per weight read. This script times each product shape the step runs,
with its weight cold (a rotating set of copies 1.5x the last-level cache, as in a real step) and hot (the
same copy again), by the plain product (MKL) and by the packed oneDNN kernel the engine uses
(``device.packed_linears``), next to the two limits measured in the same run: the core's peak on a large square
product and its streaming read bandwidth. Rounds interleave every variant; medians and spread are printed.

With ``--streaming`` it also times ``streaming_products.cpp``, a prototype kernel (compiled here, about half a
minute) that walks a panel-packed weight strictly in order with software prefetch: how much of the distance to
the memory's limit a kernel written for a few rows and a cold weight closes.

    .venv/bin/python benchmarks/decode_products_limit.py [--rounds 3 --threads 1 --streaming]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

ROWS = 16
SHAPES = {"qkv 512->1536": (512, 1536), "proj 512->512": (512, 512), "fc1 512->4096": (512, 4096),
          "fc2 2048->512": (2048, 512), "output 512->32000": (512, 32000)}


def last_level_cache_bytes() -> int:
    try:
        size = open("/sys/devices/system/cpu/cpu0/cache/index3/size").read().strip()  # "32768K"
        return int(size[:-1]) << {"K": 10, "M": 20}[size[-1]]
    except (OSError, ValueError, KeyError):
        return 32 << 20


COLD_BYTES = max(96 << 20, 3 * last_level_cache_bytes() // 2)  # copies that cannot all stay in the cache


def timed(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--streaming", action="store_true", help="also time the prototype streaming kernel")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    results: dict[str, list[float]] = {}

    def record(name: str, value: float) -> None:
        results.setdefault(name, []).append(value)

    square = torch.randn(2048, 2048)
    stream = torch.randn(100_000_000)  # 400 MB
    streaming = compiled_prototype() if args.streaming else None
    variants = {}
    for label, (k, n) in SHAPES.items():
        copies = max(2, COLD_BYTES // (k * n * 4) + 1)
        weights = [torch.randn(n, k) for _ in range(copies)]
        packed = [torch.ops.mkldnn._reorder_linear_weight(w, ROWS) for w in weights]
        panels = [streaming.pack(w) for w in weights] if streaming else None
        if streaming:
            x = torch.randn(ROWS, k)
            got, want = streaming.linear(x, panels[0], n), torch.nn.functional.linear(x, weights[0])
            assert (got - want).abs().max() <= 1e-5 * want.abs().max(), f"{label}: the prototype's product is wrong"
        variants[label] = (k, n, weights, packed, panels)
    x = {k: torch.randn(ROWS, k) for k, _ in SHAPES.values()}
    with torch.inference_mode():
        for round_ in range(args.rounds):
            record("peak GFLOP/s (2048^3 product)", 2 * 2048 ** 3 / timed(lambda: square @ square, 3) / 1e9)
            record("stream read GB/s (sum of 400 MB)", 0.4 / timed(stream.sum, 2))
            for label, (k, n, weights, packed, panels) in variants.items():
                flop, inputs = 2 * ROWS * k * n, x[k]
                kernels = [("MKL", weights, lambda w: torch.nn.functional.linear(inputs, w)),
                           ("oneDNN packed", packed, lambda w: torch.ops.mkldnn._linear_pointwise(
                               inputs, w, None, "none", [], ""))]
                if streaming:
                    kernels.append(("streaming", panels, lambda w, n=n: streaming.linear(inputs, w, n)))
                for kernel, ws, run in kernels:
                    turn = iter(range(10 ** 9))
                    cold = timed(lambda: run(ws[next(turn) % len(ws)]), 3 * len(ws))
                    hot = timed(lambda: run(ws[0]), 3 * len(ws))
                    record(f"{label:18s} {kernel:13s} cold GFLOP/s", flop / cold / 1e9)
                    record(f"{label:18s} {kernel:13s} hot  GFLOP/s", flop / hot / 1e9)
                    if kernel != "MKL":
                        record(f"{label:18s} {kernel:13s} cold GB/s of weights", k * n * 4 / cold / 1e9)
            print(f"round {round_ + 1}/{args.rounds} done", flush=True)
    for name, values in results.items():
        print(f"{name:52s} {statistics.median(values):7.1f}  (min {min(values):.1f}, max {max(values):.1f})")
    peak = statistics.median(results["peak GFLOP/s (2048^3 product)"])
    gflop = {label: 2 * ROWS * k * n / 1e9 for label, (k, n) in SHAPES.items()}  # GFLOP of one product
    per_layer = [label for label in SHAPES if not label.startswith("output")]
    flop = 8 * sum(gflop[label] for label in per_layer) + gflop["output 512->32000"]
    step = sum(gflop[label] / statistics.median(results[f"{label:18s} oneDNN packed cold GFLOP/s"]) *
               (8 if label in per_layer else 1) for label in SHAPES)
    ideal = flop / peak
    print(f"one decode step's products: {step * 1e3:.1f} ms with the packed kernel on cold weights, "
          f"{ideal * 1e3:.1f} ms at the core's peak ({step / ideal:.2f}x)")
    if streaming:
        fast = sum(gflop[label] / statistics.median(results[f"{label:18s} streaming     cold GFLOP/s"]) *
                   (8 if label in per_layer else 1) for label in SHAPES)
        print(f"  with the prototype streaming kernel: {fast * 1e3:.1f} ms ({step / fast:.2f}x faster)")


def compiled_prototype():
    """``streaming_products.cpp`` built for this CPU (16 lanes with AVX-512, else 8)."""
    from pathlib import Path

    from torch.utils.cpp_extension import load

    lanes = 16 if "avx512f" in Path("/proc/cpuinfo").read_text() else 8
    print(f"compiling the prototype streaming kernel ({lanes} lanes) ...", flush=True)
    return load(name=f"streaming_products_{lanes}", sources=[str(Path(__file__).with_name("streaming_products.cpp"))],
                extra_cflags=["-O3", "-march=native", f"-DLANES={lanes}", "-DMBLOCK=16", "-DPREFETCH=64"])


if __name__ == "__main__":
    main()
