"""The one table of the element types a checkpoint can hold, under every name the converter meets them by.

The converter moves tensors as numpy arrays and never imports torch (importing it costs more CPU than copying a
gigabyte). bfloat16 is ``ml_dtypes.bfloat16``, a real numpy dtype whose casts round exactly as torch's do.
"""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np


@dataclass(frozen=True)
class DType:
    numpy: np.dtype
    safetensors: str  # the header's "dtype"
    torch: str  # the attribute of the torch module: torch.<torch>
    storage: str  # the legacy typed-storage class torch.save pickles: torch.<storage>


_TABLE = (
    DType(np.dtype(np.float64), "F64", "float64", "DoubleStorage"),
    DType(np.dtype(np.float32), "F32", "float32", "FloatStorage"),
    DType(np.dtype(np.float16), "F16", "float16", "HalfStorage"),
    DType(np.dtype(ml_dtypes.bfloat16), "BF16", "bfloat16", "BFloat16Storage"),
    DType(np.dtype(np.int64), "I64", "int64", "LongStorage"),
    DType(np.dtype(np.int32), "I32", "int32", "IntStorage"),
    DType(np.dtype(np.int16), "I16", "int16", "ShortStorage"),
    DType(np.dtype(np.int8), "I8", "int8", "CharStorage"),
    DType(np.dtype(np.uint8), "U8", "uint8", "ByteStorage"),
    DType(np.dtype(np.bool_), "BOOL", "bool", "BoolStorage"),
)
BY_NUMPY = {d.numpy: d for d in _TABLE}
BY_SAFETENSORS = {d.safetensors: d for d in _TABLE}
BY_STORAGE = {d.storage: d for d in _TABLE}
BY_TORCH = {d.torch: d for d in _TABLE}
# torch.float / torch.half / ... are the same objects as torch.float32 / torch.float16 and pickle by either name.
BY_TORCH.update(float=BY_TORCH["float32"], double=BY_TORCH["float64"], half=BY_TORCH["float16"],
                long=BY_TORCH["int64"], int=BY_TORCH["int32"], short=BY_TORCH["int16"])
# ConvertConfig.paramsDtype (--params-dtype)
BY_CONFIG_NAME = {"fp32": BY_TORCH["float32"], "fp16": BY_TORCH["float16"], "bf16": BY_TORCH["bfloat16"]}
BFLOAT16, FLOAT16 = BY_TORCH["bfloat16"].numpy, BY_TORCH["float16"].numpy


def describe(dtype: np.dtype) -> DType:
    return BY_NUMPY[np.dtype(dtype)]


def from_config_name(name: str | None) -> np.dtype | None:
    return BY_CONFIG_NAME[name].numpy if name else None
