"""``vlmspec calibrate``: pick the method for this hardware (tasks/calibrate.py does the work)."""

from __future__ import annotations

import json
import sys

import click

from vlmspec_cli.cli.common import fail, load_profile, profile_option, set_option
from vlmspec_cli.cli.types import FiniteFloat, IntList, Seed


EPILOG_CALIBRATE = """\b
Examples:
  vlmspec calibrate examples/images/ --write tuned          # -> profiles/tuned.yaml
  vlmspec calibrate -p mine.yaml shots/*.png --gammas 2,3,4,6 --budget 300
  vlmspec caption shots/ --profile tuned                    # use the winner

Include a `vlmspec profile` hardware YAML in the base profile to make the choice
deterministic (the latency model then comes from it instead of a fresh measurement).
"""


@click.command("calibrate", epilog=EPILOG_CALIBRATE)
@click.argument("samples", nargs=-1, metavar="SAMPLES...")
@profile_option()
@set_option
@click.option("--gammas", type=IntList(min=1), default="1,2,3,4,5,6,8", show_default=True,
              metavar="G,G,...", help="Draft lengths γ to consider.")
@click.option("--top", type=click.IntRange(min=1), default=3, show_default=True,
              help="Modelled-best candidates decoded for real (plus the profile's own).")
@click.option("--budget", type=FiniteFloat(min=1), default=120, show_default=True,
              metavar="SECONDS", help="Stop probing / measuring new candidates after this.")
@click.option("--margin", type=FiniteFloat(min=0), default=0.10, show_default=True,
              help="Prefer a measured candidate over the modelled best only when it was "
                   "this much faster (0.10 = 10%); large values keep the modelled choice.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), help="Token limit per sample.")
@click.option("--seed", type=Seed(), help="Sampling seed [profile: sampling.seed].")
@click.option("--device", help="auto | cpu | cuda | cuda:N | mps.")
@click.option("--write", "write_name", metavar="NAME|FILE.yaml",
              help="Write the winner as a profile including the base one (NAME -> profiles/NAME.yaml).")
@click.option("--force", is_flag=True, help="Overwrite an existing --write profile (only a vlmspec "
                                            "profile, never the base or one it includes).")
@click.option("--json", "as_json", is_flag=True, help="Print all candidates as JSON on stdout.")
@click.option("--quiet", "-q", is_flag=True, help="No progress or table on stderr.")
def calibrate_cmd(samples, profile, sets, gammas, top, budget, margin, max_new_tokens, seed, device,
                  write_name, force, as_json, quiet):
    """Pick the drafting method, inputs and γ that decode SAMPLES fastest here.

    Measures acceptance of every drafting variant once, models each γ with the latency
    profile (Eq. 1 with measured verification cost), decodes the best candidates for real
    against target-only decoding, and prints a ranked table.
    """
    from vlmspec_cli import ui
    from vlmspec_cli.runtime.limits import check_fits
    from vlmspec_cli.runtime.models import ModelLoadError
    from vlmspec_cli.session import SessionError
    from vlmspec_cli.tasks.calibrate import (as_dicts, calibrate, calibration_session,
                                             check_profile_write, include_for, profile_write_path,
                                             sample_requests, winner_yaml, write_profile)
    from vlmspec_cli.tasks.inputs import expand_inputs
    from vlmspec_cli.tasks.output_files import OutputRefused

    if not samples:
        raise click.UsageError("no SAMPLES given (images, directories or globs)")
    gamma_list = list(gammas)
    prof = load_profile(profile, sets, {"generation.max_new_tokens": max_new_tokens,
                                         "sampling.seed": seed, "target.device": device,
                                         "draft.device": device}, task="caption")
    items = expand_inputs(samples, stdin=sys.stdin)
    inputs = [item.path for item in items]
    path = profile_write_path(write_name) if write_name else None
    if path is not None:
        try:
            check_profile_write(path, prof.source, force=force, inputs=inputs)  # before any work
        except OutputRefused as exc:
            fail(str(exc))
    requests, errors = sample_requests(prof, items)
    for line in errors:
        ui.error(line)
    if not requests:
        fail("no usable samples")
    try:
        session, captioner, note = calibration_session(prof)
        for request in requests:  # the samples share the prompt: one too long, all are
            check_fits(session, request)
    except (SessionError, ModelLoadError, ValueError) as exc:
        fail(str(exc))
    if note:
        ui.warning(note)
    gamma_list = sorted(set(gamma_list) | {prof.drafting.gamma})  # the profile's own γ too
    with ui.Status(quiet) as status:
        candidates, winner = calibrate(session, requests, gammas=gamma_list, captioner=captioner,
                                       top=top, budget_s=budget, margin=margin,
                                       progress=status.update)
    if not quiet:
        ui.calibration_table(candidates, winner)
    if path is not None:
        text = winner_yaml(winner, prof.source, path.stem, include_for(profile, prof.source, path),
                           candidates)
        try:
            write_profile(path, text, force=force, inputs=inputs)
        except OutputRefused as exc:
            fail(str(exc))
        if not quiet:
            ui.info(f"wrote {path}: {winner.label}")
    if as_json:
        click.echo(json.dumps({"winner": winner.label, "candidates": as_dicts(candidates)}))
    else:
        click.echo(winner.label)
    sys.exit(1 if errors else 0)

