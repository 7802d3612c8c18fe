"""``vlmspec calibrate``: pick the method for this hardware (tasks/calibrate.py does the work)."""

from __future__ import annotations

import json
import os
import sys
import time

import click

from vlmspec_cli.cli.common import (decoding_profile, fail, method_option, model_keys,
                                    model_options, nonempty_path, profile_option, set_option)
from vlmspec_cli.cli.types import Count, FiniteFloat, IntList, Seed
from vlmspec_cli.tasks.calibrate_model import hardware_mismatch
from vlmspec_cli.tasks.records import SCHEMA


EPILOG_CALIBRATE = """\b
Examples:
  # -> profiles/tuned.yaml
  vlmspec calibrate examples/images/ --write tuned
  vlmspec calibrate -p mine.yaml shots/*.png --gammas 2,3,4,6 --budget 300
  # use the winner
  vlmspec caption shots/ --profile tuned
  vlmspec calibrate -p tinyworld-image "a red circle" "a blue square" \\
      --write img-tuned
  vlmspec calibrate -p tinyworld-video examples/videos/ --write video-tuned
  # your own heads and twigs
  vlmspec calibrate shots/ --hidden ./my-head --eagle3 ./my-eagle3 \\
      --twig ./my-twig

\b
What is searched, by the profile's task:
  caption  chain x input (M T C P) x gamma, TABED MT* and MTCP*, draft trees
           (depth x top_k x total_tokens, dynamic and static), hidden-state
           and EAGLE-3 heads (chain x gamma, trees), twigs x theta x gamma,
           then --batch-size 2 and 4 for several samples
  image    ADT-Tree bounds x beta, fixed draft trees (SAMPLES are prompts)
  video    the draft's chain x gamma, hidden-state and EAGLE-3 heads (chain
           x gamma, trees)
Every family is probed at least once within --budget, the likeliest first.

Include a `vlmspec profile` hardware YAML in the base profile to make the choice
deterministic (the latency model then comes from it instead of a fresh measurement).
"""


CALIBRATE_LEGEND = (
    "τ: tokens per target pass (1 + drafted tokens accepted per round), τ model from the "
    "probe, τ meas. as decoded for real; predicted: the modelled speedup; speedup meas.: "
    "target-only's decoding time ÷ the candidate's on the same samples, each decoded by "
    "both back to back (min/median/max per sample); error: predicted ÷ measured − 1; "
    "-: modelled only, not decoded for real")


def _gammas(gammas: list[int], method, base) -> list[int]:
    """The γ values the chain probes replay: --gammas, and the profile's own γ where its
    method drafts chains of γ (its answer; a tree's depth is no chain's length)."""
    own = {method.gamma(base)} if method.own_probe(base)[0] else set()
    return sorted(set(gammas) | own)


@click.command("calibrate", epilog=EPILOG_CALIBRATE)
@click.argument("samples", nargs=-1, metavar="SAMPLES...")
@profile_option()
@model_options
@method_option()
@set_option
@click.option("--gammas", type=IntList(min=1, max=64),   # 64: profile.schema.MAX_GAMMA
              default="1,2,3,4,5,6,8", show_default=True, metavar="G,G,...",
              help="Draft lengths γ to consider (1 to 64).")
@click.option("--top", type=Count(min=1), default=3, show_default=True,
              help="Modelled-best candidates decoded for real (plus the profile's own).")
@click.option("--budget", type=FiniteFloat(min=1), default=60, show_default=True,
              metavar="SECONDS", help="Time for the search: it ends within the budget and one "
                   "finalist's decode. Every method family is probed at least once (on fewer "
                   "samples when time is short); the profile's own configuration and the "
                   "modelled best are always decoded for real.")
@click.option("--margin", type=FiniteFloat(min=0), default=0.03, show_default=True,
              help="Keep the modelled best unless another candidate measured more than this "
                   "much faster (0.03 = 3%: timing noise); large values keep the modelled choice.")
@click.option("--hidden", "heads", multiple=True, metavar="MODEL",
              help="Also try this hidden-state head (repeatable; the shipped ones for the "
                   "target are tried anyway).")
@click.option("--eagle3", "eagle3_heads", multiple=True, metavar="MODEL",
              help="Also try this EAGLE-3 head (repeatable; as --hidden).")
@click.option("--twig", "twigs", multiple=True, metavar="MODEL",
              help="Also try this twig (repeatable; as --hidden).")
@click.option("--max-new-tokens", type=Count(min=1), help="Token limit per sample.")
@click.option("--seed", type=Seed(), help="Sampling seed [profile: sampling.seed].")
@click.option("--device", help="auto | cpu | cuda | cuda:N | mps.")
@click.option("--write", "write_name", metavar="NAME|FILE.yaml", callback=nonempty_path,
              help="Write the winner as a profile including the base one (NAME -> profiles/NAME.yaml).")
@click.option("--force", is_flag=True, help="Overwrite an existing --write profile (only a vlmspec "
                                            "profile, never the base or one it includes).")
@click.option("--json", "as_json", is_flag=True, help="Print all candidates as JSON on stdout.")
@click.option("--quiet", "-q", is_flag=True, help="No progress or table on stderr.")
def calibrate_cmd(samples, profile, method, sets, gammas, top, budget, margin, heads, eagle3_heads,
                  twigs, max_new_tokens, seed, device, write_name, force, as_json, quiet):
    """Pick the method and its parameters that decode SAMPLES fastest here.

    Measures the acceptance of every configuration the profile's task allows once (chain
    variants at the largest γ stand for every γ), models each with the latency profile
    (Eq. 1 with measured verification cost; with latency timed now, by its probe's own
    timed rounds and prefills), decodes the best candidates and the profile's
    own for real against target-only decoding, and prints a ranked table: measured speedup
    with its spread over the samples, and the prediction's error. Target-only decoding is a
    candidate too: where nothing beats it, the answer is method none. SAMPLES are images
    (caption), prompts (image) or videos (video).
    """
    started = time.perf_counter()      # --budget counts the models' and samples' loading
    from vlmspec_cli import ui
    from vlmspec_cli.runtime.models.loading import ModelLoadError
    from vlmspec_cli.session import SessionError, build_session
    from vlmspec_cli.tasks.calibrate import as_dicts, calibrate
    from vlmspec_cli.tasks.calibrate_io import (check_profile_write, profile_write_path,
                                                sample_requests, search_base)
    from vlmspec_cli.tasks.output_files import OutputRefused

    if not samples:
        raise click.UsageError("no SAMPLES given (images, videos or directories; prompts for an "
                               "image profile)")
    prof = decoding_profile(profile, sets, {"method": method, "sampling.seed": seed,
                                         "generation.max_new_tokens": max_new_tokens,
                                         "target.device": device, "draft.device": device})
    heads, twigs = _absolute_folders(heads, "--hidden"), _absolute_folders(twigs, "--twig")
    eagle3_heads = _absolute_folders(eagle3_heads, "--eagle3")
    items = _sample_items(prof.task, samples)
    inputs = [] if prof.task == "image" else [item.path for item in items]
    path = profile_write_path(write_name) if write_name else None
    if path is not None:
        try:
            check_profile_write(path, prof.source, force=force, inputs=inputs)  # before any work
        except OutputRefused as exc:
            fail(str(exc))
    try:
        base, note = search_base(prof)
        session = build_session(base)
        requests, errors = sample_requests(base, items, session.target)
        for line in errors:
            ui.error(line)
        if not requests:   # every sample failed, each named above: exit 1, as any batch
            fail("no usable samples", 1 if errors else 2)
        for request in requests:  # one too long is refused before anything is measured
            session.check_fits(request)
    except (SessionError, ModelLoadError, ValueError) as exc:
        fail(str(exc))
    for line in filter(None, (note, hardware_mismatch(base))):   # a hardware profile's too
        ui.warning(line)
    with ui.Status(quiet, "calibrate:") as status:
        result = calibrate(base, requests, gammas=_gammas(gammas, session.method, base),
                           captioner_ok=note is None, hidden=heads, twigs=twigs,
                           eagle3=eagle3_heads, top=top,
                           budget_s=budget, margin=margin, progress=status.update, session=session,
                           started=started)
    winner = result.winner
    prediction = result.prediction_errors()
    if not quiet:   # (the winner's line: on stdout, unless stdout is elsewhere)
        ui.calibration_table(result.candidates, winner, result.skipped, result.latency,
                             errors=prediction, target_only=result.target_only, note=result.note,
                             legend=CALIBRATE_LEGEND, winner_line=as_json or not ui.same_terminal())
    if path is not None:
        _write_winner(path, prof, winner, result, base.task, [*sets, *model_keys()], force, inputs,
                      quiet)
    if as_json:
        click.echo(json.dumps({"schema": SCHEMA, "winner": winner.label, "method": winner.method,
                               "task": base.task, "note": result.note, "latency": result.latency,
                               "skipped": result.skipped, "target_only": result.target_only,
                               "prediction_error": prediction,
                               "candidates": as_dicts(result.candidates)}))
    else:
        click.echo(winner.label if quiet or not ui.same_terminal() else f"winner: {winner.label}")
    sys.exit(1 if errors else 0)


def _write_winner(path, prof, winner, result, task: str, sets: list, force: bool, inputs: list,
                  quiet: bool) -> None:
    """--write: the winner as a profile including the base one, with what --set and
    --model pinned."""
    from vlmspec_cli import ui
    from vlmspec_cli.tasks.calibrate_io import include_for, pinned_settings, winner_yaml, write_profile
    from vlmspec_cli.tasks.output_files import OutputRefused

    text = winner_yaml(winner, prof.source, path.stem, include_for(prof.source, path),
                       result.candidates, task=task, pinned=pinned_settings(prof, sets))
    replaced = path.exists()
    try:
        write_profile(path, text, force=force, inputs=inputs)
    except OutputRefused as exc:
        fail(str(exc))
    if not quiet:   # --force replaces only a profile calibrate wrote: say so
        ui.info(f"{'replaced' if replaced else 'wrote'} {path}: {winner.label}")


def _absolute_folders(models, option: str) -> tuple:
    """--hidden / --twig folders made absolute: the written profile's model paths are read
    from its own folder (profiles/), not from this directory. Hub ids stay as given; a name
    written as a path (./m, /m, ~/m) must be a folder: a missing one was listed among the
    candidates "not tried" and calibrate went on (exit 0)."""
    from vlmspec_cli.runtime.models.loading import looks_local

    out = []
    for m in models:
        folder = os.path.expanduser(m)
        if looks_local(m) and not os.path.isdir(folder):
            why = "is not a folder" if os.path.lexists(folder) else "no such folder"
            raise click.BadParameter(f"{m}: {why} (a model folder, or a hub id)",
                                     param_hint=f"'{option}'")
        out.append(os.path.abspath(folder) if os.path.isdir(folder) else m)
    return tuple(out)


def _sample_items(task: str, samples) -> list:
    """Prompts as given (image), or the expanded video / image inputs."""
    if task == "image":
        return list(samples)
    if task == "video":
        from vlmspec_cli.tasks.video import expand_video_inputs

        return expand_video_inputs(samples, stdin=sys.stdin)
    from vlmspec_cli.tasks.inputs import expand_inputs

    return expand_inputs(samples, stdin=sys.stdin)
