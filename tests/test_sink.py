"""tasks/sink.py: which files a JSONL sink refuses, how it repairs, locks, and fails
without ever leaving a torn record (the CLI side is tests/test_output_safety.py)."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import threading
from pathlib import Path

import pytest

from corpus import make_bad_outputs, torn_jsonl_bytes, vlmspec_record
from vlmspec_cli.tasks import sink as sink_module
from vlmspec_cli.fileio import atomic_write_bytes
from vlmspec_cli.tasks.records import record_key
from vlmspec_cli.tasks.sink import TRACE, JsonlSink, OutputError, open_outputs


def snapshot(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() and not p.is_symlink() else None)
            for p in sorted(root.rglob("*"))}


def test_foreign_outputs_refused_untouched(tmp_path):
    cases = make_bad_outputs(tmp_path)
    before = snapshot(tmp_path)
    for case, (path, why) in cases.items():
        if case == "link-to-torn.jsonl":
            continue
        with pytest.raises(OutputError) as info:
            JsonlSink(path).open()
        message = str(info.value)
        assert message.startswith(f"{path}: ") and why in message and "\n" not in message, case
    assert snapshot(tmp_path) == before  # not a byte changed, no copy made


def test_symlink_to_torn_jsonl_repaired_through_the_link(tmp_path):
    link, _ = make_bad_outputs(tmp_path)["link-to-torn.jsonl"]
    real = link.resolve()
    good, torn = torn_jsonl_bytes()
    with JsonlSink(link) as sink:
        assert len(sink.done_keys()) == 2 and sink.repaired
        sink.append(vlmspec_record("c.png"))
    assert link.is_symlink() and link.resolve() == real  # the link stays a link
    assert real.read_bytes() == good + (json.dumps(vlmspec_record("c.png")) + "\n").encode()
    (copy,) = real.parent.glob("torn.jsonl.torn-*")  # the dropped bytes, next to the real file
    assert copy.read_bytes() == torn and str(copy) in sink.warnings[0]


def test_repair_never_overwrites_an_earlier_copy_and_keeps_the_lock(tmp_path, monkeypatch):
    monkeypatch.setattr(sink_module.time, "strftime", lambda fmt: "20250101T000000")
    good, torn = torn_jsonl_bytes()
    path = tmp_path / "out.jsonl"
    path.write_bytes(good + torn)
    earlier = tmp_path / "out.jsonl.torn-20250101T000000"
    earlier.write_bytes(b"an earlier repair's copy")
    inode = path.stat().st_ino
    sink = JsonlSink(path).open()
    assert earlier.read_bytes() == b"an earlier repair's copy"
    assert (tmp_path / "out.jsonl.torn-20250101T000000-2").read_bytes() == torn
    assert path.read_bytes() == good and path.stat().st_ino == inode  # repaired in place
    with open(path, "rb") as other:  # so the lock taken before the repair still holds
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    sink.close()


@pytest.mark.parametrize("tail", [b'{"input": "a.p', b'{"inp', b"{"])
def test_torn_first_record_is_ours(tmp_path, tail):
    path = tmp_path / "out.jsonl"
    path.write_bytes(tail)
    with JsonlSink(path) as sink:
        assert sink.done_keys() == set() and sink.repaired
    assert path.read_bytes() == b""


@pytest.mark.parametrize("tail", [b"\0" * 4096, b'{"input": "c.p' + b"\0" * 300])
def test_zeros_after_the_last_record_are_repaired_like_a_torn_record(tmp_path, tail):
    """A crash on a filesystem that grew the file but never wrote the data leaves zeros
    after the complete records: repaired, a copy kept, not refused as the user's file."""
    good, _ = torn_jsonl_bytes()
    path = tmp_path / "out.jsonl"
    path.write_bytes(good + tail)
    with JsonlSink(path) as sink:
        assert len(sink.done_keys()) == 2 and sink.repaired
    assert path.read_bytes() == good
    (copy,) = tmp_path.glob("out.jsonl.torn-*")
    assert copy.read_bytes() == tail and str(copy) in sink.warnings[0]
    assert ("zero bytes after its last record" if not tail.strip(b"\0") else
            "torn last record") in sink.warnings[0]


def test_a_large_output_is_indexed_as_a_stream(tmp_path):
    """A 31 MiB --out is scanned line by line, keeping only the resume keys: its open
    peaks at a few MiB (it read and parsed it whole before: over 64 MiB here)."""
    import tracemalloc

    path = tmp_path / "big.jsonl"
    with open(path, "wb") as fh:
        for i in range(4000):
            fh.write((json.dumps(vlmspec_record(f"{i}.png", output="x" * 8000)) + "\n").encode())
    assert path.stat().st_size > 30 * 1024 ** 2
    tracemalloc.start()
    try:
        with JsonlSink(path) as sink:
            assert len(sink.done_keys()) == 4000 and not sink.warnings
            _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 12 * 1024 ** 2, f"{peak / 1024 ** 2:.1f} MiB"


def test_complete_last_record_without_newline_is_kept(tmp_path):
    path = tmp_path / "out.jsonl"
    line = json.dumps(vlmspec_record("a.png")).encode()
    path.write_bytes(line)
    with JsonlSink(path) as sink:
        assert sink.done_keys() == {record_key(vlmspec_record("a.png"))}
        assert not sink.repaired and "missing newline" in sink.warnings[0]
        sink.append(vlmspec_record("b.png"))
    assert [json.loads(x)["input"] for x in path.read_bytes().splitlines()] == ["a.png", "b.png"]


def test_a_second_writer_is_refused_until_the_first_closes(tmp_path):
    path = tmp_path / "out.jsonl"
    with open(path, "ab") as held:  # another process holding the lock
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(OutputError, match="another vlmspec run is writing this file"):
            JsonlSink(path).open()
    first = JsonlSink(path).open()
    with pytest.raises(OutputError, match="another vlmspec run"):
        JsonlSink(tmp_path / "." / "out.jsonl").open()  # spelled another way: same file
    first.close()
    JsonlSink(path).open().close()


def _write_half_then(error: BaseException, target: Path, monkeypatch):
    """os.write on ``target`` writes half of the data, then the next call raises."""
    real_write = os.write
    ino = target.stat().st_ino

    def write(fd, data):
        if os.fstat(fd).st_ino != ino:
            return real_write(fd, data)
        if len(data) > 1 and not getattr(write, "cut", False):
            write.cut = True
            return real_write(fd, bytes(data[: len(data) // 2]))
        raise error

    monkeypatch.setattr(os, "write", write)


def test_disk_full_cuts_the_partial_record_and_says_what_was_kept(tmp_path, monkeypatch):
    path = tmp_path / "out.jsonl"
    with JsonlSink(path) as sink:
        sink.append(vlmspec_record("a.png"))
        kept = path.read_bytes()
        _write_half_then(OSError(errno.ENOSPC, "No space left on device"), path, monkeypatch)
        with pytest.raises(OutputError) as info:
            sink.append(vlmspec_record("b.png"))
    assert str(info.value) == (f"{path}: cannot write a record: No space left on device; this "
                               "run wrote 1 record(s) to it before, all kept")
    assert path.read_bytes() == kept


def test_interrupt_mid_write_leaves_no_torn_record(tmp_path, monkeypatch):
    path = tmp_path / "out.jsonl"
    with JsonlSink(path) as sink:
        sink.append(vlmspec_record("a.png"))
        kept = path.read_bytes()
        _write_half_then(KeyboardInterrupt(), path, monkeypatch)
        with pytest.raises(KeyboardInterrupt):
            sink.append(vlmspec_record("b.png"))
    assert path.read_bytes() == kept and sink.written == 1


def test_interrupt_after_the_whole_line_keeps_it(tmp_path, monkeypatch):
    """An interrupt that lands once the line's last byte is written, before the write
    returns: a reader may have seen the line (a test sent SIGTERM as soon as it appeared),
    so it stays, counted, and the interrupt goes on."""
    from vlmspec_cli.tasks import sink as sink_module

    path = tmp_path / "out.jsonl"
    real = sink_module.write_all

    def write_then_interrupt(fd, data):
        real(fd, data)
        raise KeyboardInterrupt

    with JsonlSink(path) as sink:
        sink.append(vlmspec_record("a.png"))
        monkeypatch.setattr(sink_module, "write_all", write_then_interrupt)
        with pytest.raises(KeyboardInterrupt):
            sink.append(vlmspec_record("b.png"))
    assert [r["input"] for r in map(json.loads, path.read_bytes().splitlines())] == ["a.png",
                                                                                    "b.png"]
    assert sink.written == 2


def test_unwritable_output_refused_on_open(tmp_path, monkeypatch):
    path = tmp_path / "ro" / "out.jsonl"
    real_open = os.open

    def read_only_fs(name, flags, *args):
        if Path(name) == path and flags & (os.O_WRONLY | os.O_RDWR):
            raise OSError(errno.EROFS, "Read-only file system")
        return real_open(name, flags, *args)

    monkeypatch.setattr(os, "open", read_only_fs)
    with pytest.raises(OutputError, match="cannot open it for writing: Read-only file system"):
        JsonlSink(path).open()


def test_non_regular_outputs_are_write_only_streams(tmp_path):
    null = JsonlSink("/dev/null").open()
    assert null.stream and null.done_keys() == set() and null.records() == []
    for name in ("a.png", "b.png"):  # fsync on /dev/null is EINVAL: never called
        null.append(vlmspec_record(name))
    assert null.written == 2
    null.close()
    with pytest.raises(OutputError, match="No space left on device; this run wrote 0"):
        JsonlSink("/dev/full").append(vlmspec_record("a.png"))

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    with JsonlSink(fifo) as sink:
        sink.append(vlmspec_record("a.png"))
    reader.join(10)
    assert json.loads(got[0])["input"] == "a.png" and fifo.exists() and not fifo.is_file()


def test_a_fifo_waits_a_moment_for_a_reader_that_is_starting(tmp_path):
    """A FIFO with no reader is refused rather than waited on for ever, but a reader that
    opens it a moment later (``cat fifo &`` just before the run) is waited for."""
    import time

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: (time.sleep(0.3), got.append(fifo.read_bytes())),
                              daemon=True)
    reader.start()
    with JsonlSink(fifo) as sink:
        sink.append(vlmspec_record("a.png"))
    reader.join(10)
    assert json.loads(got[0])["input"] == "a.png"


def test_directory_refused(tmp_path):
    with pytest.raises(OutputError, match="is a directory"):
        JsonlSink(tmp_path).open()


def test_old_records_are_kept_but_never_match(tmp_path):
    path = tmp_path / "out.jsonl"
    old = {"input": "a.png", "task": "caption", "prompt": "p", "output": "x", "error": None}
    path.write_text(json.dumps(old) + "\n")
    with JsonlSink(path) as sink:
        assert sink.done_keys() == set()
        assert "1 record(s) have no source/settings" in sink.warnings[0]
        assert sink.records() == [old]


def test_open_outputs_checks_inputs_and_trace(tmp_path):
    image = tmp_path / "h.png"
    image.write_bytes(b"\x89PNG not really")
    os.link(image, tmp_path / "hard.png")
    os.symlink(image, tmp_path / "soft.png")
    for out in (image, tmp_path / "." / "h.png", tmp_path / "hard.png", tmp_path / "soft.png"):
        with pytest.raises(OutputError, match=r"is also an input .*never writes to its inputs"):
            open_outputs(str(out), [str(image)])
        with pytest.raises(OutputError, match="is also an input"):
            open_outputs(None, [str(image)], trace=str(out))
    assert image.read_bytes() == b"\x89PNG not really"
    with pytest.raises(OutputError, match="--trace and --out name the same file"):
        open_outputs(str(tmp_path / "o.jsonl"), [], trace=str(tmp_path / "." / "o.jsonl"))
    out, trace = open_outputs(str(tmp_path / "o.jsonl"), [str(image)], str(tmp_path / "t.jsonl"))
    assert trace.kind == TRACE
    trace.append({"request": "h.png", "block": 0, "weights": [1.0]})
    out.close()
    trace.close()
    (tmp_path / "o.jsonl").write_text(json.dumps(vlmspec_record("a.png")) + "\n")
    with pytest.raises(OutputError, match="not a vlmspec trace JSONL file"):
        open_outputs(None, [], trace=str(tmp_path / "o.jsonl"))  # results are not a trace


def test_atomic_write_follows_links_and_writes_streams(tmp_path):
    real = tmp_path / "real.yaml"
    real.write_text("old\n")
    link = tmp_path / "link.yaml"
    link.symlink_to(real)
    atomic_write_bytes(link, b"new\n")
    assert link.is_symlink() and real.read_text() == "new\n"
    to_null = tmp_path / "null-link"
    to_null.symlink_to("/dev/null")
    atomic_write_bytes(to_null, b"discarded\n")  # a device is written to, never replaced
    assert os.readlink(to_null) == "/dev/null" and Path("/dev/null").is_char_device()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    atomic_write_bytes(fifo, b"through the pipe\n")
    reader.join(10)
    assert got == [b"through the pipe\n"] and not fifo.is_file()
