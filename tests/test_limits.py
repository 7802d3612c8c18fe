"""Input limits: prompts past a model's positions, numbers that cannot be used (inf, nan,
seeds past 64 bits, bad lists), files too big to read whole, videos sampled to too many
frames, and names that would break the one-line-per-record stdout and stderr formats."""

from __future__ import annotations

import builtins
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import corpus
from vlmspec_cli.cli import cli
from vlmspec_cli.cli.common import record_printer
from vlmspec_cli.profile import ProfileError, load_profile
from vlmspec_cli.tasks import inputs, video_io
from vlmspec_cli.tasks.chat import read_chat_file
from vlmspec_cli.tasks.inputs import InputError, load_image
from vlmspec_cli.tasks.video_io import VideoError, read_video

# `vlmspec profile` timed briefly on one thread (the thread search has its own test)
QUICK = ("--repeats", "3", "--threads", "1")

ROOT = Path(__file__).resolve().parent.parent
FAST = ["--max-new-tokens", "6", "-q", "--device", "cpu"]
MiB = 1024 ** 2


def run(args, input=None):
    return CliRunner().invoke(cli, args, input=input, catch_exceptions=False)


def vlmspec(*args, input=None, timeout=300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "vlmspec_cli", *args], input=input,
                          capture_output=True, text=True, env=env, timeout=timeout)


def records(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines() if line.strip()]


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def escaped(text: str) -> str:
    """The stdout escaping rule: backslash, newline, tab, CR as \\\\, \\n, \\t, \\r."""
    return (text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")
            .replace("\r", "\\r"))


def unescape(field: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t", "r": "\r"}.get(m[1], m[1]), field)


@pytest.fixture()
def image(tmp_path):
    return corpus.make_good_images(tmp_path / "good", 1)[0]


class ReadSpy:
    """Wraps every file a module opens: counts the bytes read from it, and fails (without
    reading) any single read of more than ``limit`` bytes, so a loader that reads a huge
    file whole fails the test instead of filling memory."""

    def __init__(self, limit: int = 64 * MiB) -> None:
        self.limit = limit
        self.bytes = 0

    def open(self, path, mode="r", *args, **kwargs):
        return _Counted(builtins.open(path, mode, *args, **kwargs), self)


class _Counted:
    def __init__(self, fh, spy: ReadSpy) -> None:
        self._fh, self._spy = fh, spy

    def _want(self, n) -> int:
        left = os.fstat(self._fh.fileno()).st_size - self._fh.tell()
        want = left if n is None or n < 0 else min(n, left)
        if want > self._spy.limit:
            raise AssertionError(f"a read of {want:,} bytes at once")
        return want

    def read(self, n=-1):
        self._want(n)
        data = self._fh.read(n)
        self._spy.bytes += len(data)
        return data

    def readline(self, n=-1):
        self._want(n)
        data = self._fh.readline(n)
        self._spy.bytes += len(data)
        return data

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._fh.close()

    def __getattr__(self, name):
        return getattr(self._fh, name)


@pytest.fixture()
def spy(monkeypatch):
    """Spies on the files tasks/inputs.py opens (image and chat-file loading)."""
    s = ReadSpy()
    monkeypatch.setattr(inputs, "open", s.open, raising=False)
    return s


# ------------------------------------------------------------ 11: context limits
def test_long_prompt_for_every_image_is_exit_2_before_decoding(image):
    proc = vlmspec("caption", str(image), "--prompt", corpus.long_prompt(), *FAST)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    (line,) = error_lines(proc.stderr)
    assert re.fullmatch(r"error: prompt is [\d,]+ tokens without images \+ max_new_tokens 6 = "
                        r"[\d,]+ > 1,024 positions of the target", line), line


def test_long_prompt_in_calibrate_and_profile_is_exit_2(image):
    prompt = "generation.prompt=" + corpus.long_prompt()
    for args in (["calibrate", str(image), "--gammas", "2"], ["profile", *QUICK]):
        res = run([*args, "--set", prompt, "-q", "--device", "cpu"])
        assert res.exit_code == 2, res.output
        assert re.search(r"prompt is [\d,]+ tokens \+ max_new_tokens \d+ = [\d,]+ > 1,024 "
                         r"positions of the target", res.stderr), res.stderr


def test_long_conversation_fails_alone(image, tmp_path):
    chat = corpus.make_long_chat(tmp_path / "chat.jsonl", image)
    res = run(["caption", "--chat", str(chat), "--json", *FAST])
    assert res.exit_code == 1, res.output
    long, short = records(res.stdout)
    assert long["input"].endswith("#long") and short["input"].endswith("#short")
    assert re.search(r"prompt is [\d,]+ tokens \+ max_new_tokens 6 = [\d,]+ > 1,024 positions "
                     r"of the target", long["error"]), long["error"]
    assert short["error"] is None and short["output"]


def test_long_image_prompt_is_that_prompt_s_error(tmp_path):
    out = tmp_path / "imgs"
    proc = vlmspec("generate-image", corpus.long_prompt(5_000),
                   "a red\tcircle on a blue\nbackground", "-o", str(out), "-m", "none", "-q",
                   "--device", "cpu")
    assert proc.returncode == 1, proc.stderr
    (line,) = error_lines(proc.stderr)
    assert re.search(r"prompt is [\d,]+ tokens \+ 64 image tokens = [\d,]+ > 256 positions of "
                     r"the target", line), line
    (written,) = proc.stdout.splitlines()  # the good prompt, its newline and tab escaped
    file, prompt = written.split("\t")
    assert Path(file).is_file() and prompt == "a red\\tcircle on a blue\\nbackground"
    assert len(list(out.iterdir())) == 1


def test_prompt_length_counts_what_the_target_sees():
    from vlmspec_cli.runtime.limits import position_limit, position_limits, prompt_tokens
    from vlmspec_cli.runtime.request import Message
    from vlmspec_cli.session import build_session
    from vlmspec_cli.tasks.video_io import clip_from_arrays
    from videofiles import moving_square_frames

    cpu = {"target.device": "cpu", "draft.device": "cpu"}
    chain = dict(cpu, method="chain", **{"drafting.inputs": ["multimodal"]})
    video = build_session(load_profile("tinyworld-video", cli=chain))
    lm = video.target
    assert position_limits(video.position_readers()) == [("target", 4096), ("draft", 4096)]
    for n, size in ((8, 32), (5, (48, 32))):
        clip = clip_from_arrays(moving_square_frames(n, size=size), fps=4)
        messages = [Message("user", "describe the video.", videos=(clip,))]
        text = lm.adapter.prompt_text(lm, messages)
        encoded = lm.adapter.encode(lm, text, None, videos=[clip])["input_ids"].shape[1]
        assert prompt_tokens(lm, messages) == encoded  # counted without patchifying
    twig = build_session(load_profile("tinyworld-twig", cli=cpu))
    assert [role for role, _ in position_limits(twig.position_readers())] == ["target", "twig"]
    assert position_limit(twig.target) == 1024


# ------------------------------------------------- 12: numbers checked at parse time
@pytest.mark.parametrize("args, option", [
    (["caption", "x.png", "-t", "inf"], "'--temperature'"),
    (["caption", "x.png", "--temperature", "nan"], "'--temperature'"),
    (["caption", "x.png", "--seed", str(2 ** 70)], "'--seed'"),
    (["profile", "--contexts", "0,-5"], "'--contexts'"),
    (["calibrate", "x.png", "--gammas", "2,,4"], "'--gammas'"),
    (["generate-image", "a red circle", "--cfg", "inf"], "'--cfg'"),
    (["describe-video", "x.mp4", "--fps", "inf"], "'--fps'"),
    (["profile", "--tau", "nan"], "'--tau'"),
])
def test_bad_numbers_are_usage_errors(args, option):
    res = run(args)
    assert res.exit_code == 2 and "Invalid value for " + option in res.output, res.output


def test_bad_numbers_subprocess():
    for args, option in ((["caption", "x.png", "-t", "inf"], "--temperature"),
                         (["caption", "x.png", "--seed", str(2 ** 70)], "--seed"),
                         (["profile", "--contexts", "0,-5"], "--contexts")):
        proc = vlmspec(*args)
        assert proc.returncode == 2 and f"Invalid value for '{option}'" in proc.stderr, proc.stderr


def test_seed_range_is_what_generators_take():
    from vlmspec_cli.cli.types import SEED_MAX, SEED_MIN
    from vlmspec_cli.runtime.request import make_generators

    for seed in (SEED_MIN, SEED_MAX):
        assert run(["caption", "x.png", "--seed", str(seed), "--dry-run"]).exit_code == 0
        make_generators(seed)  # the draft's generator derives seed + 0x9E3779B1
    assert run(["caption", "x.png", "--seed", str(SEED_MAX + 1), "--dry-run"]).exit_code == 2


@pytest.mark.parametrize("setting, message", [
    ("sampling.temperature=inf", "must be a finite number"),
    ("sampling.temperature=.inf", "must be a finite number"),
    ("sampling.temperature=.nan", "must be a finite number"),
    (f"sampling.temperature={10 ** 400}", "must be a finite number"),
    ("image.cfg=.inf", "must be a finite number"),
    ("video.fps=.nan", "must be a finite number"),
    ("twig.threshold=-.inf", "must be a finite number"),
    (f"sampling.seed={2 ** 70}", "must be a 64-bit integer"),
    (f"video.frames={2 ** 64}", "must be a 64-bit integer"),
    ("drafting.gamma=" + "9" * 5000, "cannot parse value"),
    ("video.max_frames=0", "must be >= 1"),
    ("hardware.target_ms=-1", "must be >= 0"),
])
def test_profile_numbers_are_profile_errors(setting, message):
    key = setting.split("=")[0]
    with pytest.raises(ProfileError, match=re.escape(message)) as err:
        load_profile(None, [setting])
    if message != "cannot parse value":
        assert f"key '{key}'" in str(err.value)
    res = run(["profiles", "tinyworld-caption", "--set", setting])
    assert res.exit_code == 2 and key in res.stderr and message in res.stderr


def test_profile_yaml_numbers_are_profile_errors(tmp_path):
    for body, message in (("sampling:\n  temperature: .inf\n",
                           "'sampling.temperature' must be a finite"),
                          ("sampling:\n  seed: %d\n" % 2 ** 70, "'sampling.seed' must be a 64-bit"),
                          ("drafting:\n  gamma: %s\n" % ("9" * 5000), "invalid YAML")):
        path = tmp_path / "p.yaml"
        path.write_text(body)
        with pytest.raises(ProfileError, match=re.escape(message)):
            load_profile(str(path))


def test_contexts_too_short_are_exit_2_and_too_long_are_timed_at_the_longest(zoo_target):
    """--contexts 4 is an error; 1024 and 5000 (past the 1024-position target) are timed at
    944, the longest context that leaves room to verify, and a note says so. No number is
    written with a thousands separator: in S,S,... "1,024" would read as two values."""
    from types import SimpleNamespace

    from vlmspec_cli.tasks.hwprofile import check_contexts

    res = run(["profile", "--contexts", "4,256", "-q", "--device", "cpu", *QUICK])
    assert res.exit_code == 2 and "--contexts 4: context lengths run from 8" in res.stderr
    assert "1024 positions" in res.stderr and not re.search(r"\d,\d", res.stderr), res.stderr
    target = SimpleNamespace(model=zoo_target.model)
    assert check_contexts(target, [128, 1024, 5000])[0] == [128, 944]
    note = check_contexts(target, [128, 1024, 5000])[1]
    assert note.startswith("--contexts 1024 5000: the target has 1024 positions") and "S = 944" in note
    assert check_contexts(target, [128, 512]) == ([128, 512], "")


# ------------------------------------------------------------- 13: files too big
def test_huge_image_file_is_refused_unread(tmp_path, spy):
    path = corpus.make_huge_png(tmp_path)
    with pytest.raises(InputError, match=r"image too large \(the file is 2\.0 GiB, more than the "
                                         r"256\.0 MiB an image file may be; not read\)"):
        load_image(str(path))
    assert spy.bytes == 0


@pytest.mark.parametrize("head, reason, most", [
    (corpus.PNG_SIGNATURE, "IHDR", 4096),                  # rejected from its first bytes
    (corpus.JPEG_SIGNATURE, "no image header within", 17 * MiB),  # PIL's scan, cut short
    (b"GIF89a\x10\x00\x10\x00\x00\x00\x00", "no image header within", 17 * MiB),
    (b"BM" + b"\xff" * 12 + b"\xff\xff\xff\x7f", "no image header within", 17 * MiB),
])
def test_garbage_after_an_image_signature_is_not_read_to_the_end(tmp_path, spy, head, reason, most):
    path = corpus.make_garbage_after_signature(tmp_path, "fake.img", 64 * MiB, head)
    with pytest.raises(InputError, match=reason):
        load_image(str(path))
    assert spy.bytes <= most


def test_good_images_still_load_through_the_header_reader(tmp_path, spy):
    from PIL import Image

    for fmt in ("PNG", "JPEG", "GIF", "BMP", "TIFF", "WEBP", "PPM"):
        path = tmp_path / f"ok.{fmt.lower()}"
        Image.new("RGB", (40, 30), (10, 200, 30)).save(path, format=fmt)
        assert load_image(str(path)).size == (40, 30)


def test_binary_chat_file_fails_on_its_first_bytes(tmp_path, spy):
    """Under the --chat cap (64 MiB) a binary file fails on its first bytes; past it, a file
    is refused by its size, unread."""
    path = corpus.make_sparse_file(tmp_path / "chat.jsonl", 48 * 1024 ** 2, b"\xff\xfe\x00\x81")
    with pytest.raises(InputError, match="not UTF-8 text"):
        read_chat_file(str(path))
    assert spy.bytes <= 4096
    huge = corpus.make_sparse_file(tmp_path / "huge.jsonl", 2 * corpus.GIB, b"\xff\xfe\x00\x81")
    with pytest.raises(InputError, match="is 2.0 GiB, more than the 64.0 MiB a --chat file may be"):
        read_chat_file(str(huge))
    assert spy.bytes <= 4096


def test_caption_huge_file_and_newline_names_subprocess(tmp_path):
    folder = tmp_path / "in"
    good = corpus.make_newline_named_image(folder)
    corpus.make_huge_png(folder)
    missing = str(tmp_path / "gone\nmissing.png")
    proc = vlmspec("caption", str(folder), missing, *FAST)
    assert proc.returncode == 1, proc.stderr
    (line,) = proc.stdout.splitlines()  # one record, one line
    name, output = line.split("\t")
    assert unescape(name) == str(good) and name == escaped(str(good)) and output
    errors = error_lines(proc.stderr)
    assert len(errors) == 2 and len(proc.stderr.splitlines()) == 2  # one line each
    assert any("huge.png: image too large (the file is 2.0 GiB" in e for e in errors)
    assert any("gone\\nmissing.png: no such file or directory" in e for e in errors)


# ---------------------------------------------------------- 13: video frame cap
def test_frame_cap_fails_before_decoding(tmp_path, monkeypatch):
    clip = corpus.make_long_video(tmp_path / "long.mp4")
    def no_decode(*args, **kwargs):
        raise AssertionError("frames were decoded")
    monkeypatch.setattr(video_io, "_decode", no_decode)
    with pytest.raises(VideoError, match=r"sampling at 30 fps would take 300 of its 300 frames, "
                                         r"more than video\.max_frames 256"):
        read_video(clip, fps=30)
    with pytest.raises(VideoError, match=r"sampling at 40 frames would take 40 of its 300 "
                                         r"frames, more than video\.max_frames 16"):
        read_video(clip, frames=40, max_frames=16)
    monkeypatch.undo()
    assert len(read_video(clip, fps=2).frames) == 20  # under the cap: unchanged


def test_frame_cap_in_a_folder_and_huge_frame_files(tmp_path):
    from videofiles import indexed_frames, write_frame_folder

    folder = write_frame_folder(tmp_path / "frames", indexed_frames(12, size=16))
    with pytest.raises(VideoError, match=r"would take 12 of its 12 frames, more than "
                                         r"video\.max_frames 5"):
        read_video(folder, fps=2, max_frames=5)
    corpus.make_sparse_file(folder / "frame13.png", 2 * corpus.GIB)
    with pytest.raises(VideoError, match=r"unreadable frame frame13\.png \(image too large"):
        read_video(folder, frames=4)


def test_describe_video_frame_cap_subprocess(tmp_path):
    corpus.make_long_video(tmp_path / "long.mp4")
    proc = vlmspec("describe-video", str(tmp_path / "long.mp4"), "--fps", "30", *FAST)
    assert proc.returncode == 1, proc.stderr
    (line,) = error_lines(proc.stderr)
    assert "long.mp4: sampling at 30 fps would take 300 of its 300 frames, more than " \
           "video.max_frames 256" in line
    res = run(["describe-video", str(tmp_path / "long.mp4"), "--fps", "2",
               "--set", "video.max_frames=10", "--json", *FAST])
    assert res.exit_code == 1 and "would take 20 of its 300 frames" in res.stderr


# ---------------------------------------------------- 15: one record, one line
def test_tsv_fields_escape_line_breaks_tabs_and_backslashes():
    from vlmspec_cli.cli.common import tsv_field

    assert tsv_field("a\\b\nc\td\re") == "a\\\\b\\nc\\td\\re" == escaped("a\\b\nc\td\re")
    assert unescape(tsv_field("x\\n\n\t\\")) == "x\\n\n\t\\"


def test_record_printer_keeps_one_line_per_record(capsys):
    record_printer(False)({"input": "a\nb.png", "output": "line one\nline\ttwo", "error": None})
    assert capsys.readouterr().out == "a\\nb.png\tline one\\nline\\ttwo\n"


def test_stderr_messages_stay_one_line(capsys):
    from vlmspec_cli import ui

    ui.error("bad\nname.png: no such file")
    ui.warning("a\r\nb")
    err = capsys.readouterr().err
    assert err.splitlines() == ["error: bad\\nname.png: no such file", "warning: a\\r\\nb"]


def test_dry_run_lines_are_escaped(tmp_path):
    path = corpus.make_newline_named_image(tmp_path)
    res = run(["caption", str(path), str(tmp_path / "x\ny.png"), "--dry-run"])
    assert res.exit_code == 0
    plan = [line for line in res.stdout.splitlines() if line.startswith("# ") and ".png" in line]
    assert plan == [f"# {escaped(str(path))}", f"# {escaped(str(tmp_path))}/x\\ny.png  "
                                               "(no such file or directory)"]
