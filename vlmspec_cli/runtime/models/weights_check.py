"""A model folder's files checked before transformers reads them: safetensors headers,
config.json, and the config's sizes against the weights' shapes.

transformers trusts both files. A ``model.safetensors`` whose 8-byte header length says
2**63, whose header runs past the end of the file or is not JSON, whose offsets point
outside the file, or that is empty, truncated or a link to a text file ends in a
SafetensorError traceback; a ``config.json`` nested 100,000 deep in a RecursionError; a
config declaring ``vocab_size`` 2**31 in a size-mismatch RuntimeError after the model is
built, and one declaring a million layers builds for minutes before any check. Here each
header is read bounded (8 bytes, then at most ``MAX_HEADER_BYTES``) and checked, the JSON
files are parsed bounded, and the config's layer counts and embedding sizes are compared
with the tensor shapes the headers declare, so each case is one ``ModelLoadError`` line
before anything is built. No click, rich or transformers.
"""

from __future__ import annotations

import json
import os
import re
import stat
import struct
from pathlib import Path

MAX_HEADER_BYTES = 100_000_000     # safetensors' own limit on a header
MAX_JSON_BYTES = 64 * 1024 ** 2    # config.json, model.safetensors.index.json
# bytes per element of the safetensors dtypes (a dtype not listed skips the size check)
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
               "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4,
               "I64": 8, "U64": 8, "F64": 8}
LAYER_KEYS = ("num_hidden_layers", "depth", "num_layers")
SIZE_KEYS = ("vocab_size", "hidden_size")   # never quantized away: the embedding has both

Shapes = dict[str, tuple[str, list[int]]]


class CorruptModelFile(Exception):
    """``str()``: ``"<path>: <reason>"``; ``kind``: what the file is ("safetensors file",
    "config.json" ...)."""

    def __init__(self, kind: str, path: str | os.PathLike, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.kind = kind


def _regular_size(path: Path, kind: str) -> int:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise CorruptModelFile(kind, path, "no such file (a broken link?)") from None
    except OSError as exc:
        raise CorruptModelFile(kind, path, f"cannot read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise CorruptModelFile(kind, path, "not a regular file")
    return st.st_size


def _entry_problem(name: str, entry, data_bytes: int) -> str | None:
    if not isinstance(entry, dict):
        return f"tensor {name!r}: not a JSON object"
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str):
        return f"tensor {name!r}: no dtype"
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
        return f"tensor {name!r}: shape {shape!r} is not a list of sizes"
    if not (isinstance(offsets, list) and len(offsets) == 2
            and all(type(o) is int for o in offsets)):
        return f"tensor {name!r}: data_offsets {offsets!r} is not [begin, end]"
    begin, end = offsets
    if not 0 <= begin <= end <= data_bytes:
        return (f"tensor {name!r}: data_offsets [{begin}, {end}] are outside the "
                f"{data_bytes:,} bytes of data in the file")
    count = 1
    for d in shape:
        count *= d
    if dtype in DTYPE_BYTES and count * DTYPE_BYTES[dtype] != end - begin:
        return (f"tensor {name!r}: shape {shape} of {dtype} is {count * DTYPE_BYTES[dtype]:,} "
                f"bytes, its data_offsets hold {end - begin:,}")
    return None


def safetensors_shapes(path: str | os.PathLike) -> Shapes:
    """Each tensor's (dtype, shape) from the header of a safetensors file, read bounded and
    checked (length, JSON, entries, offsets within the file); CorruptModelFile otherwise."""
    path, kind = Path(path), "safetensors file"
    size = _regular_size(path, kind)
    if size == 0:
        raise CorruptModelFile(kind, path, "empty file (0 bytes)")
    if size < 8:
        raise CorruptModelFile(kind, path, f"truncated ({size} bytes, fewer than the 8 of "
                                           "its header length)")
    with open(path, "rb") as fh:
        (length,) = struct.unpack("<Q", fh.read(8))
        if length > MAX_HEADER_BYTES:
            raise CorruptModelFile(kind, path, f"declares a header of {length:,} bytes, more "
                                               f"than the {MAX_HEADER_BYTES:,} safetensors allows")
        if 8 + length > size:
            raise CorruptModelFile(kind, path, f"declares a header of {length:,} bytes, past "
                                               f"the end of the file ({size:,} bytes): truncated?")
        raw = fh.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:120]
        raise CorruptModelFile(kind, path, f"header is not JSON ({reason})") from None
    if not isinstance(header, dict):
        raise CorruptModelFile(kind, path, "header is not a JSON object")
    data_bytes = size - 8 - length
    shapes: Shapes = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        problem = _entry_problem(name, entry, data_bytes)
        if problem:
            raise CorruptModelFile(kind, path, problem)
        shapes[name] = (entry["dtype"], entry["shape"])
    return shapes


def read_json(path: str | os.PathLike, kind: str):
    """A model folder's JSON file, read bounded (size, nesting); CorruptModelFile otherwise."""
    path = Path(path)
    size = _regular_size(path, kind)
    if size > MAX_JSON_BYTES:
        raise CorruptModelFile(kind, path, f"is {size:,} bytes, more than the "
                                           f"{MAX_JSON_BYTES:,} a model's JSON file may be")
    try:
        with open(path, "rb") as fh:
            return json.loads(fh.read().decode("utf-8-sig"))
    except RecursionError:
        raise CorruptModelFile(kind, path, "not valid JSON (nested too deeply)") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise CorruptModelFile(kind, path, f"not valid JSON ({str(exc)[:120]})") from None
    except OSError as exc:
        raise CorruptModelFile(kind, path, f"cannot read ({exc.strerror or exc})") from None


def folder_shapes(folder: str | os.PathLike) -> Shapes:
    """The tensors of every safetensors file of a model folder (the shards an index names
    and any other ``*.safetensors``), each header checked."""
    folder = Path(folder)
    files = set(folder.glob("*.safetensors"))
    for index in folder.glob("*.safetensors.index.json"):
        weight_map = read_json(index, "safetensors index")
        weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
        if not isinstance(weight_map, dict):
            raise CorruptModelFile("safetensors index", index, "has no weight_map object")
        files |= {folder / str(name) for name in set(weight_map.values())}
    shapes: Shapes = {}
    for path in sorted(files):
        shapes.update(safetensors_shapes(path))
    return shapes


def _stacks(shapes: Shapes) -> int:
    """The most layers one numbered stack holds (``...layers.<i>.``), 0 when none."""
    groups: dict[str, set[int]] = {}
    for name in shapes:
        m = re.match(r"(.*?)\.(\d+)(?:\.|$)", name)
        if m:
            groups.setdefault(m.group(1), set()).add(int(m.group(2)))
    return max((len(g) for g in groups.values()), default=0)


def config_problem(config: dict, shapes: Shapes) -> str | None:
    """Why ``config`` cannot describe these weights, or None: a layer count larger than any
    stack of layers they hold (transformers would build every layer first), or a
    ``vocab_size`` / ``hidden_size`` no tensor has (a size mismatch once built)."""
    if not shapes:
        return None
    sections = [("", config)] + [(f"{k}.", v) for k, v in config.items() if isinstance(v, dict)]
    stacks = _stacks(shapes)
    for where, section in sections:
        for key in LAYER_KEYS:
            value = section.get(key)
            if stacks and type(value) is int and value > stacks:
                return (f"{where}{key} is {value:,}, but the weights hold at most {stacks:,} "
                        "layers in a stack")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    dims = {d for _, shape in shapes.values() for d in shape}
    for key in SIZE_KEYS:
        value = text.get(key, config.get(key))
        if type(value) is int and value not in dims:
            return (f"{key} is {value:,}, a size no tensor in the weights has "
                    f"(largest: {max(dims, default=0):,})")
    return None


__all__ = ["CorruptModelFile", "MAX_HEADER_BYTES", "config_problem", "folder_shapes",
           "read_json", "safetensors_shapes"]
