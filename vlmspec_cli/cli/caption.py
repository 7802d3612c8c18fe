"""``vlmspec caption``: parse the options into a profile and jobs (tasks/caption.py);
cli/jobs.py runs them."""

from __future__ import annotations

import sys

import click

from vlmspec_cli.cli.common import (decode_options, decoding_profile, fail, method_option,
                                    model_options, nonempty_path, parse_inputs, profile_option,
                                    set_option)
from vlmspec_cli.cli.jobs import run_job_command
from vlmspec_cli.cli.types import Count, CountOrAuto, Utf8Text

EPILOG_CAPTION = """\b
Examples:
  # embedded tinyworld models
  vlmspec caption examples/images/
  vlmspec caption a.png b.png --prompt "what colour is the circle?"
  # rerun resumes
  vlmspec caption 'shots/**/*.png' --out captions.jsonl
  find . -name '*.png' | vlmspec caption - --json | jq \\
      .stats.mean_acceptance_length
  vlmspec caption img.png --method chain --inputs text --compare
  vlmspec caption imgs/ --method tabed --inputs M,T,C,P --trace weights.jsonl
  # 8 inputs decoded together
  vlmspec caption imgs/ --batch-size 8 --out caps.jsonl
  # draft trees
  vlmspec caption imgs/ -m tree --set tree.top_k=2 --set tree.total_tokens=16
  # next assistant turn of each
  vlmspec caption --chat conversations.jsonl --json
  # self-speculation, no draft model
  vlmspec caption imgs/ --profile tinyworld-twig
  # lossy
  vlmspec caption imgs/ -p tinyworld-twig --set prune.keep=3 --set \\
      prune.final_wipe=6
  vlmspec caption img.png --profile llava15-7b --dry-run
  # Ray actor pool
  vlmspec caption shots/ --executor ray --workers 4 --out caps.jsonl

Exit codes: 0 all inputs done, 1 some input failed (the rest were still
done and written), 2 usage, profile, model-loading or output error (--out or
--trace unusable: checked before any model loads), 130 interrupted (Ctrl-C), 143 terminated (SIGTERM),
141 stdout closed by its reader (`| head`).
"""


@click.command(epilog=EPILOG_CAPTION)
@click.argument("inputs", nargs=-1, metavar="INPUTS...")
@click.option("--prompt", type=Utf8Text(), help="Question or instruction for every image [profile: generation.prompt].")
@profile_option()
@model_options
@method_option("caption")
@click.option("--inputs", "drafting_inputs", metavar="LIST",
              help="Drafting inputs, comma-separated: multimodal,text,caption,pooled "
                   "(or letters M,T,C,P) [profile: drafting.inputs].")
@click.option("--chat", "chat_file", type=click.Path(dir_okay=False), metavar="FILE.jsonl",
              help="Conversations (JSONL, one per line; see README) instead of INPUTS: "
                   "write each one's next assistant turn.")
@click.option("--trace", "trace_file", type=click.Path(dir_okay=False, writable=True),
              callback=nonempty_path, metavar="FILE.jsonl", help="tabed: append one line per drafting block "
                                         "(weights, drafted, accepted) for plots.")
@set_option
@click.option("--batch-size", "-b", type=CountOrAuto(min=1),
              help="Decode B inputs together (methods none, chain, tabed, tree, twig without "
                   "pruning, and hidden and eagle3); each output is the one decoded alone. auto: the largest B that "
                   "fits the memory at hand and still raises the throughput measured on the "
                   "first inputs [profile: generation.batch_size, default 1].")
@decode_options("input", "INPUT")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: decode here; ray: shard over a Ray actor pool, one session per GPU "
                   "(or --workers CPU actors), same records and resume (needs "
                   "pip install 'vlmspec[ray]'; not with --chat, --compare or --trace).")
@click.option("--workers", type=Count(min=1), default=2, show_default=True,
              help="ray: actors in the pool (at most one per GPU).")
@click.option("--ray-address", metavar="ADDR",
              help="ray: an existing cluster (auto, ray://HOST:10001); default a local Ray.")
def caption(inputs, prompt, profile, method, drafting_inputs, chat_file, trace_file, sets,
            max_new_tokens, batch_size, temperature, seed, device, fast_path, compile_steps, out, as_json, compare,
            dry_run, quiet, executor, workers, ray_address):
    """Caption images or answer a question about each one, or continue conversations.

    INPUTS are image files, directories (searched recursively), glob patterns,
    or - to read newline-separated paths from stdin (or one image: cat img.png |
    vlmspec caption -). Results go to stdout (text
    or --json), progress and the summary table to stderr.
    """
    from vlmspec_cli.session import SessionError, validate_method
    from vlmspec_cli.tasks.caption import chat_jobs, image_jobs
    from vlmspec_cli.tasks.inputs import InputError, expand_inputs

    if not inputs and not chat_file:
        raise click.UsageError("no INPUTS given (files, directories, globs, or - for stdin), "
                               "and no --chat FILE")
    if inputs and chat_file:
        raise click.UsageError("give either INPUTS or --chat FILE, not both")
    if executor == "ray" and (chat_file or compare or trace_file):
        raise click.UsageError("--executor ray captions image INPUTS only: drop --chat, "
                               "--compare and --trace, or use --executor local")
    ctx = click.get_current_context()
    for name, flag in (("workers", "--workers"), ("ray_address", "--ray-address")):
        given = ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE
        if given and executor != "ray":   # silently ignored before
            raise click.UsageError(f"{flag} is for the Ray actor pool: add --executor ray")
    cli_values = {
        "method": method, "drafting.inputs": parse_inputs(drafting_inputs),
        "generation.prompt": prompt, "generation.max_new_tokens": max_new_tokens,
        "generation.batch_size": batch_size,
        "sampling.temperature": temperature, "sampling.seed": seed,
        "target.device": device, "draft.device": device, "runtime.fast_path": fast_path,
        "runtime.compile": compile_steps,
    }
    prof = decoding_profile(profile, sets, cli_values, task="caption")
    try:
        method_cls = validate_method(prof)
    except SessionError as exc:
        fail(str(exc))
    if trace_file and not method_cls.traces:   # it wrote an empty file, without a word
        fail(f"--trace {trace_file}: method '{prof.method}' has no per-block trace; --trace "
             "records TABED's weights per drafting block (--method tabed)")
    if chat_file:
        try:
            items = chat_jobs(chat_file)
        except InputError as exc:
            fail(str(exc))
    else:
        items = image_jobs(expand_inputs(inputs, stdin=sys.stdin, stdin_image=executor == "local"),
                           prof.generation.prompt)
    run_job_command(prof, items, noun="input(s)", out=out, as_json=as_json, compare=compare,
                    dry_run=dry_run, quiet=quiet, trace=trace_file, check_prompt=not chat_file,
                    **(_on_ray(prof, items, workers, ray_address) if executor == "ray" else {}))


def _on_ray(prof, items, workers: int, address: str | None) -> dict:
    """run_job_command's arguments that send the batch to a Ray actor pool (the workers
    load the models, not this process), with Ray's own stderr lines hidden."""
    from vlmspec_cli.cli.noise import ray_backend_lines_hidden

    def remote(events, sink, emit):
        from vlmspec_cli.tasks.ray_executor import RayExecutorError, run_ray

        try:
            return run_ray(prof, items, events, sink=sink, emit=emit, workers=workers,
                           address=address)
        except RayExecutorError as exc:
            fail(str(exc))
    return {"remote": remote, "remote_context": ray_backend_lines_hidden}
