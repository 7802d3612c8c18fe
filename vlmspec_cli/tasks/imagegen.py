"""Text-to-image generation: prompts → jobs → image-token requests → PNG files + records.

A job is one image: the k-th of ``images_per_prompt`` for one prompt, with its own seed
(the run's seed + k, so the images of a prompt differ at T > 0 and every record can be
replayed). The target decodes the image grid token by token (speculatively), the VQ
decoder turns the codes into pixels, and the PNG (and with ``heatmap`` its
``NAME.heatmap.png``) is written atomically: into a temporary file in the output folder,
then linked to its name, which fails rather than overwrite an existing file (unless
``force``, and then only over a PNG vlmspec wrote: output_files.is_own_png; each PNG
carries what it was generated from, JOB_TEXT). Whether each file may be written is
decided before the job decodes (tasks/output_files.py): a file already there is an error
for that job unless ``skip_existing`` (resume: a whole PNG of the same job is kept and the
job only writes what is missing); either way the batch goes on. :class:`ImageKind` is
its kind for the job runner (tasks/jobs.py: failures, records, --compare).
"""

from __future__ import annotations

import io
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from vlmspec_cli.fileio import write_new
from vlmspec_cli.png_mark import mark_png
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.tasks.inputs import InputError
from vlmspec_cli.tasks.jobs import SKIP, BatchSummary, JobEvents, failure_reason, run_jobs
from vlmspec_cli.tasks.output_files import OWN_PNG, OutputRefused, is_own_png, png_text, refusal
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
                               image_seed(self.seed, k))


def image_seed(seed: int, k: int) -> int:
    """Image k's seed: the run's + k, wrapped into the signed 64-bit range --seed takes
    (--seed 9223372036854775807 -n 2 recorded 9223372036854775808 for the second image,
    a seed --seed then refused: the image could not be made again)."""
    return (seed + k + 2 ** 63) % 2 ** 64 - 2 ** 63


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


def lock_out_dir(out_dir: str | os.PathLike) -> tuple[int | None, str | None]:
    """Hold ``out_dir`` for this run: an advisory flock on the folder itself (no file added
    to it), released when the returned descriptor closes or the process ends. Two runs into
    one folder each decoded every image and failed the other's, whose files they saw as
    existing, --skip-existing or not. (fd or None, why the folder is busy or None)."""
    try:
        import fcntl
    except ImportError:    # no flock here: nothing held
        return None, None
    try:
        fd = os.open(out_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None, None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None, (f"--out-dir {out_dir}: another vlmspec generate-image is writing into "
                      "it; wait for it to finish or choose another folder")
    except OSError:        # a filesystem without locks
        pass
    return fd, None


def check_out_dir(out_dir: str | os.PathLike) -> str | None:
    """Why nothing could be written to ``out_dir`` (created if missing), or None."""
    path = Path(out_dir)
    if os.path.lexists(path) and not path.is_dir():   # a file, a broken link, a link loop:
        try:                                           # said as it is, not "File exists"
            os.stat(path)
        except FileNotFoundError:
            return f"--out-dir {path}: a broken symbolic link"
        except OSError as exc:
            return f"--out-dir {path}: {(exc.strerror or str(exc)).lower()}"
        return f"--out-dir {path} is not a directory"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot create --out-dir {path}: {exc.strerror or exc}"
    if not path.is_dir():
        return f"--out-dir {path} is not a directory"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"--out-dir {path} is not writable"
    return None


JOB_TEXT = "vlmspec-job"    # the PNG text chunk holding what the image was generated from


def png_bytes(image, identity: dict | None = None) -> bytes:
    """``image`` as a PNG vlmspec owns (png_mark.mark_png), with ``identity`` (what
    decides its pixels: :func:`image_identity`) in its JOB_TEXT chunk."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    text = {} if identity is None else {JOB_TEXT: json.dumps(identity, sort_keys=True)}
    return mark_png(buf.getvalue(), **text)


def image_identity(session, job: ImageJob) -> dict:
    """What decides a job's pixels, besides the decoding method (lossless methods give the
    target's image): the prompt and the settings a record's resume key holds, with the
    guidance scale, and the image's own seed when sampling (at T = 0 the seed changes
    nothing). ``--skip-existing`` keeps a file only when it was generated from the same."""
    from vlmspec_cli.tasks.caption import output_settings

    p = session.profile
    settings = {k: v for k, v in output_settings(p).items() if k not in ("max_new_tokens", "seed")}
    settings["cfg"] = session.target.adapter.guidance_scale(session.target)
    if p.sampling.temperature > 0:
        settings["seed"] = job.seed
    return {"prompt": job.prompt, "settings": settings}


def heatmap_path(path: str | os.PathLike) -> Path:
    p = Path(path)
    return p.with_name(p.stem + ".heatmap.png")


_KEEP_HINT = "use --force to overwrite, --skip-existing to keep it"


def files_to_write(job: ImageJob, heatmap: bool, *, force: bool, skip_existing: bool,
                   identity: dict | None = None) -> list[Path]:
    """The files of ``job`` this run writes: its PNG and, with ``heatmap``, its heatmap; with
    ``skip_existing`` only those missing (none: skip the job). Decided before decoding:
    raises OutputRefused when one may not be written (it exists and no --force, or it is
    not a PNG vlmspec wrote, which --force does not replace either), so no image is decoded
    for nothing. ``identity``: the job's (:func:`image_identity`); ``skip_existing`` keeps
    a file generated from another (another seed, prompt, cfg, target) as done no more."""
    files = [Path(job.path)] + ([heatmap_path(job.path)] if heatmap else [])
    named = lambda p, why: why if p == files[0] else f"heatmap {p} {why}"   # noqa: E731
    if skip_existing:   # kept only when it is a whole PNG of ours, of this job
        for p in [p for p in files if p.exists() or p.is_symlink()]:
            why = _not_kept(p, identity)
            if why is not None:
                raise OutputRefused(named(p, why))
        return [p for p in files if not (p.exists() or p.is_symlink())]
    for p in files:
        reason = refusal(p, force=force, exists_hint=_KEEP_HINT, **OWN_PNG)
        if reason is not None:
            raise OutputRefused(named(p, reason))
    return files


def _not_kept(path: Path, identity: dict | None) -> str | None:
    """Why ``--skip-existing`` does not keep the file at ``path`` as done, or None."""
    if not path.is_file() or not is_own_png(path):
        return (f"exists and is not a {OWN_PNG['what']}: not kept as done, and not "
                "overwritten, even with --force")
    problem = not_a_whole_png(path)
    if problem:
        return f"exists but {problem}, so it is not kept as done; --force replaces it"
    if identity is None:
        return None
    try:
        theirs = json.loads((png_text(path) or {}).get(JOB_TEXT, "null"))
    except ValueError:
        theirs = None
    if theirs == identity:
        return None
    if not isinstance(theirs, dict):
        return "exists without the settings it was generated from: not kept as done; --force replaces it"
    ours, old = {"prompt": identity["prompt"], **identity["settings"]}, {
        "prompt": theirs.get("prompt"), **(theirs.get("settings") or {})}
    diff = ", ".join(f"{k} {ours.get(k)!r} here, {old.get(k)!r} there" for k in sorted(set(ours) | set(old))
                     if ours.get(k) != old.get(k))
    return f"exists, generated with other settings ({diff}): not kept as done; --force replaces it"


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
        self.replaced: list[str] = []      # files --force replaced

    def pending(self, profile, jobs, done: set):
        return jobs, 0

    def prepare(self, session, job: ImageJob):
        if job.error:
            raise InputError(job.path, job.error)
        identity = image_identity(session, job)
        writes = files_to_write(job, self.heatmap, force=self.force,
                                skip_existing=self.skip_existing, identity=identity)
        return (writes, identity) if writes else SKIP

    def request(self, session, job: ImageJob) -> Request:
        if job.error:
            raise InputError(job.path, job.error)
        return image_request(session, job)

    def record(self, session, job: ImageJob) -> dict:
        return base_record(session, job)

    def finish(self, session, job: ImageJob, prepared: tuple[list[Path], dict], request: Request,
               result, record: dict) -> None:
        """Write the job's files (those ``prepare`` decided, with its identity) and fill
        ``record``."""
        from vlmspec_cli.plot import grid_heatmap

        writes, identity = prepared
        image = render(session, result.tokens)
        if Path(job.path) in writes:       # else kept (--skip-existing)
            self._write(Path(job.path), png_bytes(image, identity))
        record["file"] = job.path
        stats = result.state.stats
        trees = stats.trees or {}
        hpath = heatmap_path(job.path)
        if hpath in writes and "accept_lengths" in trees:
            rows, cols = session.target.adapter.image_grid(session.target)
            grid = [trees["accept_lengths"][r * cols:(r + 1) * cols] for r in range(rows)]
            self._write(hpath, png_bytes(grid_heatmap(grid, image.size), identity))
        if self.heatmap and hpath.exists():
            record["heatmap"] = str(hpath)
        record["tokens"] = result.tokens
        record["stats"] = stats.to_dict()

    def _write(self, path: Path, data: bytes) -> None:
        existed = os.path.lexists(path)
        write_new(path, data, self.force)
        if existed:                        # --force: its own PNG, named on stderr
            self.replaced.append(str(path))

    def failure(self, exc: Exception) -> str:
        return _reason(exc)


def run_images(session, jobs, events: JobEvents, *, force: bool = False,
               skip_existing: bool = False, heatmap: bool = False, compare: bool = False,
               emit=None, replaced: list[str] | None = None) -> BatchSummary:
    """Generate every job's image (``jobs``: an ImagePlan or a list, iterated once, so a
    plan is never held whole); failures become error records, the batch goes on. With
    ``skip_existing`` a job whose files are all there as whole PNGs it wrote from the same
    settings is skipped as it comes up (the progress counts it). ``replaced``: gets the
    files ``force`` replaced."""
    from vlmspec_cli.session import tree_methods

    heatmap = heatmap and session.profile.method in tree_methods()   # trees have accept lengths
    kind = ImageKind(force=force, skip_existing=skip_existing, heatmap=heatmap)
    if replaced is not None:
        kind.replaced = replaced
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
