"""The ``vlmspec`` command line: one module per command, common.py for what they share,
types.py for the option types. Parse, build a run, print; no model code here."""

from __future__ import annotations

import click

from vlmspec_cli import __version__
from vlmspec_cli.cli.bench import bench
from vlmspec_cli.cli.calibrate import calibrate_cmd
from vlmspec_cli.cli.caption import caption
from vlmspec_cli.cli.common import fail
from vlmspec_cli.cli.stops import stop_code, stop_on_sigterm, stop_word
from vlmspec_cli.cli.hwprofile import profile_cmd
from vlmspec_cli.cli.image import generate_image
from vlmspec_cli.cli.noise import silence_library_noise
from vlmspec_cli.cli.profiles import profiles
from vlmspec_cli.cli.run import run_recipe
from vlmspec_cli.cli.video import describe_video


class _Group(click.Group):
    """Ctrl-C in any command exits 130, SIGTERM 143 (click's default is "Aborted!" and 1,
    the code of "some input failed")."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as exc:
            fail(stop_word(exc), stop_code(exc))


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", "-V", prog_name="vlmspec")
def cli() -> None:
    """Lossless speculative decoding for vision-language models.

    A small draft proposes tokens and the target verifies them in one pass: at
    temperature 0 the output is token-identical to the target's own greedy
    decoding, at T>0 it follows the target's distribution. Runs offline on the
    embedded tinyworld models by default.
    """
    silence_library_noise()



for _command in (caption, generate_image, describe_video, profiles, profile_cmd, calibrate_cmd,
                 bench, run_recipe):
    cli.add_command(_command)


def main() -> None:
    stop_on_sigterm()
    cli(prog_name="vlmspec")
