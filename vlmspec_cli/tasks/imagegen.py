"""Text-to-image generation: prompts → jobs → image-token requests → PNG files + records.

A job is one image: the k-th of ``images_per_prompt`` for one prompt, with its own seed
(the run's seed + k, so the images of a prompt differ at T > 0 and every record can be
replayed). The target decodes the image grid token by token (speculatively), the VQ
decoder turns the codes into pixels, and the PNG (and with ``heatmap`` its
``NAME.heatmap.png``) is written atomically: into a temporary file in the output folder,
then linked to its name, which fails rather than overwrite an existing file (unless
``force``, and then only over a PNG). Whether each file may be written is decided before
the job decodes (tasks/output_files.py): a file already there is an error for that job
unless ``skip_existing`` (resume: it is kept and the job only writes what is missing);
either way the batch goes on.
"""

from __future__ import annotations

import io
import itertools
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from vlmspec_cli.fileio import write_new
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.tasks.caption import BatchSummary, CaptionEvents, warm_up_compare
from vlmspec_cli.tasks.output_files import OutputRefused, is_png, refusal

TASK = "image"


@dataclass(frozen=True)
class ImageJob:
    path: str            # the PNG to write (or "prompt N" when the prompt is unusable)
    prompt: str
    prompt_index: int
    sample: int          # k: which image of this prompt
    seed: int
    error: str | None = None


# -n's ceiling (also for image.images_per_prompt): a typo like -n 1000000000 is a usage
# error, not days of decoding. The plan is generated lazily whatever its size.
MAX_IMAGES_PER_PROMPT = 10_000


def slug(prompt: str, limit: int = 48) -> str:
    words, length = [], 0
    for match in re.finditer(r"[a-z0-9]+", prompt.lower()):   # a 50 MB prompt: stop early
        words.append(match.group())
        length += len(words[-1]) + 1
        if length > limit:
            break
    return "-".join(words)[:limit].rstrip("-") or "image"


@dataclass(frozen=True)
class BadPrompt:
    """A --prompts-file line that is not read (too long); its jobs fail with ``reason``."""

    reason: str


class ImagePlan:
    """``n`` jobs per prompt, named ``NNN-slug-k.png`` (NNN: the prompt's index) so that
    the same command finds the same files again; an empty prompt (or a BadPrompt) is one
    failing job. Generated as it is iterated (-n 10,000 x a million prompts holds no list
    of ten billion jobs); ``len()`` counts them without building any."""

    def __init__(self, prompts: list, n: int, seed: int, out_dir: str | os.PathLike) -> None:
        self.prompts, self.n, self.seed, self.out_dir = prompts, n, seed, Path(out_dir)

    def _bad(self, prompt) -> str | None:
        if isinstance(prompt, BadPrompt):
            return prompt.reason
        return None if prompt.strip() else "empty prompt"

    def __len__(self) -> int:
        return sum(1 if self._bad(p) else self.n for p in self.prompts)

    def __iter__(self):
        for i, prompt in enumerate(self.prompts):
            reason = self._bad(prompt)
            if reason:
                text = "" if isinstance(prompt, BadPrompt) else prompt
                yield ImageJob(f"prompt {i + 1}", text, i, 0, self.seed, reason)
                continue
            text = prompt.strip()
            name = slug(text)
            for k in range(self.n):
                yield ImageJob(str(self.out_dir / f"{i:03d}-{name}-{k}.png"), text, i, k,
                               self.seed + k)


def plan_jobs(prompts: list, n: int, seed: int, out_dir: str | os.PathLike) -> ImagePlan:
    return ImagePlan(prompts, n, seed, out_dir)


class PromptsFileError(Exception):
    """The --prompts-file cannot be read; ``str()`` names it and says why."""


def read_prompts(path: str, stdin=None) -> list:
    """One prompt per line of ``path`` (``-``: stdin); blank lines and lines starting with
    # are skipped. Read as a bounded stream (text_lists.py): a regular file or stdin only,
    at most 64 MiB; a line over 1 MiB becomes a BadPrompt. Raises PromptsFileError for a
    file that is not UTF-8 text or cannot be read."""
    import sys

    from vlmspec_cli.tasks.text_lists import (MAX_PROMPT_LINE, ListFileError, ListTooLong,
                                              binary_stream, bounded_lines, open_list_file)

    name = "stdin" if path == "-" else path
    try:
        fh = binary_stream(stdin or sys.stdin) if path == "-" else open_list_file(path)
    except ListFileError as exc:
        raise PromptsFileError(f"--prompts-file {name}: {exc}") from None
    prompts: list = []
    try:
        for n, raw, problem in bounded_lines(fh, MAX_PROMPT_LINE):
            if problem is not None:
                prompts.append(BadPrompt(problem))
                continue
            try:
                line = raw.decode("utf-8-sig" if n == 1 else "utf-8").rstrip("\r")
            except UnicodeDecodeError as exc:
                raise PromptsFileError(f"--prompts-file {name}: not UTF-8 text (line {n}, "
                                       f"invalid byte at offset {exc.start})") from None
            if line.strip() and not line.lstrip().startswith("#"):
                prompts.append(line)
    except ListTooLong as exc:
        raise PromptsFileError(f"--prompts-file {name}: {exc}") from None
    except OSError as exc:
        raise PromptsFileError(f"--prompts-file {name}: cannot read ({exc.strerror or exc})") from None
    finally:
        if path != "-":
            fh.close()
    return prompts


def check_out_dir(out_dir: str | os.PathLike) -> str | None:
    """Why nothing could be written to ``out_dir`` (created if missing), or None."""
    path = Path(out_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot create --out-dir {path}: {exc.strerror or exc}"
    if not path.is_dir():
        return f"--out-dir {path} is not a directory"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"--out-dir {path} is not writable"
    return None


def png_bytes(image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def heatmap_path(path: str | os.PathLike) -> Path:
    p = Path(path)
    return p.with_name(p.stem + ".heatmap.png")


_KEEP_HINT = "use --force to overwrite, --skip-existing to keep it"


def files_to_write(job: ImageJob, heatmap: bool, *, force: bool, skip_existing: bool) -> list[Path]:
    """The files of ``job`` this run writes: its PNG and, with ``heatmap``, its heatmap; with
    ``skip_existing`` only those missing (none: skip the job). Decided before decoding:
    raises OutputRefused when one may not be written (it exists and no --force, or with
    --force it is not a PNG), so no image is decoded for nothing."""
    files = [Path(job.path)] + ([heatmap_path(job.path)] if heatmap else [])
    if skip_existing:   # kept only when it is a whole PNG (a truncated one is not done)
        for p in files:
            problem = (p.exists() or p.is_symlink()) and not_a_whole_png(p)
            if problem:
                raise OutputRefused(("" if p == files[0] else f"heatmap {p} ") + f"exists but "
                                    f"{problem}, so it is not kept as done; --force replaces it")
        return [p for p in files if not (p.exists() or p.is_symlink())]
    for p in files:
        reason = refusal(p, force=force, ours=is_png, what="PNG image", exists_hint=_KEEP_HINT)
        if reason is not None:
            raise OutputRefused(reason if p == files[0] else f"heatmap {p} {reason}")
    return files


def not_a_whole_png(path: Path) -> str | None:
    """Why the file at ``path`` is not a whole PNG (PIL's verify: every chunk there, its
    CRC right, up to IEND), or None. Files past the image size cap are not read."""
    from PIL import Image

    from vlmspec_cli.tasks.inputs import MAX_IMAGE_BYTES

    try:
        if os.stat(path).st_size > MAX_IMAGE_BYTES:
            return "is larger than any image vlmspec writes"
        with Image.open(path) as im:
            if im.format != "PNG":
                return f"is not a PNG ({im.format})"
            im.verify()
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})" if exc.strerror else f"does not decode ({exc})"
    except Exception as exc:   # SyntaxError, struct.error ...: truncated or corrupt
        return f"does not decode ({str(exc) or type(exc).__name__})"
    return None


def base_record(session, job: ImageJob) -> dict:
    p = session.profile
    record = {
        "input": job.path, "task": TASK, "prompt": job.prompt, "index": job.sample,
        "file": None, "heatmap": None, "profile": p.name, "method": p.method,
        "lossless": session.lossless, "acceptance": p.acceptance,
        "cfg": session.target.adapter.guidance_scale(session.target),
        "temperature": p.sampling.temperature, "seed": job.seed, "error": None,
    }
    record.update(session.method.record_fields(p, TASK))   # a tree's shape, ADT-Tree's settings
    if p.acceptance == "relaxed":
        record["relaxed"] = vars(p.relaxed).copy()
    return record


def image_request(session, job: ImageJob) -> Request:
    """The job's request: its prompt, then the whole image grid (ContextLimitError when
    the two do not fit in the target's positions)."""
    lm = session.target
    request = Request([Message("user", job.prompt)], seed=job.seed, request_id=job.path,
                      max_new_tokens=lm.adapter.num_image_tokens(lm))
    session.check_fits(request, generated="image tokens")
    return request


def render(session, tokens: list[int]):
    from PIL import Image

    lm = session.target
    pixels = lm.adapter.decode_images(lm, torch.tensor([tokens]))[0]
    return Image.fromarray(pixels.numpy(), "RGB")


def run_images(session, jobs, events: CaptionEvents, *, force: bool = False,
               skip_existing: bool = False, heatmap: bool = False, compare: bool = False,
               emit=None) -> BatchSummary:
    """Generate every job's image (``jobs``: an ImagePlan or a list, iterated once, so a
    plan is never held whole); failures become error records, the batch goes on. With
    ``skip_existing`` a job whose files are all there as whole PNGs is skipped as it
    comes up (the progress counts it)."""
    from vlmspec_cli.session import tree_methods

    heatmap = heatmap and session.profile.method in tree_methods()   # trees have accept lengths
    summary = BatchSummary(items=len(jobs),
                           must_match=session.sampling.greedy and session.lossless)
    events.batch_started(len(jobs), 0)
    if compare:
        firsts = itertools.islice((job for job in jobs if job.error is None), 3)
        warm_up_compare(session, [lambda j=job: image_request(session, j) for job in firsts])
    for job in jobs:
        try:
            writes = None if job.error else files_to_write(job, heatmap, force=force,
                                                           skip_existing=skip_existing)
        except OutputRefused as exc:
            writes = exc
        if writes == []:
            summary.skipped += 1
            events.item_skipped(job)
            continue
        record = base_record(session, job)
        events.item_started(job)
        try:
            if job.error:
                raise ValueError(job.error)
            if isinstance(writes, Exception):
                raise writes
            _generate(session, job, writes, record, events, summary, force=force,
                      heatmap=heatmap, compare=compare)
        except (OSError, ValueError, RuntimeError, OutputRefused) as exc:
            reason = _reason(exc)
            record["error"] = reason
            summary.failures += 1
            events.item_failed(job, reason, record)
        else:
            summary.done += 1
            events.item_done(record)
        if emit is not None:
            emit(record)
    return summary


def _generate(session, job: ImageJob, writes: list[Path], record: dict, events, summary, *,
              force: bool, heatmap: bool, compare: bool) -> None:
    """Decode one job's image, write its files (those in ``writes``) and fill ``record``."""
    from vlmspec_cli.plot import grid_heatmap

    rows, cols = session.target.adapter.image_grid(session.target)
    request = image_request(session, job)
    limit = request.max_new_tokens
    result = session.engine.generate(
        request, lambda st: events.tokens(job, len(st.tokens), limit))
    image = render(session, result.tokens)
    if Path(job.path) in writes:       # else kept (--skip-existing)
        write_new(Path(job.path), png_bytes(image), force)
    record["file"] = job.path
    stats = result.state.stats
    trees = stats.trees or {}
    hpath = heatmap_path(job.path)
    if hpath in writes and "accept_lengths" in trees:
        grid = [trees["accept_lengths"][r * cols:(r + 1) * cols] for r in range(rows)]
        write_new(hpath, png_bytes(grid_heatmap(grid, image.size)), force)
    if heatmap and hpath.exists():
        record["heatmap"] = str(hpath)
    record["tokens"] = result.tokens
    record["stats"] = stats.to_dict()
    summary.stats.merge(stats)
    if compare:
        t0 = time.perf_counter()
        base = session.baseline_engine().generate(image_request(session, job))
        base_s = time.perf_counter() - t0
        summary.baseline_wall_s += base_s
        summary.compared += 1
        same = base.tokens == result.tokens
        summary.identical += same
        summary.mismatches += not same and summary.must_match
        # the names caption's and video's records use
        record["compare"] = {"target_only_wall_s": round(base_s, 4), "identical": same,
                             "speedup": round(base_s / stats.wall_s, 3) if stats.wall_s else None}


def _reason(exc: Exception) -> str:
    if isinstance(exc, FileExistsError):
        return f"exists ({_KEEP_HINT})"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__
