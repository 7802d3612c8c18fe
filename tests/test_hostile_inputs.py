"""Hostile and careless input on the inputs side (issues 35 and 40): names with a NUL byte
or bytes that are not UTF-8, an image or endless bytes on stdin, a stdout that fails, a
plan of a billion images, list files that never end or are no files, a truncated PNG kept
as done, a C locale, an image placeholder in a prompt, a prompt of megabytes.

The rule each test checks: one line on stderr naming the input and the reason; a bad
input fails alone (the batch goes on, exit 1 at the end), usage errors exit 2; no
traceback, no hang (subprocesses have timeouts, endless streams fail the test past a
bound instead of filling memory), and no file changed.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from click.testing import CliRunner
from PIL import Image

import corpus
from vlmspec_cli.cli import cli

ROOT = Path(__file__).resolve().parent.parent
FAST = ["--max-new-tokens", "4", "-q", "--device", "cpu"]
MiB = 1024 ** 2


def run(args, input=None):
    return CliRunner().invoke(cli, args, input=input, catch_exceptions=False)


def vlmspec(*args, env=None, timeout=120, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    kw.setdefault("stdout", subprocess.PIPE)
    return subprocess.run([sys.executable, "-m", "vlmspec_cli", *args], stderr=subprocess.PIPE,
                          text=True, env=env, timeout=timeout, **kw)


def records(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines() if line.strip()]


def error_lines(stderr: str) -> list[str]:
    assert "Traceback" not in stderr, stderr
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def md5(path) -> str:
    return hashlib.md5(Path(path).read_bytes()).hexdigest()


class Endless(io.RawIOBase):
    """A stdin that never ends (``/dev/zero``, ``yes | tr -d '\\n'``): repeats ``unit``; a
    reader that takes more than ``most`` bytes fails the test instead of filling memory."""

    def __init__(self, unit: bytes, most: int = 200 * MiB) -> None:
        self.unit, self.most, self.read_bytes = unit, most, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.read_bytes > self.most:
            raise AssertionError(f"read {self.read_bytes:,} bytes of an endless stream")
        n = len(buffer)
        buffer[:n] = (self.unit * (n // len(self.unit) + 1))[:n]
        self.read_bytes += n
        return n


@pytest.fixture()
def images(tmp_path):
    return corpus.make_good_images(tmp_path / "good", 3)


# ------------------------------------------------------------------ 2: stdout that fails
def test_stdout_full_with_out_finishes_the_batch_into_out(images, tmp_path):
    out = tmp_path / "caps.jsonl"
    with open("/dev/full", "w") as full:
        proc = vlmspec("caption", *map(str, images), "--out", str(out), *FAST, stdout=full)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("warning: stdout: cannot write (No space left on device) after 0 "
                           f"record(s); the batch goes on, its records to --out {out} only")
    assert len(records(out.read_text())) == 3


def test_stdout_closed_without_out_stops_in_one_line(tmp_path):
    """vlmspec caption DIR | head -1: the reader is gone; nothing else gets the records."""
    shots = corpus.make_good_images(tmp_path / "many", 6)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "vlmspec_cli", "caption", str(shots[0].parent),
                             "--max-new-tokens", "16", "-q", "--device", "cpu"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    first = proc.stdout.readline()
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    err = err.decode()
    assert first.startswith(str(shots[0]).encode())
    assert proc.returncode == 2, err
    (line,) = err.strip().splitlines()
    assert line.startswith("error: stdout: the reader closed the pipe after 1 record(s); "
                           "stopping"), line


# ------------------------------------------------------------------ 6: placeholders
def test_image_placeholder_in_the_prompt_is_refused_up_front(images, tmp_path):
    res = run(["caption", *map(str, images), "--prompt", "what is in <image>?", *FAST])
    assert res.exit_code == 2 and res.stdout == ""
    (line,) = error_lines(res.stderr)
    assert "'<image>'" in line and "placeholder" in line
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"id": "bad", "messages": [{"role": "user", "text": "<image> what?",
                                                           "images": [str(images[0])]}]}) + "\n"
                    + json.dumps({"id": "good", "messages": [{"role": "user", "text": "what?",
                                                              "images": [str(images[0])]}]}) + "\n")
    res = run(["caption", "--chat", str(chat), "--json", *FAST])
    assert res.exit_code == 1
    bad, good = records(res.stdout)
    assert "'<image>'" in bad["error"] and good["error"] is None


def test_huge_prompt_is_refused_before_it_is_tokenized(images, tmp_path, monkeypatch):
    """A 50 MB prompt was tokenized (7.6 GB, 48 s) before the length check."""
    from vlmspec_cli.runtime import limits

    counted = limits.prompt_tokens

    def small_only(lm, messages):
        assert sum(len(m.text) for m in messages) < 100_000, "a huge prompt was tokenized"
        return counted(lm, messages)
    monkeypatch.setattr(limits, "prompt_tokens", small_only)
    chat = tmp_path / "chat.jsonl"
    chat.write_text("".join(json.dumps({"id": key, "messages": [
        {"role": "user", "text": text, "images": [str(images[0])]}]}) + "\n"
        for key, text in (("huge", "word " * 1_000_000), ("short", "what colour?"))))
    res = run(["caption", "--chat", str(chat), "--json", *FAST])
    assert res.exit_code == 1, res.output
    huge, short = records(res.stdout)
    assert huge["error"].startswith("prompt is 5,000,000 characters: at least ")
    assert huge["error"].endswith("> 1,024 positions of the target (not tokenized)")
    assert short["error"] is None
