from __future__ import annotations

import json
import os
import stat

import pytest

from vlmspec_cli.fileio import atomic_write_bytes, atomic_write_text
from vlmspec_cli.tasks.records import record_key
from vlmspec_cli.tasks.sink import JsonlSink, OutputError

SETTINGS = {"target": "zoo:t", "max_new_tokens": 4, "temperature": 0.0, "lossless": True}


def rec(inp, error=None, prompt="Describe.", task="caption", settings=SETTINGS, **kw):
    return {"input": inp, "task": task, "prompt": prompt, "source": f"/data/{inp}",
            "settings": settings, "error": error, **kw}


def test_record_key():
    # resume identity: the resolved path (not the spelling in "input"), the prompt and
    # the output-changing settings, whatever their order
    assert record_key(rec("a.png")) == ("caption", "/data/a.png", "Describe.",
                                        json.dumps(SETTINGS, sort_keys=True))
    assert record_key(rec("a.png") | {"input": "./a.png"}) == record_key(rec("a.png"))
    assert record_key(rec("a.png", settings=dict(reversed(SETTINGS.items())))) == \
        record_key(rec("a.png"))
    assert record_key(rec("a.png", settings=SETTINGS | {"max_new_tokens": 5})) != \
        record_key(rec("a.png"))
    assert record_key(rec("a.png", prompt="Other.")) != record_key(rec("a.png"))
    # records of an older vlmspec (no source/settings) are readable and match nothing
    assert record_key({"task": "t", "input": "x"}) is None


def test_append_and_done_keys(tmp_path):
    path = tmp_path / "deep" / "dir" / "out.jsonl"  # parents are created
    with JsonlSink(path) as sink:
        assert sink.done_keys() == set()
        sink.append(rec("a.png", text="un caf\u00e9 \u2028 \u2603\nline2"))
        sink.append(rec("b.png", error="b.png: empty file (0 bytes)"))
        sink.append(rec("c.png", prompt=None))
    raw = path.read_bytes()
    assert raw.endswith(b"\n") and raw.count(b"\n") == 3
    assert "caf\u00e9".encode() in raw  # ensure_ascii=False
    lines = raw.split(b"\n")[:-1]
    assert json.loads(lines[0])["text"] == "un caf\u00e9 \u2028 \u2603\nline2"

    sink2 = JsonlSink(str(path))
    done = sink2.done_keys()
    assert done == {record_key(rec("a.png")), record_key(rec("c.png", prompt=None))}
    assert sink2.warnings == [] and not sink2.repaired


def test_error_then_success_counts_done(tmp_path):
    path = tmp_path / "out.jsonl"
    with JsonlSink(path) as s:
        s.append(rec("a.png", error="boom"))
        assert s.done_keys() == set()
        s.append(rec("a.png"))
        assert s.done_keys() == {record_key(rec("a.png"))}


def test_unserializable_record_writes_nothing(tmp_path):
    path = tmp_path / "out.jsonl"
    with JsonlSink(path) as s:
        s.append(rec("a.png"))
        with pytest.raises(TypeError):
            s.append(rec("b.png", bad=object()))
    assert path.read_bytes().count(b"\n") == 1


def test_lone_surrogate_path_round_trips(tmp_path):
    name = b"caf\xe9.png".decode("utf-8", "surrogateescape")
    path = tmp_path / "out.jsonl"
    with JsonlSink(path) as s:
        s.append(rec(name))
    assert JsonlSink(path).done_keys() == {record_key(rec(name))}


def test_trailing_partial_line_dropped_and_file_repaired(tmp_path):
    path = tmp_path / "out.jsonl"
    good = (json.dumps(rec("a.png")) + "\n" + json.dumps(rec("b.png")) + "\n").encode()
    path.write_bytes(good + b'{"task": "caption", "input": "c.p')  # crash mid-write
    sink = JsonlSink(path)
    assert sink.done_keys() == {record_key(rec("a.png")), record_key(rec("b.png"))}
    assert sink.repaired
    assert len(sink.warnings) == 1 and "torn last record" in sink.warnings[0]
    assert str(path) in sink.warnings[0]
    assert path.read_bytes() == good
    # no temp left; the dropped bytes are kept in a .torn copy the warning names
    (copy,) = [p for p in tmp_path.iterdir() if p.name != "out.jsonl"]
    assert copy.name.startswith("out.jsonl.torn-") and str(copy) in sink.warnings[0]
    assert copy.read_bytes() == b'{"task": "caption", "input": "c.p'
    # appending after repair yields a clean file
    with sink:
        sink.append(rec("c.png"))
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and [json.loads(x)["input"] for x in lines[:-1]] == ["a.png", "b.png", "c.png"]
    again = JsonlSink(path)
    assert len(again.done_keys()) == 3 and again.warnings == []


def test_trailing_invalid_json_with_newline_refused_untouched(tmp_path):
    # one os.write puts a record and its newline: a crash never leaves a broken line that
    # ends in a newline, so such a line is not ours to cut (it was repaired, cut, before)
    path = tmp_path / "out.jsonl"
    good = (json.dumps(rec("a.png")) + "\n").encode()
    path.write_bytes(good + b'{"task": "capt\n')
    with pytest.raises(OutputError, match="line 2 is not JSON"):
        JsonlSink(path).done_keys()
    assert path.read_bytes() == good + b'{"task": "capt\n'
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]  # no .torn copy either


def test_append_without_done_keys_never_glues_onto_partial_line(tmp_path):
    path = tmp_path / "out.jsonl"
    good = (json.dumps(rec("a.png")) + "\n").encode()
    path.write_bytes(good + b'{"task": "cap')
    with JsonlSink(path) as sink:
        sink.append(rec("b.png"))
    assert path.read_bytes() == good + (json.dumps(rec("b.png"), ensure_ascii=False) + "\n").encode()


@pytest.mark.parametrize("middle, why", [
    ("this is not json", "line 2 is not JSON"),
    ("[1, 2]", "line 2 is not a JSON object"),
    ('{"no": "keys"}', "line 2 is a JSON object without 'task' and 'input'"),
])
def test_foreign_line_in_the_middle_refused_untouched(tmp_path, middle, why):
    # a file with a line that is not a record is not vlmspec's: never repaired or appended
    path = tmp_path / "out.jsonl"
    content = json.dumps(rec("a.png")) + "\n" + middle + "\n\n" + json.dumps(rec("b.png")) + "\n"
    path.write_text(content)
    sink = JsonlSink(path)
    with pytest.raises(OutputError, match="not a vlmspec results JSONL file") as info:
        sink.done_keys()
    assert str(path) in str(info.value) and why in str(info.value)
    with pytest.raises(OutputError):
        sink.append(rec("c.png"))
    assert path.read_text() == content
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]


def test_empty_and_missing_file(tmp_path):
    assert JsonlSink(tmp_path / "nope.jsonl").done_keys() == set()
    (tmp_path / "empty.jsonl").write_bytes(b"")
    s = JsonlSink(tmp_path / "empty.jsonl")
    assert s.done_keys() == set() and s.warnings == []


def test_close_idempotent(tmp_path):
    s = JsonlSink(tmp_path / "o.jsonl")
    s.append(rec("a.png"))
    s.close()
    s.close()
    s.append(rec("b.png"))  # reopens lazily
    s.close()
    assert len(JsonlSink(tmp_path / "o.jsonl").done_keys()) == 2


def test_atomic_write_text_replaces_and_leaves_no_temp(tmp_path):
    p = tmp_path / "sub" / "summary.json"
    atomic_write_text(p, "first\n")
    assert p.read_text() == "first\n"
    os.chmod(p, 0o640)
    atomic_write_text(p, "second \u2603\n")
    assert p.read_text(encoding="utf-8") == "second \u2603\n"
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o640  # mode preserved
    assert [x.name for x in p.parent.iterdir()] == ["summary.json"]


def test_atomic_write_bytes_failure_cleans_temp(tmp_path, monkeypatch):
    p = tmp_path / "x.bin"
    atomic_write_bytes(p, b"old")

    def boom(src, dst):
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk on fire"):
        atomic_write_bytes(p, b"new")
    monkeypatch.undo()
    assert p.read_bytes() == b"old"
    assert [x.name for x in tmp_path.iterdir()] == ["x.bin"]
