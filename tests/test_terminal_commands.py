"""Every command tried as a new user would, in a pseudo-terminal of 80 columns (issue 60):
caption, describe-video, generate-image, profile, calibrate and bench each run on the
smallest inputs in examples/, stdout and stderr on the terminal, and what is left on the
screen must read cleanly (tests/test_terminal.py ``assert_reads_cleanly``: no line of
vlmspec's wider than 80 cells, no stray escape sequence, no bar or spinner left behind).
And ``vlmspec caption … | head -1`` ends quietly: the first result, nothing else."""

from __future__ import annotations

import sys

import pytest

from test_terminal import assert_reads_cleanly, run_in_pty

VLMSPEC = [sys.executable, "-m", "vlmspec_cli"]
CASES = {
    "describe-video": ["describe-video", "examples/videos/red-circle-left-to-right.mp4",
                       "--max-new-tokens", "8", "--compare"],
    "generate-image": ["generate-image", "a red circle on a blue background", "--out-dir", "{tmp}"],
    "profile": ["profile", "--set", "method=none", "--set", "generation.max_new_tokens=4",
                "--repeats", "3", "--warmup", "0",
                "--threads", "1", "--contexts", "32", "--write", "{tmp}/hw.yaml"],
    "calibrate": ["calibrate", "examples/images/scene1.png", "--budget", "1", "--max-new-tokens",
                  "4", "--gammas", "2", "--top", "1"],
    "bench": ["bench", "examples/mmspec/mmspec.jsonl", "--limit", "1", "--max-new-tokens", "8"],
}
# what each must have said (its table's title), the short line of runtime detail first
SAID = {"describe-video": "vlmspec summary", "generate-image": "vlmspec summary",
        "profile": "vlmspec profile", "calibrate": "winner:", "bench": "vlmspec bench"}


@pytest.mark.parametrize("command", list(CASES))
def test_every_command_reads_cleanly_at_80_columns(command, tmp_path):
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in CASES[command]]
    code, raw = run_in_pty(VLMSPEC + argv, timeout=300)
    assert code == 0, raw[-3000:]
    lines = assert_reads_cleanly(raw)
    assert any(line.startswith(SAID[command]) for line in lines), "\n".join(lines)
    if command in ("describe-video", "generate-image", "bench"):   # one line before it all
        first = " ".join(line.strip() for line in lines[:2])   # (a long line wraps at a word)
        assert first.startswith("tinyworld-") and " · fast path " in first, lines[:3]
        assert not any("CPU threads" in line or "compiled steps" in line for line in lines)
    if command == "profile":   # the spinner said its steps, then went
        assert "step 1/" in raw and "ETA ~" in raw


def test_a_closed_stdout_ends_the_run_quietly():
    """`vlmspec caption examples/images/ | head -1` in a terminal: the first caption, and
    no error line, no bar left on the screen (it exited 2 with an error line and left
    its bars there)."""
    code, raw = run_in_pty(["sh", "-c", " ".join(VLMSPEC) + " caption examples/images/ "
                            "--max-new-tokens 8 | head -1"])
    assert code == 0, raw[-3000:]
    lines = [line for line in assert_reads_cleanly(raw) if line.strip()]
    assert lines[-1].startswith("examples/images/scene1.png\t"), lines
    assert not any("error" in line or "warning" in line for line in lines), lines
