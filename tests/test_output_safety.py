"""Never lose a byte: what `caption` / `describe-video` do with their --out and --trace
files. Bad outputs (tests/corpus.py make_bad_outputs) are refused before any model loads,
an output is never an input, a torn record is repaired through a link with a copy kept,
a second writer is locked out, resume keys by the resolved path and the settings, a full
disk or Ctrl-C stop the batch cleanly, and non-regular outputs are write-only streams."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import TEST_PROFILES
from corpus import make_bad_outputs, make_good_images, torn_jsonl_bytes, vlmspec_record
from vlmspec_cli.cli import cli

ROOT = Path(__file__).resolve().parent.parent
IMAGES = sorted((ROOT / "examples" / "images").glob("*.png"))
VIDEO = sorted((ROOT / "examples" / "videos").glob("*.mp4"))[0]
MMSPEC = ROOT / "examples" / "mmspec" / "mmspec.jsonl"
FAST = ["--max-new-tokens", "4", "-q"]
ENV = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def run(args, input=None):
    return CliRunner().invoke(cli, args, input=input, catch_exceptions=False)


def vlmspec(*args, timeout=300, **kw):
    return subprocess.run([sys.executable, "-m", "vlmspec_cli", *map(str, args)], env=ENV,
                          capture_output=True, text=True, timeout=timeout, **kw)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def file_records(path: Path) -> list[dict]:
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n"), "a torn record"
    return [json.loads(line) for line in data.splitlines()]


def snapshot(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() and not p.is_symlink() else None)
            for p in sorted(root.rglob("*"))}


@pytest.fixture(autouse=True)
def this_checkouts_profiles(monkeypatch):
    """Tests that chdir elsewhere still resolve profile names in this checkout."""
    monkeypatch.setenv("VLMSPEC_PROFILES", os.pathsep.join([str(TEST_PROFILES), str(ROOT / "profiles")]))


@pytest.fixture()
def no_models(monkeypatch):
    """Fail the test if a command gets as far as loading a model."""
    def build_session(*args, **kwargs):
        raise AssertionError("a model was loaded before the output was checked")

    monkeypatch.setattr("vlmspec_cli.session.build_session", build_session)


@pytest.fixture()
def image(tmp_path) -> Path:
    path = tmp_path / "h.png"
    shutil.copy(IMAGES[0], path)
    return path


# ------------------------------------------------------------------ refused before loading
@pytest.mark.parametrize("option", ["--out", "--trace"])
def test_bad_outputs_refused_in_one_line_before_any_model_loads(tmp_path, image, no_models,
                                                                option):
    cases = make_bad_outputs(tmp_path / "bad")
    before = snapshot(tmp_path)
    for case, (path, why) in cases.items():
        if case == "link-to-torn.jsonl":
            continue
        method = ["--method", "tabed"] if option == "--trace" else []   # the one that traces
        res = run(["caption", str(image), option, str(path), *method, *FAST])
        assert res.exit_code == 2, (case, res.output)
        lines = error_lines(res.stderr)
        if case != "folder.jsonl":  # click's own "is a directory" usage error
            assert len(lines) == 1 and lines[0].startswith(f"error: {path}: "), (case, lines)
        expected = (why if option == "--out" or case == "folder.jsonl"
                    else "not a vlmspec trace JSONL file")  # a results file is no trace
        assert expected in res.stderr, (case, res.stderr)
    for case in ("image.png", "notes-no-final-newline.txt", "foreign-middle.jsonl"):
        path, why = cases[case]
        for args in (["describe-video", str(VIDEO)], ["bench", str(MMSPEC)]):
            res = run([*args, "--out", str(path), *FAST])
            assert res.exit_code == 2 and why in res.stderr and len(error_lines(res.stderr)) == 1
    assert snapshot(tmp_path) == before  # not a byte of any of them changed


@pytest.mark.parametrize("args, option", [
    (["caption", "{image}", "--out", "", "--dry-run"], "--out"),
    (["caption", "{image}", "-o", "", "--dry-run"], "--out"),
    (["caption", "{image}", "--trace", "", "--dry-run"], "--trace"),
    (["describe-video", str(VIDEO), "--out", "", "--dry-run"], "--out"),
    (["generate-image", "a red circle", "--out-dir", "", "--dry-run"], "--out-dir"),
    (["profile", "--write", "", "-p", "/no/such.yaml"], "--write"),
    (["profile", "--plot", "", "-p", "/no/such.yaml"], "--plot"),
    (["calibrate", "{image}", "--write", "", "-p", "/no/such.yaml"], "--write"),
    (["run", "{recipe}", "--state", "", "--dry-run"], "--state"),
    (["bench", str(MMSPEC), "--out", "", "--dry-run"], "--out"),
    (["bench", str(MMSPEC), "--plot", "", "--dry-run"], "--plot"),
])
def test_an_empty_output_name_is_refused_not_taken_as_none(tmp_path, image, no_models,
                                                           monkeypatch, args, option):
    """``--out ''`` (an unset shell variable) is no "no --out": one line, exit 2, before
    anything is read or written (the cwd stays empty but for the test's own files)."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"steps:\n  - caption: {{inputs: [{image}]}}\n")
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    res = run([a.format(image=image, recipe=recipe) for a in args])
    lines = error_lines(res.stderr)
    assert res.exit_code == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    what = "folder" if option == "--out-dir" else "file"
    assert lines[0] == f"error: {option} '': an empty {what} name; name a {what} or leave {option} out"
    assert snapshot(tmp_path) == before


def test_an_output_is_never_an_input(tmp_path, image, no_models, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.symlink(image, tmp_path / "link.png")
    conv = tmp_path / "conv.jsonl"
    conv.write_text(json.dumps({"id": "c1", "messages": [
        {"role": "user", "text": "what is it?", "images": ["h.png"]}]}) + "\n")
    before = snapshot(tmp_path)
    for args in (["caption", "h.png", "--out", "h.png"],
                 ["caption", "h.png", "--out", str(image)],       # spelled another way
                 ["caption", str(image), "--out", "link.png"],    # a link to it
                 ["caption", str(tmp_path), "--out", "h.png"],    # found in a folder
                 ["caption", "h.png", "--trace", "./h.png", "--method", "tabed"],
                 ["caption", "--chat", "conv.jsonl", "--out", "conv.jsonl"],
                 ["caption", "--chat", "conv.jsonl", "--out", "h.png"],  # an image it reads
                 ["describe-video", str(VIDEO), "--out", str(VIDEO)]):
        res = run([*args, *FAST])
        assert res.exit_code == 2, (args, res.output)
        (line,) = error_lines(res.stderr)
        assert "is also an input" in line and "never writes to its inputs" in line, line
    res = run(["caption", "h.png", "--out", "o.jsonl", "--trace", "./o.jsonl", "-m", "tabed", *FAST])
    assert res.exit_code == 2 and "--trace and --out name the same file" in res.stderr
    assert snapshot(tmp_path) == before


def test_an_output_is_never_a_profile_the_run_reads(tmp_path, image, no_models, monkeypatch):
    """--out (and --trace) never name the profile in use or a file it includes, empty or
    not (an empty profile is valid YAML: records appended to it broke the next -p)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.yaml").write_text("")
    (tmp_path / "q.yaml").write_text("include: inc.yaml\n")
    (tmp_path / "inc.yaml").write_text("")
    before = snapshot(tmp_path)
    for args in (["-p", "p.yaml", "--out", "p.yaml"], ["-p", "q.yaml", "--out", "./inc.yaml"],
                 ["-p", "q.yaml", "--out", str(tmp_path / "q.yaml")],
                 ["-p", "q.yaml", "--trace", "inc.yaml", "-m", "tabed"]):
        res = run(["caption", "h.png", *args, *FAST])
        assert res.exit_code == 2, (args, res.output)
        (line,) = error_lines(res.stderr)
        assert "is also the profile or a file it includes" in line, line
    assert snapshot(tmp_path) == before


def test_a_fifo_no_process_reads_is_refused_not_waited_on(tmp_path, image, no_models, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("vlmspec_cli.tasks.sink.FIFO_WAIT_S", 0.2)   # (10 s by default)
    os.mkfifo(tmp_path / "ff")
    res = run(["caption", "h.png", "--out", "ff", *FAST])
    assert res.exit_code == 2
    (line,) = error_lines(res.stderr)
    assert line == ("error: ff: a FIFO that no process reads (none opened it in 0 s); start its "
                    "reader first, or choose a file")


def test_bench_never_writes_its_workload_or_images(tmp_path, image, no_models, monkeypatch):
    """Not the DATASET, not an image a sample reads (--out or --plot, even with --force), and
    --plot and --out never one file; refused before any model loads."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mm.jsonl").write_text(json.dumps({"id": "s", "image": "h.png",
                                                   "turns": ["what is it?"]}) + "\n")
    before = snapshot(tmp_path)
    for args in (["--out", "mm.jsonl"], ["--out", str(image)], ["--out", "./h.png"]):
        res = run(["bench", "mm.jsonl", *args, *FAST])
        (line,) = error_lines(res.stderr)
        assert res.exit_code == 2 and "is also an input" in line, (args, line)
    for args in (["--plot", "h.png", "--force"], ["--plot", "mm.jsonl"]):
        res = run(["bench", "mm.jsonl", *args, *FAST])
        (line,) = error_lines(res.stderr)
        assert res.exit_code == 2 and "is an input of this run" in line, (args, line)
    res = run(["bench", "mm.jsonl", "--out", "o.jsonl", "--plot", "./o.jsonl", *FAST])
    assert res.exit_code == 2 and "is the --out file too" in res.stderr
    assert snapshot(tmp_path) == before


def test_output_equal_to_input_subprocess(tmp_path, image):
    video = tmp_path / "v.mp4"
    shutil.copy(VIDEO, video)
    before = snapshot(tmp_path)
    for args in (["caption", image, "--out", image], ["describe-video", video, "--out", video]):
        proc = vlmspec(*args, *FAST)
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr
        (line,) = error_lines(proc.stderr)
        assert line.startswith(f"error: {args[-1]}: is also an input"), line
    assert snapshot(tmp_path) == before


def test_unwritable_output_refused_before_loading(tmp_path, image, no_models, monkeypatch):
    out = tmp_path / "ro" / "caps.jsonl"
    real_open = os.open

    def read_only_fs(name, flags, *args):
        if Path(name) == out and flags & (os.O_WRONLY | os.O_RDWR):
            raise OSError(errno.EROFS, "Read-only file system")
        return real_open(name, flags, *args)

    monkeypatch.setattr(os, "open", read_only_fs)
    res = run(["caption", str(image), "--out", str(out), *FAST])
    assert res.exit_code == 2
    assert error_lines(res.stderr) == [
        f"error: {out}: cannot open it for writing: Read-only file system"]


# ------------------------------------------------------------------ repair, lock, resume
def test_torn_record_behind_a_link_repaired_with_a_copy_and_a_warning(tmp_path, image):
    link, _ = make_bad_outputs(tmp_path / "bad")["link-to-torn.jsonl"]
    real = link.resolve()
    good, torn = torn_jsonl_bytes()
    res = run(["caption", str(image), "--out", str(link), *FAST])
    assert res.exit_code == 0, res.output
    (copy,) = real.parent.glob("torn.jsonl.torn-*")
    assert copy.read_bytes() == torn
    assert (f"warning: {link}: dropped a torn last record ({len(torn)} bytes, an interrupted "
            f"write?); kept a copy in {copy}") in " ".join(res.stderr.split())
    assert link.is_symlink() and link.resolve() == real
    assert real.read_bytes().startswith(good)
    assert [r["input"] for r in file_records(real)] == ["a.png", "b.png", str(image)]


def test_a_second_writer_exits_2_before_decoding(tmp_path, image, no_models):
    out = tmp_path / "caps.jsonl"
    with open(out, "ab") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        res = run(["caption", str(image), "--out", str(out), *FAST])
        assert res.exit_code == 2 and res.stdout == ""
        assert error_lines(res.stderr) == [
            f"error: {out}: another vlmspec run is writing this file; wait for it to "
            "finish or choose another file"]
    assert out.read_bytes() == b""


def test_a_second_writer_subprocess_then_after_release(tmp_path, image):
    out = tmp_path / "caps.jsonl"
    with open(out, "ab") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = vlmspec("caption", image, "--out", out, "--json", *FAST)
        assert proc.returncode == 2 and proc.stdout == ""
        (line,) = error_lines(proc.stderr)
        assert line == f"error: {out}: another vlmspec run is writing this file; wait for it " \
                       "to finish or choose another file"
    assert out.read_bytes() == b""
    res = run(["caption", str(image), "--out", str(out), *FAST])  # released: it works
    assert res.exit_code == 0 and [r["input"] for r in file_records(out)] == [str(image)]


def test_resume_by_resolved_path_and_output_settings(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d").mkdir()
    shutil.copy(IMAGES[0], tmp_path / "d" / "x.png")
    os.symlink("d/x.png", tmp_path / "alias.png")
    out = tmp_path / "caps.jsonl"
    res = run(["caption", "d", "--out", "caps.jsonl", "--json", *FAST])
    assert res.exit_code == 0 and len(file_records(out)) == 1
    for spelling in ("./d", f"{tmp_path}/d/x.png", "d/../d/x.png", "alias.png"):
        res = run(["caption", spelling, "--out", "caps.jsonl", "--json", *FAST])
        assert res.exit_code == 0 and res.stdout == "", spelling  # already done
    assert len(file_records(out)) == 1
    rec = file_records(out)[0]
    assert rec["input"] == "d/x.png" and rec["source"] == str(tmp_path / "d" / "x.png")
    assert rec["settings"]["max_new_tokens"] == 4
    # another token limit changes the output: not done yet
    res = run(["caption", "d", "--out", "caps.jsonl", "--json", "--max-new-tokens", "5", "-q"])
    assert res.exit_code == 0 and len(res.stdout.splitlines()) == 1
    assert len(file_records(out)) == 2


def test_old_records_are_kept_and_their_inputs_decoded_again(tmp_path, image):
    out = tmp_path / "caps.jsonl"
    old = {"input": str(image), "task": "caption", "prompt": "describe the image.",
           "output": "x", "error": None}
    out.write_text(json.dumps(old) + "\n")
    res = run(["caption", str(image), "--out", str(out), "--json", *FAST])
    assert res.exit_code == 0 and len(res.stdout.splitlines()) == 1
    assert "have no source/settings" in res.stderr
    assert file_records(out)[0] == old and len(file_records(out)) == 2


# ------------------------------------------------------------------ failing writes
def test_disk_full_stops_the_batch_in_one_line_keeping_what_was_written(tmp_path, monkeypatch):
    images = make_good_images(tmp_path / "imgs", 3)
    out = tmp_path / "caps.jsonl"
    real_write = os.write

    def write(fd, data):  # the second record: half of it written, then the disk is full
        if out.exists() and os.fstat(fd).st_ino == out.stat().st_ino and out.stat().st_size:
            if not getattr(write, "cut", False):
                write.cut = True
                return real_write(fd, bytes(data[: len(data) // 2]))
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    res = run(["caption", *map(str, images), "--out", str(out), "--json", *FAST])
    assert res.exit_code == 2
    assert error_lines(res.stderr)[-1] == (
        f"error: {out}: cannot write a record: No space left on device; this run wrote 1 "
        "record(s) to it before, all kept")
    assert [r["input"] for r in file_records(out)] == [str(images[0])]  # no torn record
    assert [json.loads(x)["input"] for x in res.stdout.splitlines()] == [str(images[0])]


def test_dev_null_and_dev_full_subprocess(image):
    second = IMAGES[1]
    proc = vlmspec("caption", image, second, "--out", "/dev/null", "--json", *FAST)
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(x)["input"] for x in proc.stdout.splitlines()] == [str(image), str(second)]
    proc = vlmspec("caption", image, second, "--out", "/dev/full", "--json", *FAST)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert error_lines(proc.stderr)[-1] == (
        "error: /dev/full: cannot write a record: No space left on device; this run wrote 0 "
        "record(s) to it before, all kept")


def test_fifo_output_is_a_stream(tmp_path, image):
    import threading

    fifo = tmp_path / "records.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()

    def hung(*_):  # a sink that reads the FIFO for resume would wait for a writer forever
        raise TimeoutError("the run blocked on the FIFO")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(120)
    try:
        res = run(["caption", str(image), str(IMAGES[1]), "--out", str(fifo), *FAST])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    reader.join(30)
    assert res.exit_code == 0, res.output
    assert [json.loads(x)["input"] for x in got[0].splitlines()] == [str(image), str(IMAGES[1])]


# ------------------------------------------------------------------ Ctrl-C
def test_interrupt_exits_130_saying_what_was_recorded(tmp_path, monkeypatch):
    images = make_good_images(tmp_path / "imgs", 3)
    out = tmp_path / "caps.jsonl"
    from vlmspec_cli.tasks import jobs

    real = jobs.decode_job
    calls = []

    def decode_job(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(jobs, "decode_job", decode_job)
    res = run(["caption", *map(str, images), "--out", str(out), *FAST])
    assert res.exit_code == 130
    assert error_lines(res.stderr)[-1] == (
        f"error: interrupted: 1 input(s) finished; 1 record(s) written to {out} by this run, "
        "a rerun with the same --out resumes")
    assert len(file_records(out)) == 1


def test_interrupt_exits_130_in_other_commands(tmp_path, monkeypatch, image):
    def build_session(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("vlmspec_cli.session.build_session", build_session)
    monkeypatch.chdir(tmp_path)
    res = run(["generate-image", "a red circle", "--out-dir", str(tmp_path / "gen"), "-q"])
    assert res.exit_code == 130 and "interrupted" in res.stderr
    (tmp_path / "r.yaml").write_text(
        f"steps:\n  - caption: {{inputs: ['{image}'], out: caps.jsonl, quiet: true}}\n")
    res = run(["run", "r.yaml"])
    assert res.exit_code == 130 and "interrupted" in res.stderr
    assert not (tmp_path / "r.state.json").exists()


@pytest.mark.parametrize("sig, code_wanted, word", [(signal.SIGINT, 130, "interrupted"),
                                                     (signal.SIGTERM, 143, "terminated")])
def test_a_stop_signal_exits_saying_what_was_recorded(tmp_path, sig, code_wanted, word):
    """Ctrl-C (SIGINT) and ``kill`` (SIGTERM): whole records only, and one line saying how
    many were kept; SIGTERM's default would end the process with no word."""
    # enough inputs that the batch cannot end between the first record and the signal
    # (the fast path decodes a tinyworld caption in well under a tenth of a second)
    images = make_good_images(tmp_path / "imgs", 120)
    out = tmp_path / "caps.jsonl"
    stderr = tmp_path / "stderr.txt"
    with open(stderr, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vlmspec_cli", "caption", *map(str, images), "--out",
             str(out), "--max-new-tokens", "400", "-q"],
            env=ENV, stdout=subprocess.DEVNULL, stderr=err,
            # a shell's background job (`pytest &`) starts with SIGINT ignored, and so would
            # the child: Python keeps an inherited SIG_IGN, and Ctrl-C would do nothing
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and proc.poll() is None:
                if out.exists() and b"\n" in out.read_bytes():
                    break
                time.sleep(0.02)
            assert proc.poll() is None, "the batch finished before it could be interrupted"
            proc.send_signal(sig)
            code = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert code == code_wanted
    recs = file_records(out)  # only complete records
    n = len(recs)
    assert 1 <= n < len(images)
    assert error_lines(stderr.read_text())[-1] == (
        f"error: {word}: {n} input(s) finished; {n} record(s) written to {out} by this "
        "run, a rerun with the same --out resumes")


def test_recipe_state_never_overwrites_a_file_that_is_not_one(tmp_path, monkeypatch, no_models):
    monkeypatch.chdir(tmp_path)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("steps:\n  - profiles: {name: tinyworld-caption}\n")
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    before = snapshot(tmp_path)
    for args in (["r.yaml", "--state", "r.yaml"], ["r.yaml", "--state", "notes.txt"],
                 ["r.yaml", "--state", "notes.txt", "--restart"]):
        res = run(["run", *args])
        assert res.exit_code == 2, res.output
        (line,) = error_lines(res.stderr)
        # one line naming the state file and why (the recipe itself, or not a state file)
        assert line.startswith(f"error: state file {args[2]}: "), line
        assert ("is the recipe itself" if args[2] == "r.yaml"
                else "not a vlmspec recipe state file") in line, line
        assert "profile from" not in res.stdout  # no step ran
    assert snapshot(tmp_path) == before
    res = run(["run", "r.yaml", "--state", "ok.json"])
    assert res.exit_code == 0 and "1" in json.loads((tmp_path / "ok.json").read_text())["steps"]



@pytest.mark.parametrize("stop", ["Terminated", "KeyboardInterrupt"])
def test_a_stop_swallowed_in_a_finalizer_is_delivered_again(stop, monkeypatch):
    """SIGTERM landing while Python ran a ``__del__`` was swallowed there ("Exception ignored
    in ...") and the run went on to exit 0, once in six tries at start-up. The unraisable
    hook now raises the stop again, as its signal, in the code that runs next."""
    import signal

    from vlmspec_cli.cli.stops import Terminated, stop_on_sigterm

    exc = Terminated if stop == "Terminated" else KeyboardInterrupt
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    try:
        stop_on_sigterm()
        # as in a command run from a terminal: a pytest started as a background job (`&`,
        # nohup) inherits SIGINT ignored, and Ctrl-C's signal would raise nothing
        signal.signal(signal.SIGINT, signal.default_int_handler)

        class Finalized:
            def __del__(self):
                raise exc()

        with pytest.raises(exc) as caught:
            Finalized()              # __del__ runs now; its exception reaches the hook
            for _ in range(500):     # the signal comes a moment later, its handler raises
                time.sleep(0.01)
        assert type(caught.value) is exc
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
