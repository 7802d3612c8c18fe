"""Test helpers: a corpus of bad inputs and a few good images.

Note on permissions: the test suite may run as root, for whom chmod-000 files
are still readable, so no corpus entry relies on file permissions to be bad;
"permission denied" is not exercised here.

Decision on ``folder.png`` (a directory whose name has an image extension):
directory expansion treats it as a directory like any other -- it is descended
into and never becomes an item itself (so it is silently empty here);
passing it explicitly to ``load_image`` reports "is a directory".
"""

from __future__ import annotations

import os
import random
import struct
import zlib
from pathlib import Path

from PIL import Image


def _noise_png(path: Path, size: int = 32, seed: int = 0) -> None:
    rng = random.Random(seed)
    Image.frombytes("RGB", (size, size), rng.randbytes(size * size * 3)).save(path, format="PNG")


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _bomb_png(path: Path, width: int = 20000, height: int = 20000) -> None:
    """A tiny PNG whose header claims width*height pixels (> 2x PIL's limit)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit grayscale
    data = (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"IDAT", zlib.compress(b"\x00"))
        + _png_chunk(b"IEND", b"")
    )
    path.write_bytes(data)


def make_bad_corpus(root: Path) -> dict[str, str]:
    """Create bad inputs in ``root``; return ``{filename: expected reason substring}``.

    ``missing.png`` is not created (pass ``root / "missing.png"`` to exercise
    the missing-file path).  ``dangling.png`` is left out of the mapping when
    the filesystem cannot make symlinks.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    expected: dict[str, str] = {}

    expected["missing.png"] = "no such file or directory"

    (root / "empty.png").write_bytes(b"")
    expected["empty.png"] = "empty file (0 bytes)"

    full = root / "_full.tmp"
    _noise_png(full, 32, seed=1)
    data = full.read_bytes()
    full.unlink()
    (root / "truncated.png").write_bytes(data[: len(data) // 2])
    expected["truncated.png"] = "truncated or corrupt image"

    (root / "notes.jpg").write_text(
        "# meeting notes\nThese are not pixels.\nCaf\u00e9 \u2014 r\u00e9sum\u00e9\n", encoding="utf-8"
    )
    expected["notes.jpg"] = "not an image (text file?)"

    try:
        os.symlink(root / "does-not-exist.png", root / "dangling.png")
        expected["dangling.png"] = "broken symbolic link"
    except (OSError, NotImplementedError):
        pass

    (root / "folder.png").mkdir(exist_ok=True)
    expected["folder.png"] = "is a directory"

    (root / "garbage.png").write_bytes(random.Random(2).randbytes(512).replace(b"\x00", b"\x01") + b"\x00\xff")
    expected["garbage.png"] = "unsupported or unrecognized image format"

    _bomb_png(root / "bomb.png")
    # past twice PIL's own bound PIL refuses it itself: said in vlmspec's words, not PIL's
    # "could be decompression bomb DOS attack"
    expected["bomb.png"] = "image too large (400.0 M pixels, more than the 67.1 M vlmspec decodes"

    # decoded sizes out of proportion to the file, refused from the header (issue 40):
    # 178 bytes declaring a 100,000 x 1 strip (a processor scaling the short side up took
    # 2.66 GB), and 12,000 x 12,000 grey pixels (under PIL's own limit; 2.4 GB decoded)
    _bomb_png(root / "strip.png", 100_000, 1)
    expected["strip.png"] = "image out of proportion (100,000 x 1 pixels"
    _bomb_png(root / "grey-12k.png", 12_000, 12_000)
    expected["grey-12k.png"] = "image too large (12,000 x 12,000 pixels"

    return expected


def make_good_images(root: Path, n: int, size: int = 16, seed: int = 1234) -> list[Path]:
    """Write ``n`` valid small PNGs (seeded random colours) named img_000.png..."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    paths: list[Path] = []
    for i in range(n):
        colour = tuple(rng.randrange(256) for _ in range(3))
        im = Image.new("RGB", (size, size), colour)
        # a second random block so images differ beyond a flat colour
        block = Image.new("RGB", (size // 2, size // 2), tuple(rng.randrange(256) for _ in range(3)))
        im.paste(block, (rng.randrange(size // 2), rng.randrange(size // 2)))
        p = root / f"img_{i:03d}.png"
        im.save(p, format="PNG")
        paths.append(p)
    return paths


# --------------------------------------------------------------------------- outputs
def vlmspec_record(inp: str, **fields) -> dict:
    """A minimal vlmspec result record as a sink writes it (``input`` first)."""
    return {"input": inp, "task": "caption", "prompt": "describe the image.",
            "source": f"/nowhere/{inp}", "settings": {"target": "zoo:x", "max_new_tokens": 4},
            "output": "a red circle", "error": None, **fields}


def torn_jsonl_bytes() -> tuple[bytes, bytes]:
    """(complete records, torn tail): a vlmspec JSONL cut mid-record by a crash."""
    import json

    good = "".join(json.dumps(vlmspec_record(n)) + "\n" for n in ("a.png", "b.png")).encode()
    return good, json.dumps(vlmspec_record("c.png")).encode()[:40]


def make_bad_outputs(root: Path) -> dict[str, tuple[Path, str]]:
    """Existing files an ``--out`` (or ``--trace``) may name, in ``root``:
    ``{case: (path, expected message substring)}``. Every case but ``link-to-torn``
    must be refused, untouched, before any model loads; ``link-to-torn`` (a symbolic link
    to a vlmspec JSONL with a torn last record) is repaired through the link."""
    import json

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    cases: dict[str, tuple[Path, str]] = {}

    def add(name: str, data: bytes, why: str) -> None:
        (root / name).write_bytes(data)
        cases[name] = (root / name, why)

    png = root / "_img.png"
    _noise_png(png, 16, seed=3)
    add("image.png", png.read_bytes(), "line 1 is not JSON")
    png.unlink()
    add("notes.txt", b"# shopping\neggs\nmilk\n", "line 1 is not JSON")
    add("notes-no-final-newline.txt", b"# shopping\neggs\nmilk", "line 1 is not JSON")
    add("one-line.txt", b"just one unterminated line", "line 1 is not JSON")
    rec = json.dumps(vlmspec_record("a.png")).encode()
    add("foreign-middle.jsonl", rec + b"\nmy own note\n" + rec + b"\n", "line 2 is not JSON")
    add("other-objects.jsonl", b'{"id": 1, "text": "x"}\n{"id": 2, "text": "y"}\n',
        "line 1 is a JSON object without 'task' and 'input'")
    add("array.jsonl", b"[1, 2, 3]\n", "line 1 is not a JSON object")
    add("pretty.json", b'{\n  "task": "caption",\n  "input": "a.png"\n}\n', "line 1 is not JSON")
    add("unterminated-object.json", b'{"name": "not a record"', "line 1 is not JSON")
    add("blank-lines.txt", b"\n\n  \n", "only blank lines")
    # JSON nested past json.loads' recursion limit (a first, a middle or a torn last line)
    # or just past what a record nests: not vlmspec's, and no torn record of its either
    deep = b"[" * 100_000 + b"]" * 100_000
    deep_record = b'{"task": "caption", "input": "d.png", "x": ' + deep + b"}"
    add("deep-first-line.jsonl", deep_record + b"\n" + rec + b"\n", "line 1 is JSON nested")
    add("deep-array-first-line.jsonl", deep + b"\n", "line 1 is JSON nested")
    add("deep-middle-line.jsonl", rec + b"\n" + deep_record + b"\n" + rec + b"\n",
        "line 2 is JSON nested")
    add("deep-torn-last-line.jsonl", rec + b"\n" + deep_record[:150_000], "line 2 is JSON nested")
    add("nested-100-levels.jsonl", rec + b"\n" + rec[:-1] + b', "x": ' + b"[" * 100 + b"]" * 100
        + b"}\n", "line 2 is JSON nested more than 64 levels deep")
    # a crash never leaves a broken line that ends in a newline (one write puts both)
    add("broken-last-line.jsonl", rec + b"\n" + rec[:40] + b"\n", "line 2 is not JSON")
    add("zeros-only.jsonl", b"\0" * 4096, "line 1 is not JSON")  # zeros and no record
    (root / "folder.jsonl").mkdir(exist_ok=True)
    cases["folder.jsonl"] = (root / "folder.jsonl", "directory")

    good, torn = torn_jsonl_bytes()
    real = root / "real" / "torn.jsonl"
    real.parent.mkdir(exist_ok=True)
    real.write_bytes(good + torn)
    try:
        os.symlink(real, root / "link-to-torn.jsonl")
        cases["link-to-torn.jsonl"] = (root / "link-to-torn.jsonl", "dropped a torn last record")
    except (OSError, NotImplementedError):
        pass
    return cases


# ------------------------------------------------------------------ bad model directories
def make_pickle_only_model(root: Path, zoo: str = "tinyworld/llava-draft") -> Path:
    """A copy of a zoo model directory whose weights are a pickle (``pytorch_model.bin``,
    torch.save of the same state dict) instead of ``model.safetensors``: a model vlmspec
    must refuse without unpickling it."""
    import shutil

    import torch
    from safetensors.torch import load_file

    from vlmspec_cli.runtime.models.loading import resolve_model_source

    source = Path(resolve_model_source(f"zoo:{zoo}"))
    root = Path(root)
    shutil.copytree(source, root, ignore=shutil.ignore_patterns("*.safetensors", "*.md", "*.json.*"),
                    dirs_exist_ok=True)
    torch.save(load_file(source / "model.safetensors"), root / "pytorch_model.bin")
    return root


def make_broken_model_dir(root: Path) -> Path:
    """A directory that claims to be a model (config.json) but whose config is not one:
    loading it fails at once, so a test can tell whether a load was attempted."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text('{"model_type": "no-such-model-type"}\n', encoding="utf-8")
    return root


def _model_copy(root: Path, zoo: str = "tinyworld/llava-draft") -> Path:
    import shutil

    from vlmspec_cli.runtime.models.loading import resolve_model_source

    source = Path(resolve_model_source(f"zoo:{zoo}"))
    root = Path(root)
    shutil.copytree(source, root, ignore=shutil.ignore_patterns("*.md", "*.json.*"),
                    dirs_exist_ok=True)
    return root


def _header(data: bytes) -> tuple[int, dict]:
    import json

    (n,) = struct.unpack("<Q", data[:8])
    return n, json.loads(data[8:8 + n])


def _with_header(data: bytes, header: dict) -> bytes:
    """The file with ``header`` in place of its own, padded with spaces to the same length
    (so the data offsets stay where they were)."""
    import json

    n, _ = _header(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    assert len(raw) <= n
    return data[:8] + raw.ljust(n) + data[8 + n:]


def _bad_offsets(data: bytes) -> bytes:
    n, header = _header(data)
    name = next(k for k in header if k != "__metadata__")
    header[name]["data_offsets"] = [0, len(data) * 4]
    return _with_header(data, header)


# what each corrupt weights file is, and a part of the reason vlmspec gives
CORRUPT_WEIGHTS = {
    "header-length-2**63": (lambda d: struct.pack("<Q", 2 ** 63) + d[8:], "more than the"),
    "header-past-end": (lambda d: struct.pack("<Q", len(d)) + d[8:], "past the end of the file"),
    "header-not-json": (lambda d: d[:8] + b"\xff" * _header(d)[0] + d[8 + _header(d)[0]:],
                        "header is not JSON"),
    "bad-offsets": (_bad_offsets, "outside the"),
    "truncated": (lambda d: d[:len(d) // 2], "outside the"),
    "empty": (lambda d: b"", "empty file (0 bytes)"),
    "seven-bytes": (lambda d: d[:7], "truncated (7 bytes"),
}
# config.json edits that no model's weights fit, and a part of the reason
CORRUPT_CONFIGS = {
    "nested-100k": (None, "nested too deeply"),
    "vocab_size-2**31": ({"vocab_size": 2 ** 31}, "vocab_size is 2,147,483,648"),
    "million-layers": ({"num_hidden_layers": 10 ** 6}, "num_hidden_layers is 1,000,000"),
}


def make_corrupt_model(root: Path, case: str, zoo: str = "tinyworld/llava-draft") -> Path:
    """A copy of a zoo model whose model.safetensors (a CORRUPT_WEIGHTS case, or
    "link-to-text": a symbolic link to a text file) or config.json (a CORRUPT_CONFIGS
    case: its text_config's sizes, or JSON nested 100,000 deep) is corrupt."""
    import json

    root = _model_copy(root, zoo)
    weights, config = root / "model.safetensors", root / "config.json"
    if case in CORRUPT_WEIGHTS:
        weights.write_bytes(CORRUPT_WEIGHTS[case][0](weights.read_bytes()))
    elif case == "link-to-text":
        weights.unlink()
        write_user_notes(root / "notes.txt")
        os.symlink(root / "notes.txt", weights)
    elif case == "nested-100k":
        config.write_text("[" * 100_000 + "]" * 100_000)
    else:
        data = json.loads(config.read_text())
        section = data.get("text_config", data)
        section.update(CORRUPT_CONFIGS[case][0])
        config.write_text(json.dumps(data))
    return root


# ------------------------------------------------- files that are not vlmspec's to overwrite
def write_user_notes(path: Path) -> bytes:
    """A user's text file (not YAML mapping, not PNG, not JSON) at an output path; returns
    its bytes so a test can check it was left alone."""
    data = "my notes\nthese are not vlmspec's: keep them\n".encode("utf-8")
    Path(path).write_bytes(data)
    return data


def write_foreign_yaml(path: Path) -> bytes:
    """A YAML mapping that is not a vlmspec profile (a CI config) at an output path."""
    data = b"services:\n  web:\n    image: nginx\n    ports: ['80:80']\n"
    Path(path).write_bytes(data)
    return data


def write_foreign_json(path: Path) -> bytes:
    """A JSON object that is not a vlmspec recipe state file (e.g. package.json)."""
    data = b'{"name": "my-app", "version": "1.0.0", "steps": ["build", "test"]}\n'
    Path(path).write_bytes(data)
    return data


# ------------------------------------------------------------------ input limits
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
JPEG_SIGNATURE = b"\xff\xd8\xff\xe0"
GIB = 1024 ** 3


def make_sparse_file(path: Path, size: int = 2 * GIB, head: bytes = PNG_SIGNATURE) -> Path:
    """``head`` then zeros up to ``size`` bytes, as a sparse file: it takes no disk space,
    but a loader that reads it whole reads (and holds) ``size`` bytes."""
    path = Path(path)
    with open(path, "wb") as fh:
        fh.write(head)
        fh.truncate(size)
    return path


def make_huge_png(root: Path, name: str = "huge.png") -> Path:
    """A 2 GiB sparse file that starts like a PNG (far past any sane image file size)."""
    return make_sparse_file(Path(root) / name, 2 * GIB, PNG_SIGNATURE)


def make_garbage_after_signature(root: Path, name: str = "fake.jpg", size: int = 64 * 1024 ** 2,
                                 head: bytes = JPEG_SIGNATURE) -> Path:
    """A sparse file under the image size cap whose signature is an image's and whose
    rest is zeros (PIL scans such a JPEG / GIF byte by byte to its end)."""
    return make_sparse_file(Path(root) / name, size, head)


def long_prompt(chars: int = 20_000) -> str:
    """A prompt far longer than the tinyworld models' context (1,024 / 256 positions)."""
    words = "what colour is the circle and where is the square "
    return (words * (chars // len(words) + 1))[:chars]


NEWLINE_NAME = "two\nlines\tand a tab\\slash.png"


def make_newline_named_image(root: Path, size: int = 16) -> Path:
    """A valid PNG whose name holds a newline, a tab and a backslash (legal on POSIX)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    path = root / NEWLINE_NAME
    Image.new("RGB", (size, size), (200, 30, 30)).save(path, format="PNG")
    return path


def make_long_video(path: Path, frames: int = 300, fps: int = 30, size: int = 16) -> Path:
    """A clip of ``frames`` tiny frames (10 s at 30 fps by default; fast to write): --fps 30
    samples every frame, more than the default video.max_frames 256. Use .mp4: Matroska
    keeps millisecond timestamps, so --fps 30 there samples only 2 frames in 3."""
    from videofiles import moving_square_frames, write_video

    return write_video(Path(path), moving_square_frames(frames, size=size, square=4), fps=fps)


def make_long_chat(path: Path, image: Path, chars: int = 20_000) -> Path:
    """Two conversations about ``image``: one with a turn far past the context, one short."""
    import json

    lines = [{"id": "long", "messages": [{"role": "user", "text": long_prompt(chars),
                                          "images": [str(image)]}]},
             {"id": "short", "messages": [{"role": "user", "text": "what colour is it?",
                                           "images": [str(image)]}]}]
    Path(path).write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return Path(path)


# ------------------------------------------------------------------ hostile profiles
DEEP = 100_000   # nesting levels: far past Python's recursion limit


def billion_laughs(key: str = "generation", leaf: str = "prompt", levels: int = 9) -> str:
    """A YAML mapping whose aliases expand ``key.leaf`` to 9**levels strings ("lol"),
    in well under a kilobyte."""
    names = [f"l{i}" for i in range(levels)]
    lines = [f"{names[0]}: &{names[0]} [" + ", ".join(['"lol"'] * 9) + "]"]
    for prev, name in zip(names, names[1:]):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    lines.append(f"{key}: {{{leaf}: *{names[-1]}}}")
    return "\n".join(lines) + "\n"


def make_bad_profiles(root: Path) -> dict[str, tuple[Path, Path, str]]:
    """Profile files that must each be refused in one line naming the file and the
    reason (exit 2), without a traceback, a hang or unbounded memory:
    ``{case: (path to load, file the message names, expected reason substring)}`` (the
    two paths differ where a profile includes the bad file)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    cases: dict[str, tuple[Path, Path, str]] = {}

    def add(name: str, data: bytes, why: str) -> None:
        (root / name).write_bytes(data)
        cases[name] = (root / name, root / name, why)

    png = root / "_img.png"
    _noise_png(png, 16, seed=4)
    add("image.png", png.read_bytes(), "not UTF-8 text")
    png.unlink()
    add("latin1.yaml", "description: caf\u00e9 cr\u00e8me\n".encode("latin-1"), "not UTF-8 text")
    add("deep-flow-lists.yaml", b"description: " + b"[" * DEEP + b"]" * DEEP + b"\n",
        "nested more than 64 levels deep")
    add("deep-flow-maps.yaml", b"description: " + b"{a: " * DEEP + b"1" + b"}" * DEEP + b"\n",
        "nested more than 64 levels deep")
    add("deep-block-lists.yaml", b"hardware:\n  measurements:\n    " + b"- " * DEEP + b"x\n",
        "nested more than 64 levels deep")
    add("deep-block-maps.yaml", "".join("  " * i + f"k{i}:\n" for i in range(200)).encode(),
        "nested more than 64 levels deep")
    add("billion-laughs.yaml", billion_laughs().encode(), "aliases expand it past")
    add("huge.yaml", b"# " + b"x" * (2 * 1024 ** 2) + b"\nname: huge\n", "over the 1.0 MiB")
    (root / "includer.yaml").write_bytes(b"include: latin1.yaml\nname: x\n")
    cases["includer.yaml"] = (root / "includer.yaml", root / "latin1.yaml", "not UTF-8 text")
    add("duplicate-key.yaml", b"method: tree\nname: x\nmethod: chain\n",
        "duplicate key 'method' (first on line 1)")
    # a file that is no profile, included: refused without echoing its text (a secret)
    (root / "passwd").write_bytes(b"root:$6$secret-hash:20228:0:99999:7::\n")
    (root / "includes-passwd.yaml").write_bytes(b"include: passwd\nname: x\n")
    cases["includes-passwd.yaml"] = (root / "includes-passwd.yaml", root / "passwd",
                                     "unknown key, not shown: it is no key name")
    return cases
