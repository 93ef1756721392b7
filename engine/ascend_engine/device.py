"""The only module that knows about devices: pick a backend and prepare torch/Megatron for it.

Megatron-core assumes CUDA in a few dozen places (``device="cuda"`` tensor factories,
``torch.cuda.current_device()``, the CUDA RNG tracker, ``torch.cuda.FloatTensor`` type checks in the
optimizer). On Ascend, ``torch_npu.contrib.transfer_to_npu`` redirects those calls to the NPU. On CPU we do
the same thing with a small shim (``_install_cpu_shim``), so one training code path serves npu, cuda and cpu.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import warnings
from dataclasses import dataclass

import torch

# Nominal per-device peak FLOP/s used for MFU. Dense bf16/fp16 tensor-core figures from vendor sheets.
_CUDA_PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "H800": 989e12, "A100": 312e12, "A800": 312e12,
                   "L40S": 362e12, "A10": 125e12, "V100": 125e12}
_NPU_PEAK_BF16 = {"910B1": 414e12, "910B2": 376e12, "910B3": 313e12, "910B4": 280e12, "910": 256e12}
# CPU: cores x 2.5 GHz x 32 fp32 FLOP/cycle (two AVX2 FMA units). Only a yardstick so MFU is defined on CPU.
_CPU_FLOP_PER_CORE = 2.5e9 * 32


@dataclass(frozen=True)
class Backend:
    name: str  # "npu" | "cuda" | "cpu"
    dist_backend: str  # "hccl" | "nccl" | "gloo"

    @property
    def torch_device(self) -> torch.device:
        return _local_device(self.name)

    def peak_flops(self, dtype: torch.dtype = torch.bfloat16) -> float:
        """Per-device peak FLOP/s for MFU; fp32 counts as half the 16-bit figure on accelerators."""
        if self.name == "cpu":
            return (os.cpu_count() or 1) * _CPU_FLOP_PER_CORE
        if self.name == "cuda":
            name, table = torch.cuda.get_device_name(), _CUDA_PEAK_BF16
        else:
            name, table = torch.npu.get_device_name(), _NPU_PEAK_BF16  # type: ignore[attr-defined]
        peak = next((v for k, v in table.items() if k in name), max(table.values()))
        return peak if dtype in (torch.bfloat16, torch.float16) else peak / 2

    def apply(self) -> None:
        """Prepare torch and Megatron for this device; idempotent; call before Megatron is used."""
        _apply(self.name)


def _npu_available() -> bool:
    if importlib.util.find_spec("torch_npu") is None:
        return False
    import torch_npu  # noqa: F401

    return torch.npu.is_available()  # type: ignore[attr-defined]


def select_backend(name: str = "auto") -> Backend:
    """``auto`` picks npu, then cuda, then cpu; an explicit name that is not available is an error."""
    if name == "auto":
        name = "npu" if _npu_available() else "cuda" if torch.cuda.is_available() else "cpu"
    elif name == "npu" and not _npu_available():
        raise RuntimeError("device npu requested but torch_npu is not installed or no NPU is visible")
    elif name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device cuda requested but no CUDA device is visible")
    elif name not in ("npu", "cuda", "cpu"):
        raise ValueError(f"unknown device {name!r}: expected auto, npu, cuda or cpu")
    return Backend(name=name, dist_backend={"npu": "hccl", "cuda": "nccl", "cpu": "gloo"}[name])


_applied: set[str] = set()


def _local_device(name: str) -> torch.device:
    return torch.device("cpu") if name == "cpu" else torch.device(name, int(os.environ.get("LOCAL_RANK", "0")))


def all_reduce_host(tensor: torch.Tensor, op=None, group=None) -> torch.Tensor:
    """``all_reduce`` of a small host tensor (flags, a step's averaged metrics), returned on the host. NCCL and
    HCCL reduce only device tensors and gloo only host ones, so on an accelerator the values make the round trip
    through it; a no-op outside a process group."""
    dist = torch.distributed
    if not dist.is_initialized():
        return tensor
    op = dist.ReduceOp.SUM if op is None else op
    name = applied_backend() or "cpu"
    moved = tensor.to(_local_device(name))
    dist.all_reduce(moved, op=op, group=group)
    return moved.cpu()


# Weights at most this large (all of a model's together) get a packed copy for inference: the copy costs as much
# memory as the weights.
_PACKED_DECODE_BYTES = 4 << 30


def packed_linears(weights: list[torch.Tensor], rows: int) -> list:
    """For each weight [out, in], a function ``x [n, in] -> x @ weight^T`` for inference (``rows``: about how many
    rows a product has), in the kernel that runs such products fastest on the weight's device.

    On CPU that is oneDNN's matrix product on a copy of the weight packed once for it (what inductor's frozen
    CPU linears call): at a decode step's 16 rows by a [32000, 512] output layer 1.5-1.9x MKL's sgemm, either
    way round, and 10-20% faster on a prefill's hundreds of rows, on this project's AMD EPYC (AVX2); its sums
    differ from sgemm's in the last bits (within inference's tolerance parity). Elsewhere, or when the packed
    copies would exceed ``_PACKED_DECODE_BYTES``, the plain product (cuBLAS and the NPU's matmul pick their own
    kernel for the shape)."""
    packable = (all(w.device.type == "cpu" and w.dtype == torch.float32 for w in weights)
                and torch.backends.mkldnn.is_available()
                and sum(w.numel() * w.element_size() for w in weights) <= _PACKED_DECODE_BYTES)
    if not packable:
        return [functools.partial(_plain_linear, weight=w) for w in weights]
    return [functools.partial(_packed_linear, packed=torch.ops.mkldnn._reorder_linear_weight(w.detach(), rows))
            for w in weights]


def _plain_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.linear(x, weight)


def _packed_linear(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


def step_graphs(device: torch.device):
    """Captured graphs of a fixed-shape step where the device replays captured kernel launches (CUDA graphs):
    a decode step of a small model is a few hundred kernels of microseconds each, so the host issuing them one
    by one is what bounds it on a GPU, and a replay issues the whole step at once. ``None`` elsewhere: a CPU
    runs the kernels itself and has no launches to save; an NPU's graph capture (torch_npu's) is not wired
    here. Calling the result as ``graphs(fn, *tensors)`` runs ``fn(*tensors)``; see ``_CudaStepGraphs``."""
    return _CudaStepGraphs() if device.type == "cuda" else None


class _CudaStepGraphs:
    """One CUDA graph per shape of the inputs, captured at the first call with that shape and replayed after.

    ``fn`` must read nothing but its tensor arguments and buffers that outlive the graphs (a KV cache, the
    weights), issue no host synchronisation, and give the same result when run twice on the same inputs (a
    capture runs it twice first, on a side stream, to let lazy initialisation happen outside the graph; a decode
    step writing each row's new key at that row's position is such a function). Each call copies its inputs into
    the graph's own input buffers and returns the graph's output tensor, which the next call of the same shape
    overwrites."""

    def __init__(self):
        self._graphs: dict[tuple, tuple] = {}

    def __call__(self, fn, *inputs: torch.Tensor) -> torch.Tensor:
        key = tuple((t.shape, t.dtype) for t in inputs)
        if key not in self._graphs:
            self._graphs[key] = self._capture(fn, inputs)
        graph, buffers, output = self._graphs[key]
        for buffer, value in zip(buffers, inputs):
            buffer.copy_(value)
        graph.replay()
        return output

    @staticmethod
    def _capture(fn, inputs: tuple[torch.Tensor, ...]):
        buffers = [t.clone() for t in inputs]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn(*buffers)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            output = fn(*buffers)
        return graph, buffers, output


def applied_backend() -> str | None:
    """The backend whose ``apply()`` ran in this process (cpu means Megatron must initialise on the CPU)."""
    return next(iter(_applied), None)


def _apply(name: str) -> None:
    if name in _applied:
        return
    # Third-party noise, filtered here at the source (our own warnings stay): Megatron warns once per module that
    # it falls back to torch kernels, expected without TE/Apex; its TransformerConfig warns about its own default
    # cuda_graph_scope on every model; torch and Megatron deprecations are theirs to act on, not the user's.
    warnings.filterwarnings("ignore", message=r".*(Transformer Engine|Apex).* not installed", category=UserWarning)
    warnings.filterwarnings("ignore", message=r"full scope is deprecated", category=UserWarning)
    for category in (FutureWarning, DeprecationWarning):
        warnings.filterwarnings("ignore", category=category, module=r"(torch|megatron)(\.|$)")
    # Megatron-LM's launch scripts set this for tensor parallelism on GPUs; it is harmless elsewhere.
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    if name == "npu":
        import torch_npu  # noqa: F401
        from torch_npu.contrib import transfer_to_npu  # noqa: F401

        if importlib.util.find_spec("mindspeed") is not None:
            import mindspeed.megatron_adaptor  # noqa: F401
    elif name == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    from .megatron_import import import_megatron_core

    import_megatron_core()  # after the NPU's patches above, which must precede Megatron's first import
    if name == "cpu":
        _install_cpu_shim()  # patches Megatron's RNG tracker, so after the import
    _applied.add(name)


# ---------------------------------------------------------------- the CPU shim

_FACTORIES = ("zeros", "ones", "empty", "full", "tensor", "as_tensor", "arange", "rand", "randn", "randint",
              "randperm", "linspace", "eye", "zeros_like", "ones_like", "empty_like", "full_like", "empty_strided")

# Tensor methods that take a device (the MoE all-to-all allocates with ``new_empty(device=current_device())``).
_TENSOR_FACTORIES = ("new_empty", "new_zeros", "new_ones", "new_full", "new_tensor")


def _is_accelerator(device) -> bool:
    if isinstance(device, bool):
        return False
    if isinstance(device, int):
        return True  # an integer device means "cuda:<n>" to torch
    if isinstance(device, str):
        return device.split(":")[0] == "cuda"
    return isinstance(device, torch.device) and device.type == "cuda"


def _cpu_if_cuda(device):
    return "cpu" if _is_accelerator(device) else device


def _remap_device_kwarg(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = _cpu_if_cuda(kwargs["device"])
        return fn(*args, **kwargs)

    return wrapper


class _CpuEvent:
    def __init__(self, *args, **kwargs):
        pass

    def record(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True


class _CpuStream:
    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None) -> _CpuEvent:
        return event or _CpuEvent()

    def synchronize(self) -> None:
        pass


_CPU_STREAM = _CpuStream()


def _install_cpu_shim() -> None:
    """Make Megatron-core's CUDA calls land on the CPU (the idea of torch_npu's transfer_to_npu)."""
    for fname in _FACTORIES:
        setattr(torch, fname, _remap_device_kwarg(getattr(torch, fname)))
    for fname in _TENSOR_FACTORIES:
        setattr(torch.Tensor, fname, _remap_device_kwarg(getattr(torch.Tensor, fname)))

    tensor_to, tensor_type = torch.Tensor.to, torch.Tensor.type

    def to(self, *args, **kwargs):
        args = tuple(_cpu_if_cuda(a) if not isinstance(a, torch.dtype) else a for a in args)
        if "device" in kwargs:
            kwargs["device"] = _cpu_if_cuda(kwargs["device"])
        return tensor_to(self, *args, **kwargs)

    def cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
        return self

    def type_name(self, dtype=None, non_blocking=False, **kwargs):
        # Megatron's optimizers accept only 'torch.cuda.*Tensor' parameters; report CPU tensors that way.
        if dtype is None and not kwargs and self.device.type == "cpu":
            return tensor_type(self).replace("torch.", "torch.cuda.", 1)
        return tensor_type(self, dtype, non_blocking, **kwargs)

    torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.type = to, cuda, type_name

    # One "CUDA device" whose RNG is the CPU generator, so Megatron's RNG tracker forks the CPU state.
    cuda = torch.cuda
    cuda.current_device = lambda: 0
    cuda.device_count = lambda: 1
    cuda.synchronize = lambda device=None: None
    cuda.empty_cache = lambda: None
    cuda.get_rng_state = cuda.random.get_rng_state = lambda device="cuda": torch.get_rng_state()
    cuda.set_rng_state = cuda.random.set_rng_state = lambda state, device="cuda": torch.set_rng_state(state)
    # torch.manual_seed itself calls torch.cuda.manual_seed_all, so seed the generator directly.
    seed_cpu = lambda seed: torch.default_generator.manual_seed(int(seed))  # noqa: E731
    cuda.manual_seed = cuda.random.manual_seed = seed_cpu
    cuda.manual_seed_all = cuda.random.manual_seed_all = seed_cpu
    cuda.default_generators = (torch.default_generator,)
    # Streams and events (MoE token dispatchers overlap device-to-host copies on a side stream): on the CPU
    # everything is synchronous, so one stream object that waits on nothing and events that are always done.
    cuda.Stream = _CpuStream
    cuda.Event = _CpuEvent
    cuda.current_stream = lambda device=None: _CPU_STREAM
    cuda.stream = lambda stream=None: contextlib.nullcontext()
    # torch.cuda._lazy_call queues callbacks until CUDA initialises, which never happens here: run them now.
    cuda._lazy_call = lambda fn, **kwargs: fn()
    import megatron.core.tensor_parallel.random as mcore_random

    mcore_random._lazy_call = cuda._lazy_call
    _patch_megatron_moe()
    _allow_uneven_all_gather()


def _allow_uneven_all_gather() -> None:
    """gloo's all_gather needs equal shapes; megatron-core's MoE dispatcher (TP > 1) gathers unequal row counts
    (NCCL/HCCL take them). Pad to the longest, gather, and copy each rank's rows out: same result."""
    dist = torch.distributed
    all_gather = dist.all_gather

    def all_gather_uneven(tensor_list, tensor, group=None, async_op=False):
        if async_op or all(t.shape == tensor.shape for t in tensor_list):
            return all_gather(tensor_list, tensor, group=group, async_op=async_op)
        rows = max(t.shape[0] for t in tensor_list)
        padded = tensor.new_zeros((rows, *tensor.shape[1:]))
        padded[:tensor.shape[0]] = tensor
        gathered = [torch.empty_like(padded) for _ in tensor_list]
        all_gather(gathered, padded, group=group)
        for out, got in zip(tensor_list, gathered):
            out.copy_(got[:out.shape[0]])
        return None

    dist.all_gather = all_gather_uneven


def _patch_megatron_moe() -> None:
    """Two spots where megatron-core's MoE code assumes TransformerEngine or CUDA tensors."""
    import megatron.core.transformer.moe.moe_utils as moe_utils
    import megatron.core.transformer.moe.token_dispatcher as dispatcher

    # The router reads ``te_general_gemm`` unguarded; without TransformerEngine the name is never bound. None
    # selects its plain torch.mm path.
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    # The all-to-all dispatcher moves its split sizes to the host as numpy arrays, but converts only CUDA tensors;
    # CPU tensors would stay tensors, which all_to_all_single does not take as split sizes.
    to_host = dispatcher.maybe_move_tensor_to_cpu

    def maybe_move_tensor_to_cpu(tensor, as_numpy=False, record_stream=False):
        if as_numpy and torch.is_tensor(tensor) and tensor.device.type == "cpu":
            return tensor.numpy()
        return to_host(tensor, as_numpy=as_numpy, record_stream=record_stream)

    dispatcher.maybe_move_tensor_to_cpu = maybe_move_tensor_to_cpu
