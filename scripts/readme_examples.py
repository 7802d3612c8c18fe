"""Run the examples of the README and of every docs/ page as written, in order, each page
from a fresh copy of the repository.

    python scripts/readme_examples.py                 # every example that runs offline on a CPU
    python scripts/readme_examples.py --list          # what would run, what is skipped and why
    python scripts/readme_examples.py --only 'generate-image|describe-video'
    python scripts/readme_examples.py --page docs/own-models.md   # one page's examples
    python scripts/readme_examples.py --all           # the slow ones too (profile --compile)

The pages are README.md, then docs/*.md in the site's order (mkdocs.yml's nav). Each
```bash block's lines (continuations joined) and each ```python block run with
``bash -o pipefail`` / ``python`` in a copy of the repository's tracked files, one after
the other in page order, so a later example sees what an earlier one wrote (the image
examples' files, `calibrate --write tuned` for `--profile tuned`, docs/own-models.md's
my-models/ for docs/methods.md's EAGLE-3 head), as a reader following the pages would.
The README runs in a fresh copy of its own: its quick start repeats commands the pages
show, `--write` included. What it provides first:

- ``vlmspec`` and ``python`` on PATH: this interpreter, with the copy on PYTHONPATH;
- the inputs the README names as your own files, made from examples/ (``photo.png``,
  ``photo.jpg``, ``img.png``, ``shots/``, ``photos/``, ``clip.mp4``, ``clip.webm``,
  ``clips/``, ``frames_dir/``, ``conversations.jsonl``): FIXTURES lists them;
- bounded tokens: the shipped tinyworld profiles copied with ``generation.max_new_tokens``
  lowered (``--max-new-tokens``, default 16) into a folder put first on
  ``$VLMSPEC_PROFILES``; the commands stay as written.

Examples that need the hub, a GPU, another install or a running cluster are skipped with
the reason (SKIP); ``--all`` adds the slow ones (SLOW). Exit 1 when an example that ran
exited non-zero. tests/test_readme_examples.py checks, in the suite, that every example is
found and parses; this script is the full run (its last recorded run: bench/history/RESULTS-until-2026-12-07.md,
"The README's examples, run as written", and bench/runs/2026-11-26/readme-examples-cpu.txt).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (pattern on the example's text, why it does not run here)
SKIP = [
    (r"^python3 -m venv", "installs into a new virtual environment (the script uses this one)"),
    (r"^git clone", "downloads a data set"),
    (r"MMSpec/dataset", "the real MMSpec split (after git clone) on a 7B hub model"),
    (r"llava-hf/|JackFram/|Qwen/|--profile (llava-next-7b|qwen25-vl-7b)", "downloads 7B models from the hub"),
    (r"^vllm serve", "needs vLLM (and a GPU): not a vlmspec dependency"),
    (r"--ray-address auto", "needs a running Ray cluster"),
    (r"^bash bench/gpu\.sh", "needs a CUDA GPU"),
]
SLOW = [
    (r"profile --compile", "compiles every step with torch.compile (minutes on a CPU)"),
]

FIXTURES = ("photo.png", "photo.jpg", "img.png", "shots/", "photos/", "imgs/", "clip.mp4",
            "clip.webm", "clip.mkv", "clips/", "frames_dir/", "conversations.jsonl")


@dataclass
class Example:
    line: int          # the page's line where the example starts
    kind: str          # "bash" or "python"
    text: str
    skip: str = ""     # why it does not run ("" = it runs)
    page: str = "README.md"   # the page, relative to the repository's root

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages(root: Path = ROOT) -> list[Path]:
    """README.md, then the docs site's pages in its nav order (mkdocs.yml), then any page
    of docs/ the nav leaves out."""
    import yaml

    nav: list[str] = []

    def walk(entries) -> None:
        for entry in entries or []:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            if isinstance(value, list):
                walk(value)
            elif isinstance(value, str) and value.endswith(".md"):
                nav.append(value)

    config = root / "mkdocs.yml"
    if config.is_file():
        walk((yaml.safe_load(config.read_text(encoding="utf-8")) or {}).get("nav"))
    docs = root / "docs"
    listed = [docs / name for name in nav if (docs / name).is_file()]
    rest = sorted(p for p in docs.glob("**/*.md") if p not in listed) if docs.is_dir() else []
    return [root / "README.md", *listed, *rest]


def extract_all(root: Path = ROOT, run_slow: bool = False) -> list[Example]:
    """Every page's examples (pages()), page after page."""
    return [ex for page in pages(root) for ex in extract(page, run_slow)]


def extract(readme: Path = ROOT / "README.md", run_slow: bool = False) -> list[Example]:
    """One page's examples in order: each command of a ```bash block (a line, with its
    backslash continuations), each ```python block whole."""
    page = readme.resolve().relative_to(ROOT).as_posix() if readme.resolve().is_relative_to(ROOT) \
        else readme.name
    lines = readme.read_text(encoding="utf-8").splitlines()
    out: list[Example] = []
    i = 0
    while i < len(lines):
        fence = re.match(r"```(bash|sh|python)\s*$", lines[i])
        i += 1
        if not fence:
            continue
        start, body = i, []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1
        if fence.group(1) == "python":
            out.append(Example(start + 1, "python", "\n".join(body) + "\n", page=page))
            continue
        j = 0
        while j < len(body):
            first, text = j, body[j]
            while text.endswith("\\") and j + 1 < len(body):
                j += 1
                text = text[:-1].rstrip() + " " + body[j].strip()
            heredoc = re.search(r"<<-?\s*'?(\w+)'?\s*$", text)
            while heredoc and j + 1 < len(body):   # cat > FILE <<'EOF' ... EOF: one example
                j += 1
                text += "\n" + body[j]
                if body[j].strip() == heredoc.group(1):
                    break
            j += 1
            if text.strip() and not text.lstrip().startswith("#"):
                out.append(Example(start + first + 1, "bash", text.strip(), page=page))
    rules = SKIP + ([] if run_slow else SLOW)
    for ex in out:
        ex.skip = next((why for pattern, why in rules if re.search(pattern, ex.text, re.M)), "")
    return out


def _copy_repo(dst: Path) -> None:
    """The repository's tracked files (a fresh clone's content, with the working tree's
    edits), without .git."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, names):
        src = ROOT / name
        if src.is_file():
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / name)


def _video_copy(src: Path, dst: Path, codec: str) -> None:
    import av

    with av.open(str(src)) as inp, av.open(str(dst), "w") as out:
        frames = [f.to_ndarray(format="rgb24") for f in inp.decode(video=0)]
        stream = out.add_stream(codec, rate=8)
        stream.width, stream.height = frames[0].shape[1], frames[0].shape[0]
        stream.pix_fmt = "yuv420p"
        for a in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(a, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def make_fixtures(work: Path) -> None:
    """FIXTURES, made from the repository's examples."""
    import av
    from PIL import Image

    images = sorted((work / "examples" / "images").glob("*.png"))
    videos = sorted((work / "examples" / "videos").glob("*.mp4"))
    shutil.copy(images[0], work / "photo.png")
    Image.open(images[0]).convert("RGB").save(work / "photo.jpg", quality=95)
    shutil.copy(images[1], work / "img.png")
    for folder, picked in (("shots", images), ("photos", images[:2]), ("imgs", images[2:4])):
        (work / folder).mkdir()
        for p in picked:
            shutil.copy(p, work / folder / p.name)
    (work / "shots" / "few").mkdir()
    shutil.copy(images[0], work / "shots" / "few" / images[0].name)
    shutil.copy(videos[0], work / "clip.mp4")
    _video_copy(videos[0], work / "clip.webm", "libvpx")
    _video_copy(videos[0], work / "clip.mkv", "mpeg4")
    (work / "clips").mkdir()
    for v in videos[:2]:
        shutil.copy(v, work / "clips" / v.name)
    (work / "frames_dir").mkdir()
    with av.open(str(videos[0])) as inp:
        for k, frame in enumerate(inp.decode(video=0)):
            frame.to_image().save(work / "frames_dir" / f"frame{k:03d}.png")
    chat = {"id": "conv-1", "messages": [
        {"role": "user", "text": "spot the difference.", "images": ["shots/" + images[0].name,
                                                                   "shots/" + images[1].name]},
        {"role": "assistant", "text": "the circle turned blue."},
        {"role": "user", "text": "and the background?"}]}
    (work / "conversations.jsonl").write_text(json.dumps(chat) + "\n")


def bounded_profiles(work: Path, max_new_tokens: int) -> Path:
    """The shipped tinyworld profiles with generation.max_new_tokens lowered, in a folder
    searched before ./profiles and the package's."""
    import yaml

    folder = work.parent / "bounded-profiles"
    folder.mkdir(exist_ok=True)
    for src in sorted((work / "profiles").glob("tinyworld-*.yaml")):
        data = yaml.safe_load(src.read_text()) or {}
        gen = data.setdefault("generation", {})
        gen["max_new_tokens"] = min(int(gen.get("max_new_tokens", max_new_tokens)), max_new_tokens)
        (folder / src.name).write_text(f"# {src.name}, max_new_tokens bounded for "
                                       "scripts/readme_examples.py\n" + yaml.safe_dump(data))
    return folder


def _shims(folder: Path, work: Path) -> None:
    folder.mkdir(exist_ok=True)
    for name, tail in (("vlmspec", "-m vlmspec_cli"), ("python", ""), ("python3", "")):
        shim = folder / name
        shim.write_text(f"#!/bin/sh\nexec {sys.executable} {tail} \"$@\"\n")
        shim.chmod(0o755)


def run_examples(examples: list[Example], work: Path, timeout: float, log) -> list[tuple]:
    env = dict(os.environ, PYTHONPATH=str(work), PATH=f"{work.parent / 'bin'}{os.pathsep}"
               f"{os.environ.get('PATH', '')}", VLMSPEC_PROFILES=str(work.parent / "bounded-profiles"),
               PYTHONUNBUFFERED="1")
    rows = []
    for ex in examples:
        if ex.skip:
            rows.append((ex, None, 0.0, ex.skip))
            log(f"{ex.where}  skipped  {ex.text.splitlines()[0][:90]}  ({ex.skip})")
            continue
        argv = (["bash", "-o", "pipefail", "-c", ex.text] if ex.kind == "bash"
                else [sys.executable, "-c", ex.text])
        t0 = time.monotonic()
        try:
            proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True,
                                  timeout=timeout)
            rc, err = proc.returncode, proc.stderr
        except subprocess.TimeoutExpired:
            rc, err = 124, f"timed out after {timeout:.0f} s"
        wall = time.monotonic() - t0
        tail = next((l for l in reversed(err.strip().splitlines()) if l.strip()), "")
        rows.append((ex, rc, wall, tail))
        log(f"{ex.where}  exit {rc}  {wall:6.1f} s  {ex.text.splitlines()[0][:90]}"
            + (f"\n    {tail[:300]}" if rc else ""))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="list the examples, run nothing")
    ap.add_argument("--all", action="store_true", help="also run the slow examples (SLOW)")
    ap.add_argument("--only", metavar="REGEX", help="run only the examples matching REGEX "
                    "(the others before them still run first when --with-earlier)")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=900, help="seconds per example")
    ap.add_argument("--keep", metavar="DIR", help="work in DIR (kept) instead of a temp folder")
    ap.add_argument("--page", metavar="PATH", help="only this page's examples (README.md, "
                    "docs/NAME.md)")
    args = ap.parse_args(argv)
    chosen = [ROOT / args.page] if args.page else pages()
    examples = [ex for page in chosen for ex in extract(page, run_slow=args.all)]
    if args.only:
        for ex in examples:
            if not ex.skip and not re.search(args.only, ex.text):
                ex.skip = "not selected (--only)"
    if args.list:
        for ex in examples:
            print(f"{ex.where}\t{ex.kind}\t{ex.skip or 'runs'}\t{ex.text.splitlines()[0]}")
        return 0
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="vlmspec-readme-"))
    print(f"# {sys.executable}, {len(examples)} examples, copies in {base}", flush=True)
    t0, rows = time.monotonic(), []
    for group in ("README", "docs"):   # the README in a copy of its own, the pages in one
        mine = [ex for ex in examples if (ex.page == "README.md") == (group == "README")]
        if all(ex.skip for ex in mine):
            rows += run_examples(mine, base, args.timeout, lambda s: print(s, flush=True))
            continue
        folder = base / group
        work = folder / "repo"
        work.mkdir(parents=True)
        _copy_repo(work)
        make_fixtures(work)
        bounded_profiles(work, args.max_new_tokens)
        _shims(folder / "bin", work)
        rows += run_examples(mine, work, args.timeout, lambda s: print(s, flush=True))
    ran = [r for r in rows if r[1] is not None]
    failed = [r for r in ran if r[1] != 0]
    print(f"# {len(ran)} ran ({len(failed)} failed), {len(rows) - len(ran)} skipped, "
          f"{time.monotonic() - t0:.0f} s")
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)
    return 1 if failed else 0

if __name__ == "__main__":
    sys.exit(main())
