"""``vlmspec profile``: measure this hardware (tasks/hwprofile.py does the work)."""

from __future__ import annotations

import json
import os

import click

from vlmspec_cli.cli.common import (decoding_profile, fail, method_option, model_options,
                                    nonempty_path, profile_option, set_option)
from vlmspec_cli.cli.detail import verbose, verbose_option
from vlmspec_cli.cli.types import Count, FiniteFloat, IntList


EPILOG_PROFILE = """\b
Examples:
  # default profile, YAML to stdout
  vlmspec profile
  vlmspec profile -p tinyworld-tabed --write hw-cpu.yaml --plot hw-cpu.png
  vlmspec profile --contexts 128,1024 --repeats 30 --tau 3.2 --json
  # also time compiled steps (runtime.compile)
  vlmspec profile --compile --write hw.yaml
  # the hidden-state head's own rounds
  vlmspec profile -p tinyworld-hidden
  # CPU thread counts for rounds and prefill
  vlmspec profile --threads 1,2 --write hw.yaml
  # prefill, steps, drafting vs frames
  vlmspec profile -p tinyworld-video --frames 4,16,64
  # guided steps, tree sizes, ADT rounds
  vlmspec profile -p tinyworld-image --plot img.png

Then put `include: hw-cpu.yaml` in a profile to carry the measured numbers.
"""


@click.command("profile", epilog=EPILOG_PROFILE)
@profile_option()
@model_options
@method_option()
@set_option
@click.option("--device", help="auto | cpu | cuda | cuda:N | mps, for target and draft.")
@click.option("--write", "write_path", type=click.Path(dir_okay=False), metavar="FILE.yaml",
              callback=nonempty_path,
              help="Write the hardware profile here (atomically) instead of to stdout.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), metavar="FILE.png",
              callback=nonempty_path,
              help="Draw T vs tokens verified, context length S and batch rows B.")
@click.option("--contexts", type=IntList(min=1), metavar="S,S,...",
              help="Extra context lengths S to time, positive integers [256,512].")
@click.option("--repeats", type=Count(min=3), default=15, show_default=True,
              help="Timed calls per number (the median is kept).")
@click.option("--warmup", type=Count(min=0), default=3, show_default=True,
              help="Untimed calls before each number's timed ones.")
@click.option("--tau", type=FiniteFloat(min=1), help="Also give Eq. 1's speedup for this τ.")
@click.option("--compile", "compile_steps", is_flag=True,
              help="Also time the fast path's steps compiled with torch.compile and the "
                   "compile warm-up; runtime.compile: auto decides from these numbers.")
@click.option("--frames", type=IntList(min=1), metavar="N,N,...",
              help="Video profiles: the video lengths (frames) to time [4,8,16,32].")
@click.option("--threads", type=IntList(min=1, max=1024),   # profile.schema.MAX_THREADS
              metavar="N,N,...",
              help="CPU thread counts to try (default 1, 2, 4, … up to the cores); the fastest "
                   "for the rounds and for the prefill are recorded as hardware.threads and "
                   "hardware.prefill_threads, which runtime.threads / prefill_threads: auto use.")
@click.option("--force", is_flag=True, help="Overwrite an existing --write / --plot file (only "
                                            "a hardware profile / a PNG vlmspec wrote; never the --profile).")
@click.option("--json", "as_json", is_flag=True, help="Print the numbers as JSON on stdout.")
@click.option("--quiet", "-q", is_flag=True, help="No progress or table on stderr.")
@verbose_option
def profile_cmd(profile, method, sets, device, write_path, plot_path, contexts, repeats, warmup, tau,
                compile_steps, frames, threads, force, as_json, quiet):
    """Measure this hardware: target and draft step times, the latency ratio T_q/T_p,
    TABED's Remarks 1-3 and Eq. 1's expected speedup, written as a YAML hardware profile.

    Times are medians over --repeats calls after --warmup, with the device synchronised.
    """
    from vlmspec_cli import ui
    from vlmspec_cli.runtime.models.loading import ModelLoadError
    from vlmspec_cli.session import SessionError, build_session
    from vlmspec_cli.tasks.hwprofile import (check_contexts, check_frames, run_profile,
                                             sample_request)
    from vlmspec_cli.tasks.hwprofile_files import check_outputs, hardware_yaml, save_outputs
    from vlmspec_cli.tasks.output_files import OutputRefused

    prof = decoding_profile(profile, sets, {"method": method, "target.device": device,
                                            "draft.device": device})
    if prof.task == "image" and (contexts or compile_steps):
        fail(f"{'--contexts' if contexts else '--compile'}: profile '{prof.name}' is for task "
             "'image', timed at its sample prompt and without compiled steps")
    if frames and prof.task != "video":
        fail(f"--frames: profile '{prof.name}' is for task '{prof.task}'; --frames times videos")
    extra = contexts or None
    try:
        check_outputs(write_path, plot_path, prof.source, force)  # before anything loads
        session = build_session(prof)
        if prof.task != "image":   # an image profile's sample is a prompt and its grid
            session.check_fits(sample_request(prof))
        extra, note = check_contexts(session.target, extra)
        check_frames(session, frames)
        if compile_steps and session.target.fast is None:
            raise ValueError("--compile times the fast path's compiled steps; the target is not "
                             f"on the fast path ({session.target.fast_off_reason})")
    except (OutputRefused, SessionError, ModelLoadError, ValueError) as exc:
        fail(str(exc))
    if note:
        ui.warning(note)
    with ui.Status(quiet, log=True) as status:   # "step i/N, ETA ~Xs: …"
        try:
            hardware = run_profile(session, contexts=extra, warmup=warmup, repeats=repeats,
                                   tau=tau, progress=status.update, compile_steps=compile_steps,
                                   frames=list(frames) if frames else None,
                                   threads=list(threads) if threads else None)
        except ValueError as exc:
            fail(str(exc))
    if not quiet:
        show_table(hardware)
    existed = {str(p) for p in (write_path, plot_path) if p and os.path.lexists(p)}
    try:
        written = save_outputs(write_path, plot_path, hardware, prof.source, force)
    except OutputRefused as exc:
        fail(str(exc))
    for path in [] if quiet else written:   # --force replaces only vlmspec profile's own
        ui.info(f"replaced {path} (written by an earlier vlmspec profile)" if str(path) in existed
                else f"wrote {path}")
    if as_json:
        click.echo(json.dumps(hardware))
    elif not write_path:
        click.echo(hardware_yaml(hardware, prof.source), nl=False)




def show_table(hardware: dict) -> None:
    """The table; with -v TABED's remarks said as sentences; a line for what is still off."""
    from vlmspec_cli import ui
    from vlmspec_cli.cli.hwprofile_table import latency_rows, remark_lines, suspect_line

    ui.latency_table(hardware["device"], latency_rows(hardware))
    if verbose():
        for line in remark_lines(hardware["measurements"]["remarks"]):
            ui.info(line)
    line = suspect_line(hardware)
    if line:
        ui.warning(line)
