"""``vlmspec generate-image``: parse, build the run, print (tasks/imagegen.py does the work)."""

from __future__ import annotations

import json
import os
import sys

import click

from vlmspec_cli.cli.common import (TSV_HELP, decoding_profile, echo_result, fail, finish_batch,
                                    method_option, model_options, nonempty_path, print_plan,
                                    profile_option, set_option, start_decoding, stdout_guard,
                                    tsv_field)
from vlmspec_cli.cli.detail import verbose, verbose_option
from vlmspec_cli.cli.types import Count, FiniteFloat, Seed, Utf8Text

DEFAULT_IMAGE_PROFILE = "tinyworld-image"

EPILOG_IMAGE = """\b
Examples:
  # tinyworld, ADT-Tree
  vlmspec generate-image "a red circle on a blue background"
  vlmspec generate-image "a red circle above a blue square" -n 4 -t 1 \\
      --out-dir imgs/
  vlmspec generate-image --prompts-file prompts.txt --json > records.jsonl
  # resume
  cat prompts.txt | vlmspec generate-image --prompts-file - --skip-existing
  vlmspec generate-image "a green square" -m tree --set tree.policy=static \\
      --compare
  # acceptance length per token
  vlmspec generate-image "a white diamond" --heatmap
  # LANTERN, lossy
  vlmspec generate-image "a red circle" --set acceptance=relaxed

Files are named NNN-prompt-words-K.png (NNN: the prompt's index, K: the image's
index); image K of a prompt uses seed --seed + K. Existing files are never
overwritten without --force. Exit codes: 0 all images written, 1 some image
failed (the rest were still written), 2 usage, profile or model-loading error.
"""


@click.command("generate-image", epilog=EPILOG_IMAGE)
@click.argument("prompts", nargs=-1, metavar="PROMPT...", type=Utf8Text())
@click.option("--prompts-file", type=click.Path(allow_dash=True), metavar="FILE",
              help="More prompts, one per line of UTF-8 text (- for stdin; blank and # lines "
                   "skipped; a regular file, at most 64 MiB, lines up to 1 MiB).")
@click.option("-n", "--images-per-prompt", "n", type=Count(min=1),
              help="Images per prompt, at most 10,000 [profile: image.images_per_prompt, "
                   "default 1].")
@click.option("--out-dir", "-o", default="images", show_default=True,
              type=click.Path(file_okay=False), callback=nonempty_path,
              help="Folder for the PNG files (created).")
@profile_option(DEFAULT_IMAGE_PROFILE)
@model_options
@set_option
@method_option("image")
@click.option("--cfg", type=FiniteFloat(min=0),
              help="Classifier-free guidance scale [profile: image.cfg; default the model's].")
@click.option("--temperature", "-t", type=FiniteFloat(min=0), help="0 = greedy (default); >0 samples.")
@click.option("--seed", type=Seed(), help="Seed of the first image of each prompt (+K for image K).")
@click.option("--device", help="auto | cpu | cuda | cuda:N | mps, for target and draft.")
@click.option("--fast-path", type=click.Choice(["auto", "on", "off"]),
              help="Decoding steps on vlmspec's static-cache fast path (auto: where "
                   "the model family allows; default) or through transformers (off).")
@click.option("--compile", "compile_steps", type=click.Choice(["auto", "on", "off"]),
              help="Compile the fast path's steps with torch.compile (auto: only where "
                   "`vlmspec profile --compile` measured that it pays; default).")
@click.option("--heatmap", is_flag=True,
              help="Also write NAME.heatmap.png: each token's acceptance length (tree methods).")
@click.option("--force", is_flag=True, help="Overwrite existing files (only PNGs vlmspec wrote).")
@click.option("--skip-existing", is_flag=True, help="Keep existing files and skip their images (resume).")
@click.option("--json", "as_json", is_flag=True,
              help=f"Write JSONL records to stdout instead of FILE<TAB>PROMPT lines ({TSV_HELP}).")
@click.option("--compare", is_flag=True, help="Also decode with the target alone: speedup and identity.")
@click.option("--dry-run", is_flag=True, help="Show the resolved profile and the planned files; load nothing.")
@click.option("--quiet", "-q", is_flag=True, help="No progress or summary on stderr (errors still shown).")
@verbose_option
def generate_image(prompts, prompts_file, n, out_dir, profile, sets, method, cfg, temperature,
                   seed, device, fast_path, compile_steps, heatmap, force, skip_existing, as_json, compare, dry_run, quiet):
    """Generate images from text prompts with an autoregressive image-token model
    (Janus or Emu3 family), drafted speculatively: lossless unless acceptance is relaxed.

    Each image's tokens are decoded in raster order and turned into pixels by the
    model's VQ decoder. Paths (or --json records) go to stdout; progress per image
    token and the summary to stderr.
    """
    from vlmspec_cli import ui
    from vlmspec_cli.runtime.models.loading import ModelLoadError
    from vlmspec_cli.session import SessionError, build_session, tree_methods, validate_method
    from vlmspec_cli.tasks.imagegen import plan_jobs, run_images

    if force and skip_existing:
        raise click.UsageError("--force and --skip-existing contradict each other; pick one")
    texts = list(prompts) + _read_prompts(prompts_file)
    if not texts and prompts_file:
        fail(f"--prompts-file {prompts_file}: holds no prompts (only blank and # lines)")
    if not texts:
        raise click.UsageError("no PROMPT given (arguments or --prompts-file)")
    cli_values = {"method": method, "image.cfg": cfg, "image.images_per_prompt": n,
                  "sampling.temperature": temperature, "sampling.seed": seed,
                  "target.device": device, "draft.device": device,
                  "runtime.fast_path": fast_path, "runtime.compile": compile_steps}
    prof = decoding_profile(profile or DEFAULT_IMAGE_PROFILE, sets, cli_values, task="image")
    try:
        method_cls = validate_method(prof)
    except SessionError as exc:
        fail(str(exc))
    if heatmap and prof.method not in tree_methods() and not quiet:   # it was silent
        ui.warning(f"--heatmap: method '{prof.method}' drafts no trees, so there is no "
                   f"acceptance per token to map (methods {', '.join(tree_methods())} have one)")
    jobs = plan_jobs(texts, _images_per_prompt(prof), prof.sampling.seed, out_dir)
    if dry_run:
        _print_plan(prof, jobs, heatmap and prof.method in tree_methods(), as_json)
        return
    _hold_out_dir(out_dir)
    if prof.sampling.temperature == 0 and prof.image.images_per_prompt > 1 and not quiet:
        ui.warning("temperature 0: the images of a prompt are identical; use -t 1 for variety")
    if not quiet and verbose():   # else one short line once the models are loaded
        ui.info(f"profile {prof.name}: target {prof.target.model}, method {prof.method}"
                + (f", draft {prof.draft.model}" if method_cls.uses_draft else "")
                + (", relaxed acceptance (lossy)" if prof.acceptance == "relaxed" else ""))
    try:
        session = build_session(prof)
    except (SessionError, ModelLoadError, ValueError) as exc:
        fail(str(exc))
    tokens = session.target.adapter.num_image_tokens(session.target)
    start_decoding(session, len(jobs) * tokens, quiet)

    depths: list[float] = []

    def emit(record: dict) -> None:
        trees = (record.get("stats") or {}).get("trees")
        if trees and trees.get("depths"):
            depths.extend(trees["depths"])
        printed(record)

    def print_record(record: dict) -> None:
        if as_json:
            echo_result(json.dumps(record, ensure_ascii=False))
        elif record["error"] is None:
            echo_result(f"{tsv_field(record['file'])}\t{tsv_field(record['prompt'])}")
    # the images are this command's output: when stdout fails, they are still written
    printed = stdout_guard(print_record, f"writing its images to {out_dir} (their records "
                                         "are not printed)")

    replaced: list[str] = []
    with ui.BatchUI(quiet=quiet, label="images") as events:
        summary = run_images(session, jobs, events, force=force, skip_existing=skip_existing,
                             heatmap=heatmap, compare=compare, emit=emit, replaced=replaced)
    for path in [] if quiet else replaced:   # --force replaces only PNGs vlmspec wrote
        ui.info(f"replaced {path} (an image vlmspec wrote)")
    extra = {"mean tree depth d̄": f"{sum(depths) / len(depths):.2f}"} if depths else {}
    finish_batch(prof, summary, quiet, extra, outputs="image(s)")


def _hold_out_dir(out_dir) -> None:
    """--out-dir made if missing, checked writable and held for this command (one line,
    exit 2, when it cannot be or another run holds it); released when the command ends,
    however it ends, and removed then if this run made it and left it empty."""
    from vlmspec_cli.tasks.imagegen import check_out_dir, lock_out_dir

    made = not os.path.lexists(out_dir)
    problem = check_out_dir(out_dir)
    held, busy = lock_out_dir(out_dir) if problem is None else (None, None)
    if problem or busy:
        fail(problem or busy)
    ctx = click.get_current_context()
    if made:   # a folder this run made and left empty (the models failed to load) goes
        ctx.call_on_close(lambda: _remove_if_empty(out_dir))
    if held is not None:
        ctx.call_on_close(lambda: os.close(held))


def _remove_if_empty(folder) -> None:
    try:
        os.rmdir(folder)   # only an empty folder: never a file or anything in it
    except OSError:
        pass


def _read_prompts(path: str | None) -> list:
    """--prompts-file's prompts (exit 2 with one line when the file cannot be read)."""
    from vlmspec_cli.tasks.imagegen import PromptsFileError, read_prompts

    try:
        return read_prompts(path, sys.stdin) if path else []
    except PromptsFileError as exc:
        fail(str(exc))


def _images_per_prompt(prof) -> int:
    """-n / image.images_per_prompt, at most MAX_IMAGES_PER_PROMPT (exit 2 past it)."""
    from vlmspec_cli.tasks.imagegen import MAX_IMAGES_PER_PROMPT

    n = prof.image.images_per_prompt
    if n > MAX_IMAGES_PER_PROMPT:
        fail(f"-n / image.images_per_prompt {n} is more than {MAX_IMAGES_PER_PROMPT} "
             "images per prompt; run the rest as another batch (--seed picks up where it ended)")
    return n


DRY_RUN_LINES = 1000   # planned files shown by --dry-run; the rest are counted


def _print_plan(prof, jobs, with_map: bool, as_json: bool = False) -> None:
    from vlmspec_cli.tasks.imagegen import heatmap_path

    rows = ((f"{j.path}  seed={j.seed}" + (
        f"  + {heatmap_path(j.path).name}" if with_map and not j.error else ""), j.error)
        for j in jobs)
    json_rows = ({"file": j.path, "prompt": j.prompt, "seed": j.seed, "error": j.error,
                  "heatmap": str(heatmap_path(j.path)) if with_map and not j.error else None}
                 for j in jobs)
    print_plan(prof, "image(s)", rows, total=len(jobs), limit=DRY_RUN_LINES, as_json=as_json,
               json_rows=json_rows)

