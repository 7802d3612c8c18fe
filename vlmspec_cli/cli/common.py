"""What the commands share: the error exit, profile loading, the repeated options, the
--out/--trace sinks, the record printer, the batch summary and the --dry-run plan. click
only; rich through ui.py; no model code."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys

import click

from vlmspec_cli.cli.detail import lossy_row, verbose_option
from vlmspec_cli.cli.types import Count, FiniteFloat, Seed
from vlmspec_cli.drafting_inputs import parse_inputs  # noqa: F401  (--inputs M,T -> names)

# stdout text lines are two tab-separated columns; a file name or a model output can hold
# any character, so these four are escaped in both columns (one line = one record)
_TSV_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"})
TSV_HELP = ("backslash, tab, newline and CR in a column are written as \\\\, \\t, \\n "
            "and \\r")


def tsv_field(text) -> str:
    """One column of a stdout text line, escaped (see _TSV_ESCAPES)."""
    return str(text).translate(_TSV_ESCAPES)


def fail(message: str, code: int = 2):
    """One error line on stderr, then exit ``code``."""
    from vlmspec_cli import ui

    ui.error(message)
    sys.exit(code)


def nonempty_path(ctx, param, value):
    """Callback of an option naming a file or folder to write: an empty name (``--out ''``,
    e.g. an unset shell variable) is refused in one line, never taken as the option left
    out (no output) or as the current folder."""
    if value is not None and value == "":
        opt = param.opts[0]
        what = "folder" if getattr(param.type, "file_okay", True) is False else "file"
        fail(f"{opt} '': an empty {what} name; name a {what} or leave {opt} out")
    return value


# the option that sets each profile key a command line can set: its errors name the option
# the user typed (they said "command line option 'drafting.inputs'" for --inputs)
OPTION_OF_KEY = {"method": "--method", "drafting.inputs": "--inputs", "generation.prompt": "--prompt",
                 "generation.max_new_tokens": "--max-new-tokens", "generation.batch_size": "--batch-size",
                 "sampling.temperature": "--temperature", "sampling.seed": "--seed",
                 "target.device": "--device", "draft.device": "--device",
                 "runtime.fast_path": "--fast-path", "runtime.compile": "--compile",
                 "video.frames": "--frames", "video.fps": "--fps", "video.max_pixels": "--max-pixels",
                 "image.cfg": "--cfg", "image.images_per_prompt": "-n",
                 "target.model": "--model", "draft.model": "--draft"}


def option_labels(cli: dict) -> dict[str, str]:
    """Each set key of ``cli`` as the option and value the user typed ("--inputs M,T")."""
    shown = lambda v: ",".join(map(str, v)) if isinstance(v, (list, tuple)) else v   # noqa: E731
    return {k: f"{OPTION_OF_KEY[k]} {shown(v)}" for k, v in cli.items()
            if k in OPTION_OF_KEY and v is not None}


def load_profile(profile: str | None, sets: tuple[str, ...], cli: dict, task: str | None = None):
    """The resolved profile (exit 2 on a profile error); with ``task``, it must be for it.
    ``--model``/``--draft`` (model_options), where the command has them, count as ``cli``."""
    from vlmspec_cli.profile import ProfileError, load_profile

    ctx = click.get_current_context(silent=True)
    cli = {**cli, **(ctx.meta.get(_MODELS, {}) if ctx is not None else {})}
    try:
        prof = load_profile(profile, overrides=list(sets), cli=cli, labels=option_labels(cli))
    except ProfileError as exc:
        fail(str(exc))
    if task is not None and prof.task != task:
        command = {"caption": "caption", "image": "generate-image", "video": "describe-video"}
        fail(f"profile '{prof.name}' is for task '{prof.task}', this command needs task "
              f"'{task}' (use it with vlmspec {command.get(prof.task, prof.task)}, or pick a "
              f"profile with task: {task})")
    return prof


def decoding_profile(profile: str | None, sets: tuple[str, ...], cli: dict, task: str | None = None):
    """``load_profile`` for a command that decodes: the head or twig its method loads is
    the one shipped for its target (``-m hidden`` on a profile written for another
    target), saying so on stderr; one trained for another target and none shipped for
    this one is refused by ``validate_method``."""
    from vlmspec_cli import ui
    from vlmspec_cli.cli.detail import unread_inputs
    from vlmspec_cli.session import SessionError, match_companions, method_for_models

    prof = load_profile(profile, sets, cli, task)
    try:
        prof, notes = match_companions(prof)
    except SessionError:                 # validate_method says what is wrong
        return prof
    except ValueError as exc:            # an unknown method: named where it was set
        fail(f"{_method_origin(profile, sets, cli)}: {exc}")
    if profile is None and "method" not in option_labels(cli) and not _method_set(sets):
        prof, note = method_for_models(prof)   # --model: the default's head is not for it
        notes += [note] if note else []
    unread = unread_inputs(prof, option_labels(cli))
    for note in notes + ([unread] if unread else []):
        ui.info(note)
    return prof


def _method_set(sets: tuple[str, ...]) -> bool:
    return any(str(item).partition("=")[0].strip() == "method" for item in sets)


def _method_origin(profile: str | None, sets: tuple[str, ...], cli: dict) -> str:
    """Where the profile's ``method`` came from, as its errors name it: the option, the
    last ``--set method=…``, or the profile file."""
    if "method" in option_labels(cli):
        return option_labels(cli)["method"]
    for item in reversed(sets):
        if str(item).partition("=")[0].strip() == "method":
            return f"--set {item}"
    return f"{profile}: key 'method'"


DEFAULT_CAPTION_PROFILE = "tinyworld-caption"   # profile.DEFAULT_PROFILE (not imported: slow)
_MODELS = "vlmspec.models"   # ctx.meta key: the --model/--draft values given


def model_keys() -> list[str]:
    """The profile keys ``--model``/``--draft`` set in this command (``target.model``,
    ``draft.model``), for what it writes (calibrate pins them as it pins ``--set`` keys)."""
    ctx = click.get_current_context(silent=True)
    return list(ctx.meta.get(_MODELS, {})) if ctx is not None else []


def model_options(command):
    """``--model DIR|ID`` and ``--draft DIR|ID``: the target and the draft without a profile
    file (``--set target.model=…``, ``--set draft.model=…`` in one word each, read from the
    current directory). The family comes from the model's config; the rest of the settings
    from the profile (the command's default one without ``-p``)."""
    def keep(key: str):
        def callback(ctx, param, value):
            if value is not None:
                if not value.strip():
                    raise click.BadParameter("an empty name names no model")
                ctx.meta.setdefault(_MODELS, {})[key] = value
            return value
        return callback

    command = click.option("--draft", metavar="DIR|ID", expose_value=False,
                           callback=keep("draft.model"),
                           help="The draft model: a folder or a hub id [profile: draft.model].")(command)
    return click.option("--model", metavar="DIR|ID", expose_value=False,
                        callback=keep("target.model"),
                        help="The target model: a folder or a hub id [profile: target.model]; "
                             "no profile file needed.")(command)


def profile_option(default: str = DEFAULT_CAPTION_PROFILE):
    """``--profile``; its help names the profile this command uses without one."""
    return click.option("--profile", "-p", metavar="NAME|PATH",
                        help="Profile name (see `vlmspec profiles`) or YAML path "
                             f"[default: {default}].")


class MethodOption(click.Option):
    """``--method``: its help lists the registered methods of the command's task with what
    each does (drafters/: ``DraftingMethod.help``), read from their source when the help is
    shown (method_catalogue.py): importing the methods' modules imports torch and
    transformers, seconds that --help must not take."""

    def __init__(self, *args, task: str | None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.task = task

    def get_help_record(self, ctx):
        if "vlmspec_cli.drafters.base" in sys.modules:   # loaded: the registry itself, with
            from vlmspec_cli.drafters.base import method_help   # methods added at run time
        else:
            from vlmspec_cli.method_catalogue import method_help

        self.help = method_help(self.task)
        return super().get_help_record(ctx)


def method_option(task: str | None = None, short: bool = True):
    """``--method NAME`` (and ``-m`` where the command has no other ``-m``): the profile's
    ``method``. ``task``: the command's (its help lists that task's methods); None where
    the profile decides it (calibrate, profile)."""
    return click.option("--method", *(("-m",) if short else ()), cls=MethodOption, task=task,
                        metavar="NAME", help="the drafting method [profile: method].")


set_option = click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                          help="Override a profile key, e.g. --set drafting.gamma=3 (repeatable; "
                               "`vlmspec profiles --keys` lists the keys).")


def decode_options(noun: str, column: str):
    """The options every decoding command shares (caption, describe-video), in --help order;
    ``noun`` names one input ("input", "video"), ``column`` the first stdout column."""
    options = [
        click.option("--max-new-tokens", type=Count(min=1), help=f"Token limit per {noun}."),
        click.option("--temperature", "-t", type=FiniteFloat(min=0),
                     help="0 = greedy (default); >0 samples."),
        click.option("--seed", type=Seed(),
                     help="Sampling seed, a signed 64-bit integer (recorded in every record)."),
        click.option("--device", help="auto | cpu | cuda | cuda:N | mps, for target and draft."),
        click.option("--fast-path", type=click.Choice(["auto", "on", "off"]),
                     help="Decoding steps on vlmspec's static-cache fast path (auto: where "
                          "the model family allows; default) or through transformers (off)."),
        click.option("--compile", "compile_steps", type=click.Choice(["auto", "on", "off"]),
                     help="Compile the fast path's steps with torch.compile (auto: only where "
                          "`vlmspec profile --compile` measured that it pays; default)."),
        click.option("--out", "-o", type=click.Path(dir_okay=False, writable=True),
                     callback=nonempty_path, metavar="FILE.jsonl", help=f"Append one JSON record per {noun}; a rerun "
                                                f"skips {noun}s already recorded."),
        click.option("--json", "as_json", is_flag=True,
                     help=f"Write JSONL records to stdout instead of {column}<TAB>OUTPUT lines "
                          f"({TSV_HELP})."),
        click.option("--compare", is_flag=True,
                     help="Also decode with the target alone and report the speedup."),
        click.option("--dry-run", is_flag=True,
                     help=f"Show the resolved profile and the {noun}s; load nothing."),
        click.option("--quiet", "-q", is_flag=True,
                     help="No progress or summary on stderr (errors still shown)."),
        verbose_option,
    ]

    def decorate(command):
        for option in reversed(options):
            command = option(command)
        return command
    return decorate


def profile_files(prof) -> list[str]:
    """The files ``prof`` was read from: its own and every file it includes (none for the
    built-in defaults), so no output of the run is written into one of them."""
    from vlmspec_cli.profile import ProfileError
    from vlmspec_cli.profile.loader import include_chain

    if prof is None or prof.source == "<defaults>":
        return []
    try:
        return [str(p) for p in include_chain(prof.source)]
    except ProfileError:   # (it loaded a moment ago; changed since: its own file at least)
        return [prof.source]


@contextlib.contextmanager
def records_sink(out: str | None, inputs: list[str], trace: str | None = None, prof=None):
    """The --out and --trace sinks (None where not given), checked, locked and repaired
    before any model loads -- exit 2 with one line when vlmspec must not or cannot write
    one (tasks/sink.py): never one of ``inputs`` or of the files profile ``prof`` was read
    from, empty or not; its repair notes shown now -- and closed however the run ends. An
    output error during the batch (disk full) exits 2 too."""
    from vlmspec_cli import ui
    from vlmspec_cli.tasks.sink import OutputError, open_outputs

    try:
        sinks = open_outputs(out, inputs, trace, profile_files(prof))
    except OutputError as exc:
        fail(str(exc))
    try:
        for sink in sinks:
            for w in sink.warnings if sink is not None else ():
                ui.warning(w)
        yield sinks
    except OutputError as exc:
        fail(str(exc))
    finally:
        for sink in sinks:
            if sink is not None:
                sink.close()


def echo_result(line: str | bytes) -> None:
    """One result line on stdout; above the progress bars while they share its terminal
    (ui.result), so neither is cut or glued to the other (there, a file name's
    undecodable bytes, kept by stdout_bytes, are shown as stderr shows them)."""
    from vlmspec_cli import ui

    text = line.decode("utf-8", "surrogateescape") if isinstance(line, bytes) else line
    if not ui.result(text):
        click.echo(line)


def record_printer(as_json: bool, sink=None):
    """stdout for each finished record: JSONL, or "input<TAB>output" for the good ones
    (both columns escaped: tsv_field). When stdout fails (a closed pipe, a full disk),
    the batch goes on into ``sink`` (--out) or stops: :func:`stdout_guard`."""
    def emit(record: dict) -> None:
        if as_json:
            echo_result(json_line(record))
        elif record["error"] is None:
            echo_result(stdout_bytes(f"{tsv_field(record['input'])}\t{tsv_field(record['output'])}"))
    return stdout_guard(emit, None if sink is None else f"its records to --out {sink.path} only")


def json_line(record: dict) -> str:
    """A record as one JSON line: UTF-8 text, or ASCII with escapes when it holds a file
    name's undecodable bytes (lone surrogates, which no UTF-8 stdout can write; the same
    rule as the --out file's)."""
    line = json.dumps(record, ensure_ascii=False)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(record, ensure_ascii=True)
    return line


def stdout_bytes(text: str) -> bytes:
    """A text line for stdout as bytes: a file name's undecodable bytes written back as the
    bytes they were (as ls does), whatever stdout's encoding and error handler."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:   # a surrogate no file name holds
        return text.encode("utf-8", "backslashreplace")


EXIT_PIPE_CLOSED = 141   # the shell's code for a process SIGPIPE ended (128 + 13)


def stdout_guard(emit, goes_on: str | None):
    """``emit`` (printing one record on stdout), made safe against a stdout that fails:
    ``vlmspec ... | head -1`` (the reader closed the pipe) or ``> /dev/full``. The first
    failure ends the stdout stream (stdout goes to /dev/null from then on, so nothing
    is retried at exit); with ``goes_on`` (what the batch still writes: "its records to
    --out FILE only") one warning says the batch goes on so; otherwise a closed pipe stops
    the batch quietly (exit 141, as SIGPIPE ends a Unix tool) and any other failure with
    one error line (exit 2)."""
    state = {"closed": False, "printed": 0}

    def guarded(record: dict) -> None:
        if state["closed"]:
            return
        try:
            emit(record)
        except OSError as exc:
            state["closed"] = True
            reason = stdout_failed(exc)
            if goes_on is None and isinstance(exc, BrokenPipeError):
                # ``| head -1``: the reader has what it wanted; stop quietly, as Unix tools
                # do when SIGPIPE ends them (128 + 13)
                sys.exit(EXIT_PIPE_CLOSED)
            if goes_on is None:
                fail(f"stdout: {reason} after {state['printed']} record(s); stopping, as "
                     "nothing else receives the records (--out FILE keeps a batch going)")
            from vlmspec_cli import ui
            ui.warning(f"stdout: {reason} after {state['printed']} record(s); the batch goes "
                       f"on, {goes_on}")
            return
        state["printed"] += 1
    return guarded


def stdout_failed(exc: OSError) -> str:
    """After a write to stdout failed: point stdout at /dev/null (the interpreter's flush at
    exit would fail again and print a traceback-like message), and say why it failed."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real file descriptor (tests)
        pass
    if isinstance(exc, BrokenPipeError):
        return "the reader closed the pipe"
    return f"cannot write ({exc.strerror or exc})"


def finish_batch(prof, summary, quiet: bool, extra: dict | None = None,
                 outputs: str = "output(s)") -> None:
    """The summary table (``extra``: rows of the command's own, before the lossy row), a
    line if ``outputs`` differ from target-only, and the exit code: 1 if any job failed
    or differed, else 0. Every decoding command ends here."""
    from vlmspec_cli import ui

    if not quiet:
        from vlmspec_cli.drafters import method_class

        method = method_class(prof.method)
        ui.summary_table(summary, method.label(prof), method.drafts,
                         (extra or {}) | lossy_row(prof))
    if summary.mismatches:
        ui.error(f"{summary.mismatches} {outputs} differ from target-only greedy decoding")
    advice = speed_advice(prof, summary)
    if advice and not quiet:
        ui.warning(advice)
    sys.exit(1 if summary.failures or summary.mismatches else 0)


def speed_advice(prof, summary) -> str | None:
    """One line when speculation did not pay in this run: measured slower than the target
    alone (--compare), or drafting switched off (drafting.length auto) for every round but
    its probes, or for most rounds; and what to try. None otherwise."""
    d = summary.stats.draft_length or {"rounds_plain": 0, "rounds_drafted": 0, "probes": 0}
    plain, drafted = d["rounds_plain"], d["rounds_drafted"]
    said = []
    if summary.speedup is not None and summary.speedup < 1.0:
        said.append(f"decoding was slower than the target alone ({summary.speedup:.2f}x)")
    if plain and drafted <= d["probes"]:
        said.append("drafting did not pay here and was switched off: the target decoded alone"
                    + (f" ({d['off_reason']})" if d.get("off_reason") else ""))
    elif plain > drafted:
        said.append(f"drafting paid too rarely here and was off for {plain} of "
                    f"{plain + drafted} rounds: the target decoded alone in those")
    if not said:
        return None
    ctx = click.get_current_context(silent=True)
    given = ctx.meta.get(_MODELS, {}) if ctx is not None else {}
    models = "".join(f" {OPTION_OF_KEY[k]} {shlex.quote(v)}" for k, v in given.items())
    return (f"{'; '.join(said)}; `vlmspec calibrate INPUTS -p {_profile_ref(prof)}{models} --write tuned` "
            "measures which method and γ pay on this machine (or a draft trained on this "
            "target's answers: README, Your own models)")


def _profile_ref(prof) -> str:
    """How to name ``prof`` on a command line: its name when that finds it, else its file."""
    from vlmspec_cli.profile import ProfileError, resolve_profile_path

    try:
        if str(resolve_profile_path(prof.name)) == prof.source:
            return prof.name
    except (ProfileError, OSError):
        pass
    return os.path.relpath(prof.source) if prof.source != "<defaults>" else prof.name


def print_plan(prof, noun: str, rows, total: int | None = None, limit: int | None = None,
               as_json: bool = False, json_rows=None, extra: dict | None = None) -> None:
    """--dry-run: the resolved profile, then one comment line per planned item (``rows``:
    (name, error) pairs, ``total`` of them; with ``limit``, the first ``limit`` and a line
    saying how many more: generate-image's plan can be millions of files). With ``as_json``
    (--json) one JSON object instead: the profile, ``extra``, and the items (``json_rows``:
    dicts, else {"input", "error"} of ``rows``), and "more" past ``limit``."""
    from itertools import islice

    from vlmspec_cli.profile import profile_to_dict, profile_to_yaml

    total = len(rows) if total is None else total
    try:
        if as_json:   # --dry-run --json printed YAML, which no JSON reader takes
            items = json_rows if json_rows is not None else (
                {"input": name, "error": error} for name, error in rows)
            shown = list(items if limit is None else islice(items, limit))
            click.echo(json.dumps({"profile_source": prof.source, "profile": profile_to_dict(prof),
                                   **(extra or {}), "planned": total, "items": shown,
                                   "more": total - len(shown)}, ensure_ascii=False, default=str))
            return
        click.echo(f"# profile from {prof.source}")
        click.echo(profile_to_yaml(prof), nl=False)
        for key, value in (extra or {}).items():
            click.echo(f"# {key}: {', '.join(map(str, value)) if isinstance(value, list) else value}")
        click.echo(f"# {total} {noun}")
        for shown, (name, error) in enumerate(rows):
            if limit is not None and shown >= limit:
                click.echo(f"# ... and {total - shown:,} more")
                break
            click.echo(f"# {tsv_field(name)}" + (f"  ({tsv_field(error)})" if error else ""))
    except OSError as exc:
        fail(f"stdout: {stdout_failed(exc)}; the plan was cut short")


def draft_summary(prof) -> str:
    from vlmspec_cli.drafters import method_class

    return method_class(prof.method).describe(prof)



def start_decoding(session, expected_tokens: int, quiet: bool, methods: str | None = None,
                   extra: str = "") -> None:
    """Before a batch: decide ``runtime.compile`` for its size, say on stderr in one line
    what runs (cli/detail.py; with -v which models take the fast path, the threads and
    whether their steps are compiled, and why), and run the compile warm-up as its own
    phase. ``methods``, ``extra``: for the short line (bench's methods, a video's frames)."""
    from vlmspec_cli import ui
    from vlmspec_cli.cli.detail import short_line, verbose
    from vlmspec_cli.session import SessionError

    try:
        compiled = session.plan_compile(expected_tokens)
    except SessionError as exc:
        fail(str(exc))
    if not quiet:
        ui.info(session.fast_path_summary() if verbose() else
                short_line(session, methods, extra))
    if compiled:
        with ui.Status(quiet, "compiling decoding steps (warm-up)"):
            seconds = session.warm_up()
        if not quiet and verbose():
            ui.info(f"compile warm-up: {seconds:.1f} s")
