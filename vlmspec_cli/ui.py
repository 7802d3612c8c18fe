"""Rich rendering of progress, errors and summaries — the only module that uses rich.

Everything here goes to stderr; results go to stdout (the CLI prints them), except while a
progress display shares the terminal with stdout: rich's live display redraws itself by
moving the cursor up over its own lines, so a line written to stdout in between is glued
to a bar and then partly erased. Results are then printed through the display's console
(``result``), which erases the bars, writes the line as it is and draws them again below.
"""

from __future__ import annotations

import os
import stat
import sys

from rich.cells import cell_len, set_cell_size
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.segment import Segment
from rich.table import Table

from vlmspec_cli.summary_words import acceptance_rows, length_rows

stderr = Console(stderr=True, highlight=False, soft_wrap=True)
_shared: Progress | None = None    # the live progress display, while stdout shares its terminal


def error(message: str) -> None:
    """One line on stderr (rich markup in the message is not interpreted; a newline or CR
    in it, e.g. from a file name, is shown as \\n / \\r). In a terminal a long line is
    wrapped between words (the terminal's own wrap cut "not measu|red"); into a file or a
    pipe it stays one line, whatever its length."""
    _line(f"[bold red]error:[/] {escape(one_line(message))}")


def warning(message: str) -> None:
    _line(f"[yellow]warning:[/] {escape(one_line(message))}")


def info(message: str) -> None:
    _line(escape(one_line(message)), style="dim")


def _line(text: str, style: str | None = None) -> None:
    stderr.print(text, style=style, soft_wrap=not stderr.is_terminal)


_LINE_BREAKS = str.maketrans({"\n": "\\n", "\r": "\\r"})


def one_line(text) -> str:
    """``text`` with its line breaks escaped, so a message stays one line."""
    return str(text).translate(_LINE_BREAKS)


def escape(text: str) -> str:
    from rich.markup import escape as _escape

    return _escape(str(text))


def same_terminal() -> bool:
    """Whether stdout and stderr are one terminal (a shell without redirection)."""
    try:
        out, err = sys.stdout, sys.stderr
        return bool(out.isatty() and err.isatty()
                    and os.path.samestat(os.fstat(out.fileno()), os.fstat(err.fileno())))
    except (AttributeError, OSError, ValueError):
        return False


def piped_to_a_reader() -> bool:
    """Whether stdout is a pipe (or socket) while stderr is a terminal: the pipe's reader
    (``| head -1``, ``| grep``) most likely writes to this terminal too, between the
    redraws of a live display, which then erased its lines and left stale bars above them."""
    try:
        mode = os.fstat(sys.stdout.fileno()).st_mode
        return bool((stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)) and sys.stderr.isatty())
    except (AttributeError, OSError, ValueError):
        return False


class _Verbatim:
    """A line written as it is: no markup, tab expansion, wrapping or cropping."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __rich_console__(self, console, options):
        yield Segment(self.text + "\n")


def result(line: str) -> bool:
    """Print one result line above the live progress display when it shares the terminal
    with stdout, byte for byte as stdout would get it; False when no display shares the
    terminal: the caller writes the line to stdout itself."""
    if _shared is None:
        return False
    _shared.console.print(_Verbatim(line), crop=False, soft_wrap=True)
    return True


class BatchUI:
    """Implements tasks.jobs.JobEvents: a progress bar over inputs and a token bar
    for the input being decoded (in a batch, the oldest row's); failures are printed as
    one line each. Results printed with ``result`` go above the bars."""

    def __init__(self, quiet: bool = False, label: str = "captioning",
                 recorded: str = "input(s)") -> None:
        self.quiet = quiet
        self.label = label
        self.recorded = recorded      # what a skipped unit is ("record(s)": bench's pairs)
        self.progress: Progress | None = None
        self.items_task = None
        self.tokens_task = None
        self.decoding = None      # the job the token bar follows

    def __enter__(self) -> "BatchUI":
        global _shared
        if not self.quiet and not piped_to_a_reader():   # no bars drawn over a reader's lines
            shared = same_terminal()
            self.progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[note]}"), TimeElapsedColumn(),
                console=stderr, transient=True, redirect_stdout=shared,
            )
            self.progress.start()
            _shared = self.progress if shared else None
        return self

    def __exit__(self, *exc) -> None:
        global _shared
        if self.progress is not None:
            _shared = None
            self.progress.stop()

    def batch_started(self, total: int, skipped: int) -> None:
        if skipped and not self.quiet:
            info(f"skipping {skipped} {self.recorded} already recorded")
        if self.progress is not None:
            self.items_task = self.progress.add_task(self.label, total=total, note="")
            # shown from the first token count (a Ray run's driver hears none)
            self.tokens_task = self.progress.add_task("tokens", total=None, note="", visible=False)

    def item_skipped(self, item) -> None:
        """Skipped as it came up (generate-image --skip-existing: its files are there)."""
        if self.progress is not None:
            self.progress.advance(self.items_task)

    def item_started(self, item) -> None:
        """A job starts (in a batch: joins while older rows decode, whose count stays)."""
        if self.progress is not None:
            self.progress.update(self.items_task, note=escape(_tail(one_line(item.path))))
            if self.decoding is None:
                self.progress.reset(self.tokens_task, total=None, note="",
                                    visible=self.progress.tasks[self.tokens_task].visible)

    def tokens(self, item, generated: int, limit: int) -> None:
        if self.progress is None:
            return
        if item is not self.decoding:   # another job: the bar follows it from here
            self.decoding = item
            self.progress.reset(self.tokens_task, total=limit, completed=generated, note="",
                                visible=True)
        else:
            self.progress.update(self.tokens_task, total=limit, completed=generated)

    def _finished(self, path: str, note: str = "") -> None:
        if self.decoding is not None and self.decoding.path == path:
            self.decoding = None
            if note:
                self.progress.update(self.tokens_task, note=note)
        self.progress.advance(self.items_task)

    def item_done(self, record: dict) -> None:
        if self.progress is not None:
            tau = record["stats"]["mean_acceptance_length"]
            self._finished(record["input"], f"τ={tau:.2f}")

    def item_failed(self, item, reason: str, record: dict) -> None:
        if self.progress is not None:
            self._finished(item.path)
        error(f"{item.path or repr('')}: {reason}")


def summary_table(summary, method: str, drafts: bool, extra: dict | None = None) -> None:
    """``method``: the method with its shape (DraftingMethod.label); ``drafts``: False for
    target-only decoding (no acceptance rows)."""
    s = summary.stats
    table = Table(title="vlmspec summary", title_justify="left", show_header=False)
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")
    table.add_row("items", f"{summary.items} ({summary.done} done, {summary.skipped} skipped)")
    table.add_row("failures", str(summary.failures), style="red" if summary.failures else None)
    table.add_row("method", method)
    if drafts:   # τ and γ in words (summary_words.py)
        for name, value in acceptance_rows(s) + length_rows(s.draft_length):
            table.add_row(name, escape(value))
    table.add_row("new tokens", str(s.new_tokens))
    if summary.done:   # nothing decoded (all skipped or failed): no rate to give
        table.add_row("tokens/s", f"{summary.tokens_per_s:.1f}")
    if summary.batched_s is not None:
        size = min(summary.batch_size, max(summary.done, 1))   # not 8 for 3 inputs
        table.add_row("batch size", f"{size} (decoded together in {summary.batched_s:.2f}s)")
    if s.caption_s:   # (runtime/models/captioner.py)
        table.add_row("captioner time", f"{s.caption_s:.2f}s (on a GPU beside the target's "
                      "prefill; on a CPU in line with it)")
    if summary.speedup is not None:
        note = f" ({summary.mismatches} mismatching!)" if summary.mismatches else ""
        table.add_row("target-only tokens/s", f"{summary.baseline_tokens_per_s or 0.0:.1f}")
        table.add_row("speedup vs target-only", f"{summary.speedup:.2f}x{note}")
        caption = ("speedup: the target alone's decoding wall time over this method's, "
                   "the same inputs decoded in this process (--compare)")
    if summary.compared:
        table.add_row("identical to target-only", summary.verdict,
                      style="red" if summary.mismatches else None)
    for name, value in (extra or {}).items():
        table.add_row(name, str(value))
    stderr.print(table)
    if summary.speedup is not None:   # wrapped at words (the console soft-wraps: mid-word)
        stderr.print(caption, style="dim", soft_wrap=False)


def profiles_table(rows) -> None:
    """``rows``: (name, task, path, description). In a terminal long cells wrap (a path
    folds, never cut short); written to a file or a pipe, the table is as wide as its
    longest row, so every path stays whole on its line."""

    headers = ("name", "task", "description", "path")
    cells = [(name, task, description, str(path)) for name, task, path, description in rows]
    # in a terminal under 120 columns the path is the file's name, its folders said once
    # below (at 80 the model names in the descriptions were cut to "Qwen2-VL-7B-Instru…")
    narrow = stderr.is_terminal and stderr.width < 120
    folders = sorted({os.path.dirname(c[3]) for c in cells}) if narrow else []
    if narrow:
        cells = [(*c[:3], os.path.basename(c[3])) for c in cells]
    table = Table(title="profiles", title_justify="left", expand=narrow)   # ratios need expand
    table.add_column(headers[0], style="bold", no_wrap=True)
    table.add_column(headers[1], no_wrap=True)
    table.add_column(headers[2], overflow="fold", ratio=3 if narrow else None)
    table.add_column("file" if narrow else headers[3], style="dim", overflow="fold",
                     ratio=2 if narrow else None)
    for row in cells:
        table.add_row(*(escape(cell) for cell in row))
    console = stderr
    if not stderr.is_terminal:
        widths = [max(cell_len(c) for c in column) for column in zip(headers, *cells)]
        console = Console(stderr=True, highlight=False, width=sum(widths) + 3 * len(widths) + 1)
    console.print(table)
    for folder in folders:
        console.print(f"files in {escape(folder)}", style="dim", soft_wrap=False)


class Status:
    """A one-line spinner on stderr for long measurements (nothing when quiet). With
    ``log``, where stderr is no terminal (a log file, a CI job), each update is a line of
    its own instead: a long command's steps and ETA are not lost there."""

    def __init__(self, quiet: bool = False, label: str = "measuring", log: bool = False) -> None:
        self.quiet = quiet
        self.label = label
        self.log = log and not quiet and not stderr.is_terminal
        self._status = None

    def __enter__(self) -> "Status":
        if not self.quiet and not self.log:
            self._status = stderr.status(f"{escape(self.label)}…")
            self._status.__enter__()
        return self

    def update(self, message: str) -> None:
        if self.log:
            info(f"{self.label} {message}")
        elif self._status is not None:   # one line, the spinner's 2 cells beside it
            text, room = f"{self.label} {message}", stderr.width - 3
            if cell_len(text) > room:
                text = set_cell_size(text, room - 1) + "…"
            self._status.update(escape(text))

    def __exit__(self, *exc) -> None:
        if self._status is not None:
            self._status.__exit__(*exc)


def latency_table(device: str, rows) -> None:
    """``vlmspec profile``'s table: ``rows`` of (metric, value, flagged), cli/hwprofile_table.py."""
    table = Table(title=f"vlmspec profile — {escape(device)}", title_justify="left",
                  show_header=False)
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")
    for name, value, flagged in rows:
        table.add_row(escape(name), escape(value), style="yellow" if flagged else None)
    stderr.print(table)


def calibration_table(candidates, winner, skipped=(), latency: str = "", rows: int = 14,
                      errors: dict | None = None, target_only: dict | None = None,
                      note: str = "", legend: str = "", winner_line: bool = True) -> None:
    """The candidates, modelled and measured: the measured speedup with its spread over the
    samples (min–median–max, target-only's wall ÷ the candidate's per sample) and how far
    the prediction was (predicted ÷ measured − 1). Whole, 140 columns or more, when stderr
    is a file or a pipe; in a terminal under 120 columns the spread goes below the table, a
    line per measured candidate, and long candidate names fold (at 80 columns they were cut
    to "hidden llava-deep-…" over four lines and the spread to "(1.77/2.28/2…")."""
    title = "vlmspec calibrate" + (f" (latency: {latency})" if latency else "")
    priced = "each candidate priced by its probe's timed rounds"
    out = stderr if stderr.is_terminal else Console(stderr=True, highlight=False, soft_wrap=True,
                                                    width=max(stderr.width, 140))
    below = out.width < 120
    wrap = not out.is_terminal          # in a terminal, lines wrap between words
    if any(c.cost == "rounds" for c in candidates) and not below:
        title += f", {priced}"          # (88 columns: narrow, a line below the table)
    table = Table(title=title, title_justify="left")
    for wide, narrow in (("candidate", "candidate"), ("τ model", "τ mod"), ("predicted", "pred."),
                         ("τ meas.", "τ meas"),
                         ("speedup meas. (per sample min/med/max)", "speedup"),
                         ("error", "err"), ("tok/s", "tok/s")):
        table.add_column(narrow if below else wide, justify="left" if wide == "candidate" else "right",
                         overflow="fold", no_wrap=wide not in ("candidate", "predicted"))
    shown = candidates[:rows] + [c for c in candidates[rows:] if c.speedup is not None]
    spreads = []
    for c in shown:
        timed = " (timed)" if c.cost == "timed" else ""
        speedup = "-" if c.speedup is None else f"{c.speedup:.2f}x"
        if c.speedup_min is not None:
            spread = f"{c.speedup_min:.2f}/{c.speedup_median:.2f}/{c.speedup_max:.2f}"
            spreads.append(f"  {escape(c.label)}: {spread}")
            speedup += "" if below else f" ({spread})"
        table.add_row(escape(c.label), f"{c.tau_model:.2f}", f"{c.predicted:.2f}x{timed}",
                      "-" if c.tau is None else f"{c.tau:.2f}", speedup,
                      "-" if c.prediction_error is None else _signed_pct(c.prediction_error),
                      "-" if c.tokens_per_s is None else f"{c.tokens_per_s:.0f}",
                      style="bold green" if c is winner else None)
    out.print(table)
    if any(c.cost == "rounds" for c in candidates) and below:
        out.print(f"({priced})", soft_wrap=wrap)
    if below and spreads:
        out.print("speedup per sample, min/median/max", style="bold")
        for line in spreads:
            out.print(line)
    if len(candidates) > len(shown):
        out.print(f"{len(candidates) - len(shown)} more candidates modelled (--json lists all)")
    for line in _not_tried(skipped):
        out.print(escape(line), soft_wrap=wrap)
    if target_only and target_only.get("sample_wall_s"):
        w = target_only["sample_wall_s"]
        out.print(f"target-only: {target_only['tokens_per_s']} tok/s, per sample "
                     f"{w['min']:.3f}–{w['median']:.3f}–{w['max']:.3f} s (min–median–max)",
                  soft_wrap=wrap)
    if errors and errors.get("measured"):
        out.print(f"prediction error over {errors['measured']} measured: mean {_signed_pct(errors['mean'])}, "
                     f"mean |error| {errors['mean_abs']:.0%}, max |error| {errors['max_abs']:.0%}",
                  soft_wrap=wrap)
    if legend:
        out.print(escape(legend), style="dim", soft_wrap=wrap)
    if note:
        out.print(escape(note), soft_wrap=wrap)
    if winner_line:
        out.print(f"winner: [bold]{escape(winner.label)}[/]")


def _signed_pct(x: float) -> str:
    """+8%, -3%, and 0% (not "-0%") for what rounds to nothing."""
    return "0%" if round(x * 100) == 0 else f"{x:+.0%}"


NOT_TRIED_SHOWN = 6      # names listed per reason; the rest counted (--json lists every one)


def _not_tried(skipped) -> list[str]:
    """calibrate's "WHAT (WHY)" entries, a line per WHY (first seen first), each naming its
    first NOT_TRIED_SHOWN and counting the rest: a short --budget skips tens of probes,
    which ran on for several screen rows, on one line and then on one line per reason (the
    budget's alone was 600 characters)."""
    groups: dict[str, list[str]] = {}
    for entry in skipped:
        what, sep, why = entry.rpartition(" (")
        if not sep or not why.endswith(")"):
            what, why = entry, ""
        groups.setdefault(why[:-1] if why else "", []).append(what)
    lines = []
    for why, whats in groups.items():
        more = len(whats) - NOT_TRIED_SHOWN
        listed = ", ".join(whats[:NOT_TRIED_SHOWN]) + (
            f" and {more} more (--json lists them)" if more > 0 else "")
        lines.append(f"not tried: {listed}" + (f" ({why})" if why else ""))
    return lines


def bench_table(report, title: str = "vlmspec bench") -> None:
    """``vlmspec bench``'s rows (tasks/bench_report.py BenchReport): per category, then
    overall, each method by name (its shape listed below); a lossless row that differs
    from target-only at T = 0 in red. Written whole, wider than 80 columns, when stderr
    is a file or a pipe; in a terminal narrower than that, the acceptance per position
    goes below the table, a line per row (at 80 columns the category column shrank to
    nothing, and method, n, MAT and tok/s to "…")."""
    out = stderr if stderr.is_terminal else Console(stderr=True, highlight=False, soft_wrap=True,
                                                    width=max(stderr.width, 140))
    below = out.width < 120      # rich caps a print's width at the console's
    table = Table(title=escape(title), title_justify="left")
    for name, justify in (("category", "left"), ("method", "left"), ("n", "right"),
                          ("MAT", "right"), ("speedup", "right"), ("tok/s", "right"),
                          ("p50 ms", "right"), ("p90 ms", "right"), ("= target", "right"),
                          ("accepted at position 1, 2, …", "left"))[:9 if below else 10]:
        table.add_column(name.replace(" ms", "") if below else name, justify=justify,
                         no_wrap=name != "category", min_width=10 if name == "category" else None)
    last, labels, accepted = None, {}, []
    for row in report.rows:
        if last is not None and row.category != last:
            table.add_section()
        # the label names the length already (chain (γ auto ≤ 7)): not said twice
        describe = _beyond_label(row.describe, row.label)
        labels[row.method] = row.label + (f", {describe}" if describe else "")
        per_position = (" ".join(f"{r:.2f}" for r in row.accept_per_pos[:6])
                        + (" …" if len(row.accept_per_pos) > 6 else ""))
        cells = [escape(row.category) if row.category != last else "", escape(row.method),
                 str(row.samples), f"{row.mat:.2f}",
                 "-" if row.speedup is None else f"{row.speedup:.2f}x",
                 f"{row.tokens_per_s:.1f}", _ms(row.p50_s), _ms(row.p90_s), _same(report, row)]
        table.add_row(*cells, *([] if below else [per_position]),
                      style="red" if row.lossless and row.mismatched else None)
        if per_position:
            accepted.append(f"  {escape(row.category)} · {escape(row.method)}: {per_position}")
        last = row.category
    out.print(table)
    if below and accepted:
        out.print("accepted at position 1, 2, …", style="bold")
        for line in accepted:
            out.print(line)
    for name, label in labels.items():
        if label != name:
            out.print(f"{escape(name)}: {escape(label)}", style="dim", soft_wrap=not out.is_terminal)
    out.print("MAT: tokens per verification round, 1 + accepted/rounds (vLLM's "
              "mean_acceptance_length); speedup: Σ target-only wall / Σ method wall over the "
              "same samples; p50/p90: per-request latency (ms); = target: samples identical to "
              "target-only", style="dim", soft_wrap=not out.is_terminal)   # words kept whole


def _tail(path: str, room: int = 32) -> str:
    """The end of a long path, where its file name is (at 80 columns the bar cut
    "examples/images/scene1.png" to "examples/images/sc", and the elapsed time to "0:00:…")."""
    return path if len(path) <= room else "…" + path[-(room - 1):]


def _beyond_label(describe: str, label: str) -> str:
    """``describe`` less its trailing words that ``label`` says already: "chain (γ auto ≤ 7)"
    and "draft D ['multimodal'] γ auto ≤ 7" read "chain (γ auto ≤ 7), draft D
    ['multimodal']", not γ twice (a tree's shape was said twice too)."""
    said = set(label.replace("(", " ").replace(")", " ").replace(",", " ").split())
    words = describe.split()
    while words and words[-1].strip(",") in said:
        words.pop()
    return " ".join(words).rstrip(",")


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}"


def _same(report, row) -> str:
    if row.method == report.reference:
        return "ref"
    if not report.greedy:
        return "n/a (T > 0)"
    return f"{row.identical or 0}/{row.compared}"
