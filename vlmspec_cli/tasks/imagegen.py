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
either way the batch goes on. :class:`ImageKind` is its kind for the job runner
(tasks/jobs.py: failures, records, --compare).
"""

from __future__ import annotations

import io
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from vlmspec_cli.fileio import write_new
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.tasks.inputs import InputError
from vlmspec_cli.tasks.jobs import SKIP, BatchSummary, JobEvents, failure_reason, run_jobs
from vlmspec_cli.tasks.output_files import OutputRefused, is_png, refusal
from vlmspec_cli.tasks.records import SCHEMA

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
        "input": job.path, "task": TASK, "schema": SCHEMA, "prompt": job.prompt, "index": job.sample,
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


class ImageKind:
    """Images for the job runner: resumed by their files (``skip_existing``), decided
    before decoding (:func:`files_to_write`); the PNG, its heatmap and the image tokens."""

    batches = False

    def __init__(self, *, force: bool, skip_existing: bool, heatmap: bool) -> None:
        self.force, self.skip_existing, self.heatmap = force, skip_existing, heatmap

    def pending(self, profile, jobs, done: set):
        return jobs, 0

    def prepare(self, session, job: ImageJob):
        if job.error:
            raise InputError(job.path, job.error)
        writes = files_to_write(job, self.heatmap, force=self.force,
                                skip_existing=self.skip_existing)
        return writes or SKIP

    def request(self, session, job: ImageJob) -> Request:
        if job.error:
            raise InputError(job.path, job.error)
        return image_request(session, job)

    def record(self, session, job: ImageJob) -> dict:
        return base_record(session, job)

    def finish(self, session, job: ImageJob, writes: list[Path], request: Request, result,
               record: dict) -> None:
        """Write the job's files (those in ``writes``) and fill ``record``."""
        from vlmspec_cli.plot import grid_heatmap

        image = render(session, result.tokens)
        if Path(job.path) in writes:       # else kept (--skip-existing)
            write_new(Path(job.path), png_bytes(image), self.force)
        record["file"] = job.path
        stats = result.state.stats
        trees = stats.trees or {}
        hpath = heatmap_path(job.path)
        if hpath in writes and "accept_lengths" in trees:
            rows, cols = session.target.adapter.image_grid(session.target)
            grid = [trees["accept_lengths"][r * cols:(r + 1) * cols] for r in range(rows)]
            write_new(hpath, png_bytes(grid_heatmap(grid, image.size)), self.force)
        if self.heatmap and hpath.exists():
            record["heatmap"] = str(hpath)
        record["tokens"] = result.tokens
        record["stats"] = stats.to_dict()

    def failure(self, exc: Exception) -> str:
        return _reason(exc)


def run_images(session, jobs, events: JobEvents, *, force: bool = False,
               skip_existing: bool = False, heatmap: bool = False, compare: bool = False,
               emit=None) -> BatchSummary:
    """Generate every job's image (``jobs``: an ImagePlan or a list, iterated once, so a
    plan is never held whole); failures become error records, the batch goes on. With
    ``skip_existing`` a job whose files are all there as whole PNGs is skipped as it
    comes up (the progress counts it)."""
    from vlmspec_cli.session import tree_methods

    heatmap = heatmap and session.profile.method in tree_methods()   # trees have accept lengths
    kind = ImageKind(force=force, skip_existing=skip_existing, heatmap=heatmap)
    return run_jobs(session, kind, jobs, events, compare=compare, emit=emit)


def _reason(exc: Exception) -> str:
    """An image job's failure in one line: a file's problem as the file system says it, a
    refused or unusable prompt by its message, anything else as every job's
    (jobs.failure_reason)."""
    if isinstance(exc, InputError):
        return exc.reason
    if isinstance(exc, FileExistsError):
        return f"exists ({_KEEP_HINT})"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    if isinstance(exc, (OSError, ValueError, RuntimeError, OutputRefused)):
        return str(exc) or type(exc).__name__
    return failure_reason(exc)
