"""``vlmspec profile``'s files: the hardware profile it writes (``--write``, or YAML on
stdout) and its plot (``--plot``), each checked before anything is measured and written
atomically after (tasks/hwprofile.py measures)."""

from __future__ import annotations

import yaml

from vlmspec_cli.fileio import same_file
from vlmspec_cli.tasks.output_files import (OWN_PNG, OutputRefused, check_output, is_profile,
                                            write_checked, written_by)


def hardware_yaml(hardware: dict, source: str) -> str:
    """A hardware profile: include it from another profile to carry these numbers."""
    head = (f"# written by `vlmspec profile` from {source} on {hardware['date']}\n"
            f"# {hardware['device']}, {hardware['dtype']}, torch {hardware['torch']}, "
            f"transformers {hardware['transformers']}\n"
            "# use it with `include: <this file>` in a profile\n")
    return head + yaml.safe_dump({"hardware": hardware}, sort_keys=False, allow_unicode=True)


def _is_hardware_profile(path) -> bool:
    """A hardware profile `vlmspec profile` wrote (never one a person wrote or edited into
    another profile)."""
    return written_by(path, "profile") and is_profile(path, "hardware")


def output_rules(write_path: str | None, plot_path: str | None, source: str, force: bool
                 ) -> list[tuple[str, str, dict]]:
    """(path, label, rules) of --write and --plot: new files, or with ``force`` what this
    command writes (a hardware profile, a PNG); never the profile it measures (``source``)
    nor both options on one file."""
    if write_path and plot_path and same_file(write_path, plot_path):
        raise OutputRefused(f"--plot {plot_path}: is the --write file too; give two files")
    out = []
    if write_path:
        out.append((write_path, f"--write {write_path}",
                    dict(force=force, ours=_is_hardware_profile, inputs=[source],
                         what="hardware profile (written by `vlmspec profile`)")))
    if plot_path:
        out.append((plot_path, f"--plot {plot_path}",
                    dict(force=force, inputs=[source], **OWN_PNG)))
    return out


def check_outputs(write_path: str | None, plot_path: str | None, source: str, force: bool) -> None:
    """Before anything is measured: OutputRefused (one line) if --write or --plot may not
    be written."""
    for path, label, rules in output_rules(write_path, plot_path, source, force):
        check_output(path, label, **rules)


def save_outputs(write_path: str | None, plot_path: str | None, hardware: dict, source: str,
                 force: bool) -> list[str]:
    """Write the hardware profile and the plot (each checked again, atomic); their paths."""
    written = []
    for path, label, rules in output_rules(write_path, plot_path, source, force):
        data = (hardware_yaml(hardware, source).encode("utf-8") if path == write_path
                else plot_png(hardware))
        write_checked(path, data, label, **rules)
        written.append(path)
    return written


def plot_png(hardware: dict) -> bytes:
    """T_p vs tokens verified (per S), T_q vs S (per B), T_q vs B (per S)."""
    from vlmspec_cli.plot import Panel, Series, line_chart_png

    m = hardware["measurements"]
    verify = m["target_verify_ms"]
    draft = m["draft_step_ms"]
    panels = [Panel("target: verify k tokens", "tokens verified (gamma, tree size)", "ms",
                    [Series(f"S={s}", [(k, v) for k, v in sorted(row.items())]) for s, row in verify.items()],
                    log_x=True)]
    by_frames = m.get("frames")
    if by_frames:   # a video profile: what grows with the video, and what should not
        ks = sorted(by_frames, key=int)
        series = [Series(name, [(int(k), by_frames[k][key]) for k in ks
                                if by_frames[k].get(key) is not None])
                  for name, key in (("prefill", "prefill_ms"), ("target step", "target_step_ms"),
                                    (f"{m['method']} drafting per level", "draft_ms_per_level"))]
        panels.append(Panel("video length", "frames", "ms", [x for x in series if x.points],
                            log_x=True))
    if draft:
        panels.append(Panel("draft: one step", "context S (tokens)", "ms",
                            [Series(f"B={b}", sorted(row.items())) for b, row in draft.items()]))
        contexts = sorted(next(iter(draft.values())))
        panels.append(Panel("draft: batch rows", "rows B", "ms",
                            [Series(f"S={s}", [(b, draft[b][s]) for b in sorted(draft)]) for s in contexts]))
    return line_chart_png(panels, title=f"vlmspec profile - {hardware['device']}")
