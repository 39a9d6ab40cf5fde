"""A minimal safetensors writer and reader on numpy, bf16 included.

numpy has no bfloat16, and the ``safetensors`` package writes bf16 only from torch; the GPU
machine converts with numpy alone, so the format (an 8-byte little-endian header length, a JSON
header, the raw little-endian bytes) is written here. What is written loads with
``safetensors.safe_open`` and in SGLang; ``read`` checks every header entry against the file.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from patcher.errors import ModelInvalid, ModelMissing

# safetensors dtype -> (numpy dtype of the stored bytes, bytes per element); BF16 is stored as uint16
DTYPES: dict[str, tuple[str, int]] = {
    "BF16": ("<u2", 2),
    "F16": ("<f2", 2),
    "F32": ("<f4", 4),
    "I64": ("<i8", 8),
    "BOOL": ("|b1", 1),
}
MAX_HEADER = 100 * 1024 * 1024


def to_bf16(array: npt.NDArray[Any]) -> npt.NDArray[np.uint16]:
    """float32 -> bf16 bits, rounded to nearest even (as torch's .to(torch.bfloat16) does)."""
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    out = (rounded >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(array)
    if nan.any():
        out[nan] = 0x7FC0
    return out


def from_bf16(bits: npt.NDArray[np.uint16]) -> npt.NDArray[np.float32]:
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def _stored(array: npt.NDArray[Any], dtype: str) -> npt.NDArray[Any]:
    if dtype == "BF16":
        return to_bf16(array)
    return np.ascontiguousarray(array, dtype=np.dtype(DTYPES[dtype][0]))


def write(
    path: Path, tensors: Mapping[str, tuple[npt.NDArray[Any], str]], metadata: Mapping[str, str] | None = None
) -> None:
    """Write ``{name: (array, safetensors dtype)}``; names in sorted order, as the reference writer does."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt", **(metadata or {})}}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        array, dtype = tensors[name]
        data = _stored(array, dtype).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for data in blobs:
            f.write(data)
    tmp.replace(path)


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """The header (without ``__metadata__``) and where the data starts. Raises ModelMissing / ModelInvalid."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ModelInvalid(f"{path}: not a safetensors file ({size} bytes)")
            (length,) = struct.unpack("<Q", head)
            if length > min(MAX_HEADER, size - 8):
                raise ModelInvalid(f"{path}: not a safetensors file (header length {length} of a {size}-byte file)")
            header = json.loads(f.read(length))
    except FileNotFoundError as error:
        raise ModelMissing(f"{path}: no such file") from error
    except OSError as error:
        raise ModelMissing(f"{path}: cannot read it ({error.strerror or error})") from error
    except (ValueError, UnicodeDecodeError) as error:
        raise ModelInvalid(f"{path}: damaged safetensors header ({error})") from error
    if not isinstance(header, dict):
        raise ModelInvalid(f"{path}: damaged safetensors header (not an object)")
    header.pop("__metadata__", None)
    start = 8 + length
    end = 0
    for name, entry in header.items():
        try:
            dtype, shape, (lo, hi) = entry["dtype"], entry["shape"], entry["data_offsets"]
            need = int(np.prod(shape, dtype=np.int64)) * DTYPES[dtype][1]
        except (KeyError, TypeError, ValueError) as error:
            raise ModelInvalid(f"{path}: damaged header entry for {name} ({error!r})") from error
        if hi - lo != need or lo < 0 or start + hi > size:
            raise ModelInvalid(
                f"{path}: {name} needs {need} bytes at [{lo}, {hi}) of a {size - start}-byte data section"
            )
        end = max(end, hi)
    if start + end != size:
        raise ModelInvalid(f"{path}: {size - start - end} bytes after the last tensor (damaged or truncated)")
    return header, start


def read(path: Path) -> dict[str, npt.NDArray[Any]]:
    """Every tensor as numpy (BF16 widened to float32)."""
    header, start = read_header(path)
    out: dict[str, npt.NDArray[Any]] = {}
    with path.open("rb") as f:
        for name, entry in header.items():
            lo, hi = entry["data_offsets"]
            f.seek(start + lo)
            array = np.frombuffer(f.read(hi - lo), dtype=np.dtype(DTYPES[entry["dtype"]][0])).reshape(entry["shape"])
            out[name] = from_bf16(array) if entry["dtype"] == "BF16" else array
    return out
