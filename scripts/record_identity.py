"""Records and PNG bytes of every job kind, from two checkouts, compared without timings.

    python scripts/record_identity.py run TREE OUT_DIR [--methods]  # the commands, TREE's code
    python scripts/record_identity.py diff BEFORE AFTER [--ignore KEY ...]

``run`` copies examples/ into a scratch folder, runs caption (images, one bad file,
--compare), a --chat file (one bad line), describe-video (two videos, --compare) and
generate-image (two prompts, a tree with --heatmap, --compare) with ``--json`` at T = 0
through ``python -m vlmspec_cli`` with ``PYTHONPATH=TREE``, and writes to OUT_DIR: each
command's records with the timing fields' values masked and the scratch and tree paths
replaced by placeholders (NAME.jsonl), its exit code and stderr, and the SHA-256 of every
PNG it wrote.
``diff`` compares two such folders record by record, key by key, and exits 1 on any
difference outside the ``--ignore``d keys (a deliberate change, e.g. ``schema``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# wall-clock measurements (and what is computed from them): they differ run to run
TIMING = {"wall_s", "prefill_s", "caption_s", "decode_s", "prefill_share", "tokens_per_s",
          "target_only_wall_s", "target_only_tokens_per_s", "target_only_s", "speedup"}

CHAT = [
    {"id": "two-turns", "messages": [
        {"role": "user", "text": "describe the image.", "images": ["images/scene1.png"]},
        {"role": "assistant", "text": "a red circle."},
        {"role": "user", "text": "what colour is the background?"}]},
    {"id": "two-images", "messages": [
        {"role": "user", "text": "what is different between the two images?",
         "images": ["images/scene2.png", "images/scene3.png"]}]},
    {"id": "bad", "messages": [{"role": "assistant", "text": "no user turn"}]},
]

COMMANDS = {
    "caption": ["caption", "images", "not-an-image.png", "--max-new-tokens", "24", "--compare"],
    "caption-batched": ["caption", "images", "--max-new-tokens", "16", "-m", "none",
                        "--batch-size", "3"],
    "chat": ["caption", "--chat", "chat.jsonl", "--max-new-tokens", "24"],
    "video": ["describe-video", "videos/red-circle-left-to-right.mp4",
              "videos/blue-square-top-to-bottom-yellow-triangle-stays.mp4", "--frames", "4",
              "--max-new-tokens", "16", "--compare"],
    "image": ["generate-image", "a red circle on a blue background", "", "a white triangle",
              "--compare", "--out-dir", "png-chain"],
    "image-tree": ["generate-image", "a small green square at the top left", "-m", "tree",
                   "--heatmap", "--out-dir", "png-tree"],
}


# --methods: every drafting method (and the batch, the fast path off) at T = 0 and T = 0.8 on
# two images, generate-image's methods at both temperatures; γ fixed (drafting.length auto
# chooses it from measured round costs, which changes a T > 0 run's sample path run to run)
FIXED = ["--set", "drafting.length=fixed", "--max-new-tokens", "24", "--seed", "7"]
TWO = ["images/scene1.png", "images/scene4.png"]
METHODS = {
    "none": ["-m", "none"], "chain": [], "chain-text": ["--inputs", "text"],
    "tabed": ["-p", "tinyworld-tabed"], "tree": ["-m", "tree"],
    "tree-static": ["-m", "tree", "--set", "tree.policy=static"], "hidden": ["-p", "tinyworld-hidden"],
    "hidden-tree": ["-p", "tinyworld-hidden", "--set", "hidden.tree=true"],
    "eagle3": ["-p", "tinyworld-eagle3"], "twig": ["-p", "tinyworld-twig"],
    "chain-fast-off": ["--fast-path", "off"], "tree-fast-off": ["-m", "tree", "--fast-path", "off"],
}
METHOD_COMMANDS = {
    **{f"{name}-t{t}": ["caption", *TWO, *args, *FIXED, "-t", t]
       for t in ("0", "0.8") for name, args in METHODS.items()},
    **{f"batch-{m}-t{t}": ["caption", *TWO, "images/scene2.png", "-m", m, "-b", "2", *FIXED, "-t", t]
       for t in ("0", "0.8") for m in ("chain", "none")},
    **{f"video-{m}-t{t}": ["describe-video", "videos/red-circle-left-to-right.mp4", "-m", m,
                           "--max-new-tokens", "16", "--seed", "7", "-t", t]
       for t in ("0", "0.8") for m in ("hidden", "chain")},
    **{f"image-{m}-t{t}": ["generate-image", "a red circle", "-m", m, "--seed", "7", "-t", t,
                           "--out-dir", f"png-{m}-t{t}"]
       for t in ("0", "0.8") for m in ("tree", "adt", "none")},
}


def _clean(value, places: dict[str, str]):
    if isinstance(value, dict):   # a timing keeps its key (the fields are compared), not its value
        return {k: "<timing>" if k in TIMING and v is not None else _clean(v, places)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v, places) for v in value]
    if isinstance(value, str):
        for path, name in places.items():
            value = value.replace(path, name)
    return value


def run(tree: Path, out: Path, commands: dict[str, list[str]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory(prefix="record-identity-") as scratch:
        work = Path(scratch)
        shutil.copytree(tree / "examples" / "images", work / "images")
        shutil.copytree(tree / "examples" / "videos", work / "videos")
        (work / "not-an-image.png").write_bytes(b"not a PNG\n")
        (work / "chat.jsonl").write_text("".join(json.dumps(c) + "\n" for c in CHAT))
        places = {str(work.resolve()): "<WORK>", str(work): "<WORK>", str(tree): "<TREE>"}
        for name, args in commands.items():
            cmd = [sys.executable, "-m", "vlmspec_cli", *args, "--json", "-q"]
            res = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
            records = [_clean(json.loads(line), places) for line in res.stdout.splitlines() if line]
            with open(out / f"{name}.jsonl", "w") as fh:
                for rec in records:
                    fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
            (out / f"{name}.exit").write_text(f"{res.returncode}\n{_clean(res.stderr, places)}")
            print(f"{name}: exit {res.returncode}, {len(records)} record(s)", file=sys.stderr)
        pngs = {str(p.relative_to(work)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(work.rglob("png-*/*.png"))}
        (out / "pngs.json").write_text(json.dumps(pngs, indent=1) + "\n")


def _paths(a, b, at: str = ""):
    """The key paths where ``a`` and ``b`` differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            if k not in a or k not in b:
                yield f"{at}.{k}", "missing before" if k not in a else "missing after"
            else:
                yield from _paths(a[k], b[k], f"{at}.{k}")
        if [k for k in a if k in b] != [k for k in b if k in a]:
            yield at or ".", "key order"
    elif a != b:
        yield at, f"{json.dumps(a)[:80]} -> {json.dumps(b)[:80]}"


def diff(before: Path, after: Path, ignore: set[str]) -> int:
    problems = 0
    names = sorted(p.stem for p in before.glob("*.jsonl"))
    for name in [*names, "pngs"]:
        suffix = ".json" if name == "pngs" else ".jsonl"
        a, b = (p / f"{name}{suffix}" for p in (before, after))
        if name == "pngs":
            pa, pb = json.loads(a.read_text()), json.loads(b.read_text())
            same = pa == pb
            print(f"pngs: {len(pa)} before, {len(pb)} after, "
                  f"{'byte-identical' if same else 'DIFFERENT'}")
            problems += not same
            continue
        ra = [json.loads(x) for x in a.read_text().splitlines()]
        rb = [json.loads(x) for x in b.read_text().splitlines()]
        exits = [(p / f"{name}.exit").read_text().split("\n", 1) for p in (before, after)]
        codes = [e[0] for e in exits]
        found = []
        if exits[0][1] != exits[1][1]:
            found.append(f"stderr differs: {exits[0][1]!r} -> {exits[1][1]!r}")
        if len(ra) != len(rb):
            found.append(f"{len(ra)} records before, {len(rb)} after")
        if codes[0] != codes[1]:
            found.append(f"exit {codes[0]} before, {codes[1]} after")
        for i, (x, y) in enumerate(zip(ra, rb)):
            for path, what in _paths(x, y):
                if path.lstrip(".").split(".")[0] not in ignore:
                    found.append(f"record {i + 1} {path}: {what}")
        print(f"{name}: {len(ra)} record(s), exit {codes[0]}: "
              + ("identical" + (f" outside {sorted(ignore)}" if ignore else "")
                 if not found else "DIFFERENT"))
        for line in found:
            print(f"  {line}")
        problems += bool(found)
    return 1 if problems else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("tree", type=Path)
    r.add_argument("out", type=Path)
    r.add_argument("--methods", action="store_true",
                   help="also every drafting method at T = 0 and 0.8 (METHOD_COMMANDS)")
    d = sub.add_parser("diff")
    d.add_argument("before", type=Path)
    d.add_argument("after", type=Path)
    d.add_argument("--ignore", nargs="*", default=[])
    args = ap.parse_args()
    if args.cmd == "run":
        run(args.tree.resolve(), args.out, COMMANDS | (METHOD_COMMANDS if args.methods else {}))
        return 0
    return diff(args.before, args.after, set(args.ignore))


if __name__ == "__main__":
    sys.exit(main())
