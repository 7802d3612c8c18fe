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
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from vlmspec_cli.runtime.limits import check_fits
from vlmspec_cli.runtime.request import Message, Request
from vlmspec_cli.tasks.caption import BatchSummary, CaptionEvents, warm_up_compare
from vlmspec_cli.tasks.output_files import OutputRefused, is_png, refusal, write_new

TASK = "image"


@dataclass(frozen=True)
class ImageJob:
    path: str            # the PNG to write (or "prompt N" when the prompt is unusable)
    prompt: str
    prompt_index: int
    sample: int          # k: which image of this prompt
    seed: int
    error: str | None = None


def slug(prompt: str, limit: int = 48) -> str:
    words = re.findall(r"[a-z0-9]+", prompt.lower())
    return "-".join(words)[:limit].rstrip("-") or "image"


def plan_jobs(prompts: list[str], n: int, seed: int, out_dir: str | os.PathLike) -> list[ImageJob]:
    """``n`` jobs per prompt, named ``NNN-slug-k.png`` (NNN: the prompt's index) so that
    the same command finds the same files again."""
    jobs = []
    for i, prompt in enumerate(prompts):
        text = prompt.strip()
        if not text:
            jobs.append(ImageJob(f"prompt {i + 1}", prompt, i, 0, seed, "empty prompt"))
            continue
        for k in range(n):
            path = Path(out_dir) / f"{i:03d}-{slug(text)}-{k}.png"
            jobs.append(ImageJob(str(path), text, i, k, seed + k))
    return jobs


def read_prompts(stream) -> list[str]:
    """One prompt per line; blank lines and lines starting with # are skipped."""
    return [line.rstrip("\n") for line in stream
            if line.strip() and not line.lstrip().startswith("#")]


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
    if skip_existing:
        return [p for p in files if not (p.exists() or p.is_symlink())]
    for p in files:
        reason = refusal(p, force=force, ours=is_png, what="PNG image", exists_hint=_KEEP_HINT)
        if reason is not None:
            raise OutputRefused(reason if p == files[0] else f"heatmap {p} {reason}")
    return files


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
    check_fits(session, request, generated="image tokens")
    return request


def render(session, tokens: list[int]):
    from PIL import Image

    lm = session.target
    pixels = lm.adapter.decode_images(lm, torch.tensor([tokens]))[0]
    return Image.fromarray(pixels.numpy(), "RGB")


def run_images(session, jobs: list[ImageJob], events: CaptionEvents, *, force: bool = False,
               skip_existing: bool = False, heatmap: bool = False, compare: bool = False,
               emit=None) -> BatchSummary:
    """Generate every job's image; failures become error records, the batch goes on."""
    from vlmspec_cli.plot import grid_heatmap
    from vlmspec_cli.session import tree_methods

    heatmap = heatmap and session.profile.method in tree_methods()   # trees have accept lengths
    summary = BatchSummary(items=len(jobs))
    todo = []
    for job in jobs:
        if job.error is None and skip_existing and not files_to_write(
                job, heatmap, force=force, skip_existing=True):
            summary.skipped += 1
        else:
            todo.append(job)
    events.batch_started(len(todo), summary.skipped)
    rows, cols = session.target.adapter.image_grid(session.target)
    if compare:
        warm_up_compare(session, [lambda j=job: image_request(session, j)
                                  for job in todo[:3] if job.error is None])
    for job in todo:
        record = base_record(session, job)
        events.item_started(job)
        try:
            if job.error:
                raise ValueError(job.error)
            writes = files_to_write(job, heatmap, force=force, skip_existing=skip_existing)
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
                if not same and session.sampling.greedy and session.lossless:
                    summary.mismatches += 1
                record["compare"] = {"target_only_s": round(base_s, 4), "identical": same,
                                     "speedup": round(base_s / stats.wall_s, 3) if stats.wall_s else None}
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


def _reason(exc: Exception) -> str:
    if isinstance(exc, FileExistsError):
        return f"exists ({_KEEP_HINT})"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__
