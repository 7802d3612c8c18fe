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

    def __init__(self, unit: bytes, most: int = 80 * MiB) -> None:
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


# ------------------------------------------------------------------ 1: stdin
def test_stdin_names_with_a_nul_byte_fail_alone_undecodable_names_work(images, tmp_path):
    """A NUL byte in a listed path was 'ValueError: embedded null byte' and 0 records, even
    for the good paths before it. Bytes that are not UTF-8 name a real file (as they do
    from a directory listing), so that file is captioned."""
    from vlmspec_cli.tasks.inputs import REASON_NUL

    latin1 = tmp_path / os.fsdecode(b"caf\xe9.png")
    latin1.write_bytes(images[2].read_bytes())
    before = {p: md5(p) for p in [*images, latin1]}
    listing = (f"{images[0]}\n".encode() + b"bad\x00name.png\n" + os.fsencode(latin1) + b"\n"
               + f"{images[1]}\n".encode())
    res = run(["caption", "-", "--json", *FAST], input=listing)
    assert res.exit_code == 1, res.output
    good = [r for r in records(res.stdout) if r["error"] is None]
    assert [r["input"] for r in good] == [str(images[0]), str(latin1), str(images[1])]
    (line,) = error_lines(res.stderr)
    assert line == f"error: bad\\0name.png: {REASON_NUL}"
    assert {p: md5(p) for p in before} == before


def test_image_bytes_on_stdin_are_one_image_and_resume(images, tmp_path):
    """cat img.png | vlmspec caption -: one image (keyed by its bytes' SHA-256)."""
    out = tmp_path / "caps.jsonl"
    data = images[0].read_bytes()
    res = run(["caption", "-", "--json", "--out", str(out), *FAST], input=data)
    assert res.exit_code == 0, res.output
    (rec,) = records(res.stdout)
    assert rec["input"] == "-" and rec["error"] is None and rec["output"]
    assert rec["source"] == "stdin:sha256:" + hashlib.sha256(data).hexdigest()
    written = md5(out)
    again = run(["caption", "-", "--json", "--out", str(out), *FAST], input=data)
    assert again.exit_code == 0 and again.stdout == "" and md5(out) == written


@pytest.mark.parametrize("unit,reason", [
    (b"\0", "stdin holds binary data"),
    (b"a", "stdin: more than 64 MiB of lines; the rest is not read"),
])
def test_endless_stdin_is_read_bounded(images, unit, reason):
    """/dev/zero on stdin was a MemoryError; a line that never ends is cut at 4 KiB and
    the list at 64 MiB, and the other inputs are still captioned."""
    stream = Endless(unit)
    res = run(["caption", str(images[0]), "-", "--json", *FAST], input=stream)
    assert res.exit_code == 1, res.output
    assert [r["input"] for r in records(res.stdout) if r["error"] is None] == [str(images[0])]
    (line,) = error_lines(res.stderr)
    assert line.startswith(f"error: -: {reason}"), line
    assert stream.read_bytes <= 65 * MiB


def test_yes_on_stdin_stops_at_the_line_cap_with_one_stat_per_distinct_line(images, monkeypatch):
    """``yes | vlmspec caption -``: 64 MiB of "y" lines took 17 minutes of --dry-run (a stat
    per line). Now the list stops at a million lines, and a line equal to the one before is
    dropped before any stat (it is a duplicate)."""
    import vlmspec_cli.tasks.inputs as inputs

    stats = []
    real = inputs._expand_one
    monkeypatch.setattr(inputs, "_expand_one", lambda arg, exts: stats.append(arg) or real(arg, exts))
    stream = Endless(b"y\n")
    res = run(["caption", str(images[0]), "-", "--json", *FAST], input=stream)
    assert res.exit_code == 1, res.output
    assert error_lines(res.stderr) == ["error: y: no such file or directory",
                                       "error: -: stdin: more than 1,000,000 lines; the rest is not read"]
    assert stats == [str(images[0]), "y"] and stream.read_bytes <= 3 * MiB


def test_a_videos_bytes_on_stdin_are_named_so_by_describe_video():
    """cat clip.mp4 | vlmspec describe-video -: it said "stdin holds an image's bytes", and
    random bytes "... (or one image's bytes)", which describe-video does not take."""
    from vlmspec_cli.tasks.video import expand_video_inputs

    clip = (Path(__file__).resolve().parent.parent / "examples/videos/red-circle-left-to-right.mp4")
    for data, reason in ((clip.read_bytes(), "stdin holds a file's bytes (an image or a video), not "
                          "a list of paths"), (b"\0\1\2" * 2000, "stdin holds binary data, not a "
                                               "list of paths: - reads newline-separated paths here")):
        (item,) = expand_video_inputs(["-"], stdin=io.BytesIO(data))
        assert item.path == "-" and item.error.startswith(reason), item.error
        assert "one image" not in item.error


def test_stdin_line_too_long_fails_alone(images):
    from vlmspec_cli.tasks.inputs import expand_inputs

    items = expand_inputs(["-"], stdin=io.BytesIO(b"x" * 10_000 + b"\n" + f"{images[0]}\n".encode()))
    assert [(it.path, it.error) for it in items] == [
        ("-:1", "line 1 is longer than 4,096 bytes; not read"), (str(images[0]), None)]


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


def test_stdout_closed_without_out_stops_quietly(tmp_path):
    """vlmspec caption DIR | head -1: the reader is gone and nothing else gets the records:
    the run stops as a Unix tool that SIGPIPE ends, silently, exit 141 (it said an error
    line and exited 2)."""
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
    assert proc.returncode == 141 and err == "", err


# ------------------------------------------------------------------ 3: generate-image plans
def test_image_plan_is_generated_lazily():
    """-n 1000000000 built the whole plan before the first image (RSS grew, no image in a
    minute): a million jobs now cost no memory until they are iterated."""
    from vlmspec_cli.tasks.imagegen import plan_jobs

    tracemalloc.start()
    try:
        plan = plan_jobs(["a red circle", "  "], 1_000_000, 7, "out")
        total = len(plan)
        first = [job for _, job in zip(range(3), plan)]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert total == 1_000_001
    assert [(j.path, j.seed) for j in first] == [(f"out/000-a-red-circle-{k}.png", 7 + k)
                                                for k in range(3)]
    assert peak < 1 * MiB, peak


def test_images_per_prompt_is_capped_and_dry_run_bounded():
    res = run(["generate-image", "a red circle", "-n", "20000", "--dry-run"])
    assert res.exit_code == 2 and res.stdout == ""
    (line,) = error_lines(res.stderr)
    assert "20000 is more than 10000 images per prompt" in line
    res = run(["generate-image", "a red circle", "--set", "image.images_per_prompt=20000",
               "--dry-run"])
    assert res.exit_code == 2 and "images_per_prompt 20000" in res.stderr
    res = run(["generate-image", "a red circle", "-n", "5000", "--dry-run"])
    assert res.exit_code == 0
    planned = [line for line in res.stdout.splitlines() if line.endswith(tuple(
        f"seed={k}" for k in range(5000)))]
    assert len(planned) == 1000 and "# ... and 4,000 more" in res.stdout
    assert "# 5000 image(s)" in res.stdout


def test_prompts_file_latin1_and_long_line(tmp_path):
    latin1 = tmp_path / "prompts.txt"
    latin1.write_bytes("a red circle\nun carr\u00e9 bleu\n".encode("latin-1"))
    before = md5(latin1)
    res = run(["generate-image", "--prompts-file", str(latin1), "--dry-run"])
    assert res.exit_code == 2 and res.stdout == ""
    (line,) = error_lines(res.stderr)
    assert line == (f"error: --prompts-file {latin1}: not UTF-8 text (line 2, invalid byte at "
                    "offset 7)")
    assert md5(latin1) == before
    long = tmp_path / "long.txt"
    long.write_bytes(b"a red circle\n" + b"x" * (2 * MiB) + b"\na blue square\n")
    res = run(["generate-image", "--prompts-file", str(long), "--dry-run"])
    assert res.exit_code == 0
    assert "# prompt 2  seed=0  (line 2 is longer than 1 MiB; not read)" in res.stdout
    assert "002-a-blue-square-0.png" in res.stdout


def test_prompts_file_fifo_and_device_refused_not_read(tmp_path):
    """A FIFO with no writer blocked forever (--chat refuses non-regular files); /dev/zero
    was read without bound."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, "/dev/zero"):
        proc = vlmspec("generate-image", "--prompts-file", str(path), "--dry-run", timeout=60)
        assert proc.returncode == 2, proc.stderr
        (line,) = error_lines(proc.stderr)
        assert line.startswith(f"error: --prompts-file {path}: not a regular file"), line


def test_prompts_on_endless_stdin_are_bounded():
    stream = Endless(b"a red circle ")
    res = run(["generate-image", "--prompts-file", "-", "--dry-run"], input=stream)
    assert res.exit_code == 2 and res.stdout == ""
    (line,) = error_lines(res.stderr)
    assert line == "error: --prompts-file stdin: more than 64 MiB of lines; the rest is not read"
    assert stream.read_bytes <= 65 * MiB


# ------------------------------------------------------------------ 4: --skip-existing
def test_skip_existing_keeps_only_whole_pngs_of_the_same_job(tmp_path):
    """A truncated PNG at an image's name was kept as done (the name was all that was
    checked): now the job fails alone, the file untouched; a whole one is still kept when
    vlmspec wrote it from the same prompt and settings (another seed at T > 0, another
    cfg: not kept, --force replaces it); a person's PNG there is neither kept nor replaced."""
    from vlmspec_cli.tasks.imagegen import files_to_write, plan_jobs, png_bytes
    from vlmspec_cli.tasks.output_files import OutputRefused

    whole, cut, other, photo = list(plan_jobs(["a red circle"], 4, 0, tmp_path))
    ident = {"prompt": "a red circle", "settings": {"target": "t", "cfg": 5.0, "seed": 0}}
    data = png_bytes(Image.new("RGB", (32, 32), "red"), ident)
    Path(whole.path).write_bytes(data)
    Path(cut.path).write_bytes(data[: len(data) // 2])
    Path(other.path).write_bytes(data)
    Image.new("RGB", (32, 32), "red").save(photo.path)
    before = {p: md5(p) for p in (cut.path, other.path, photo.path)}
    assert files_to_write(whole, False, force=False, skip_existing=True, identity=ident) == []
    with pytest.raises(OutputRefused, match="exists but does not decode .*--force replaces it"):
        files_to_write(cut, False, force=False, skip_existing=True, identity=ident)
    seed7 = {"prompt": "a red circle", "settings": {"target": "t", "cfg": 5.0, "seed": 7}}
    with pytest.raises(OutputRefused, match=r"other settings \(seed 7 here, 0 there\).*--force replaces"):
        files_to_write(other, False, force=False, skip_existing=True, identity=seed7)
    assert files_to_write(other, False, force=True, skip_existing=False) == [Path(other.path)]
    for force, skip in ((False, True), (True, False)):
        with pytest.raises(OutputRefused, match="is not a PNG image vlmspec wrote.*even with --force"):
            files_to_write(photo, False, force=force, skip_existing=skip, identity=ident)
    assert {p: md5(p) for p in before} == before


def test_cli_skip_existing_truncated_png_fails_alone(tmp_path):
    out = tmp_path / "imgs"
    first = run(["generate-image", "a red circle", "-n", "2", "-t", "1", "-o", str(out), "-q",
                 "--device", "cpu"])
    assert first.exit_code == 0, first.output
    whole, cut = sorted(out.glob("*.png"))
    cut.write_bytes(cut.read_bytes()[:100])
    before = {p: md5(p) for p in (whole, cut)}
    res = run(["generate-image", "a red circle", "-n", "2", "-t", "1", "-o", str(out), "-q",
               "--device", "cpu", "--skip-existing"])
    assert res.exit_code == 1 and res.stdout == ""
    (line,) = error_lines(res.stderr)
    assert line.startswith(f"error: {cut}: exists but does not decode"), line
    assert {p: md5(p) for p in before} == before


# ------------------------------------------------------------------ 5: the locale
def test_utf8_names_and_prompts_under_the_c_locale(images, tmp_path):
    """LC_ALL=C, UTF-8 mode off: "qué" reached the tokenizer as lone surrogates (TypeError).
    Records are UTF-8 whatever the locale, so a UTF-8 locale resumes the same records."""
    cafe = tmp_path / "café.png"
    cafe.write_bytes(images[0].read_bytes())
    out = tmp_path / "caps.jsonl"
    c_locale = {k: v for k, v in os.environ.items() if not k.startswith("LC_")}
    c_locale.update(LC_ALL="C", LANG="C", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0")
    proc = vlmspec("caption", str(cafe), "--prompt", "qué color", "--out", str(out), *FAST,
                   env=c_locale)
    assert proc.returncode == 0, proc.stderr
    (rec,) = records(out.read_text(encoding="utf-8"))
    assert rec["input"] == str(cafe) and rec["prompt"] == "qué color" and rec["error"] is None
    again = vlmspec("caption", str(cafe), "--prompt", "qué color", "--out", str(out), "--json",
                    *FAST)
    assert again.returncode == 0 and again.stdout == "", again.stderr   # resumed
    proc = subprocess.run([sys.executable, "-m", "vlmspec_cli", "caption", str(cafe),
                           "--prompt", b"qu\xe9"], capture_output=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 2 and b"not UTF-8 text (byte 0xe9 at offset 2)" in proc.stderr
    assert b"Traceback" not in proc.stderr


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
    """A 50 MB prompt was tokenized (7.6 GB, 48 s) before the length check (a --chat line
    is now at most 1,048,576 characters: the largest prompt that reaches the check)."""
    from vlmspec_cli.runtime import limits

    counted = limits.prompt_tokens

    def small_only(lm, messages):
        assert sum(len(m.text) for m in messages) < 100_000, "a huge prompt was tokenized"
        return counted(lm, messages)
    monkeypatch.setattr(limits, "prompt_tokens", small_only)
    chat = tmp_path / "chat.jsonl"
    chat.write_text("".join(json.dumps({"id": key, "messages": [
        {"role": "user", "text": text, "images": [str(images[0])]}]}) + "\n"
        for key, text in (("huge", "word " * 200_000), ("short", "what colour?"))))
    res = run(["caption", "--chat", str(chat), "--json", *FAST])
    assert res.exit_code == 1, res.output
    huge, short = records(res.stdout)
    assert huge["error"].startswith("prompt is 1,000,000 characters: at least ")
    assert huge["error"].endswith("> 1,024 positions of the target (not tokenized)")
    assert short["error"] is None


# ------------------------------------------------------------------ 7: decoded sizes
def test_dimension_limits_are_checked_from_the_header(tmp_path):
    from vlmspec_cli.tasks.image_header import MAX_ASPECT_RATIO, dimension_problem
    from vlmspec_cli.tasks.inputs import InputError, load_image

    assert dimension_problem(50 * 7, 7) is None and dimension_problem(8192, 8192) is None
    assert "out of proportion" in dimension_problem(51 * 7, 7)
    assert "too large" in dimension_problem(8193, 8192)
    Image.new("RGB", (MAX_ASPECT_RATIO * 2, 2), "red").save(tmp_path / "wide.png")
    assert load_image(str(tmp_path / "wide.png")).size == (100, 2)
    Image.new("L", (102, 2)).save(tmp_path / "wider.png")
    with pytest.raises(InputError, match="wider.png: image out of proportion"):
        load_image(str(tmp_path / "wider.png"))


# ------------------------------------------------------------------ conversations
def test_chat_image_paths_that_name_no_file_fail_alone(images, tmp_path):
    """A NUL byte (JSON "\\u0000") in an image path made realpath raise: 0 records."""
    chat = tmp_path / "chat.jsonl"
    lines = [{"id": "nul", "messages": [{"role": "user", "text": "hi", "images": ["a\u0000b.png"]}]},
             {"id": "half", "messages": [{"role": "user", "text": "hi", "images": ["a\ud800.png"]}]},
             {"id": "text", "messages": [{"role": "user", "text": "hi \ud800",
                                          "images": [str(images[0])]}]},
             {"id": "good", "messages": [{"role": "user", "text": "hi", "images": [str(images[0])]}]}]
    chat.write_text("".join(json.dumps(line) + "\n" for line in lines))
    before = md5(chat)
    res = run(["caption", "--chat", str(chat), "--json", *FAST])
    assert res.exit_code == 1, res.output
    by_id = {r["input"].rsplit(":", 1)[-1]: r for r in records(res.stdout)}
    assert "image 1 (a\\0b.png): not a file name (it holds a NUL byte)" in by_id["1"]["error"]
    assert "image 1 (a\\ud800.png): not a file name" in by_id["2"]["error"]
    assert "text holds a lone surrogate" in by_id["3"]["error"]
    assert [r["error"] for r in records(res.stdout)][-1] is None
    assert len(error_lines(res.stderr)) == 3 and md5(chat) == before


def test_utf8_text_options_still_count_as_paths_for_recipe_state_checks():
    """recipe_paths.py takes any string a step is given for a possible path (so a recipe's
    state file never collides with one); Utf8Text must stay a string type for that."""
    from vlmspec_cli.cli.caption import caption
    from vlmspec_cli.cli.image import generate_image
    from vlmspec_cli.cli.recipe_paths import path_params

    assert "prompts" in path_params(generate_image) and "prompt" in path_params(caption)


@pytest.mark.parametrize("command", ["caption", "describe-video"])
def test_a_closed_stdin_fails_its_item_in_one_line(command):
    """``vlmspec caption - <&-``: Python starts with no sys.stdin; it ended in "TypeError: can
    only join an iterable". Now '-' is an input that failed, named with the reason."""
    proc = vlmspec(command, "-", "--max-new-tokens", "4", "-q", stdin=None,
                   preexec_fn=lambda: os.close(0))
    assert proc.returncode == 1, proc.stderr
    assert error_lines(proc.stderr) == ["error: -: stdin is closed: there is nothing to read for '-'"]
