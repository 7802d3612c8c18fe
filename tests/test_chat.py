"""Tests for vlmspec_cli.tasks.chat (conversation JSONL for ``caption --chat``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from PIL import Image

from vlmspec_cli.tasks.chat import (
    ChatLineError,
    ChatTurn,
    Conversation,
    load_conversation_images,
    read_chat_file,
)
from vlmspec_cli.tasks.inputs import REASON_EMPTY, REASON_IS_DIR, REASON_MISSING, InputError


def _png(p: Path, colour: tuple[int, int, int] = (200, 0, 0), size: tuple[int, int] = (5, 3)) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(p, format="PNG")
    return p


def _user(text: str, images: list[str] | None = None) -> dict:
    return {"role": "user", "text": text, **({"images": images} if images is not None else {})}


def _write(path: Path, lines: list[object]) -> Path:
    """Dicts are dumped as JSON; strings are written verbatim."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines)
    path.write_text(text, encoding="utf-8")
    return path


GOOD = {"messages": [_user("hi")]}


# ------------------------------------------------------------------ good files


def test_multi_turn_with_images_resolves_relative_paths(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _png(data / "imgs" / "a.png", (255, 0, 0))
    _png(data / "b.png", (0, 0, 255), size=(7, 2))
    absolute = str(_png(tmp_path / "elsewhere" / "c.png", (0, 255, 0)))
    conv = {
        "id": "conv-1",
        "messages": [
            _user("describe the image.", ["imgs/a.png", absolute]),
            {"role": "assistant", "text": "a red circle"},
            _user("and this one?", ["b.png"]),
        ],
    }
    f = _write(data / "chat.jsonl", [conv])
    [c] = read_chat_file(str(f))
    assert isinstance(c, Conversation)
    assert (c.key, c.line) == ("conv-1", 1)
    assert c.turns == [
        ChatTurn("user", "describe the image.", (os.path.join(str(data), "imgs/a.png"), absolute)),
        ChatTurn("assistant", "a red circle", ()),
        ChatTurn("user", "and this one?", (os.path.join(str(data), "b.png"),)),
    ]
    images = load_conversation_images(c)
    assert [len(t) for t in images] == [2, 0, 1]
    assert images[0][0].getpixel((0, 0)) == (255, 0, 0)
    assert images[0][1].getpixel((0, 0)) == (0, 255, 0)
    assert images[2][0].size == (7, 2) and images[2][0].mode == "RGB"


def test_relative_chat_path_keeps_relative_image_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _png(tmp_path / "sub" / "x.png")
    _write(tmp_path / "sub" / "c.jsonl", [{"messages": [_user("look", ["x.png"])]}])
    [c] = read_chat_file("sub/c.jsonl")
    assert c.turns[0].image_paths == (os.path.join("sub", "x.png"),)
    assert load_conversation_images(c)[0][0].size == (5, 3)


def test_text_only_default_and_int_ids_blank_and_comment_lines(tmp_path: Path) -> None:
    f = _write(
        tmp_path / "talk.jsonl",
        [
            "# a comment",
            "",
            {"messages": [_user("hello"), {"role": "assistant", "text": "hi"}, _user("bye")]},
            "   ",
            "   # indented comment",
            {"id": 7, "messages": [_user("seven")]},
        ],
    )
    a, b = read_chat_file(str(f))
    assert isinstance(a, Conversation) and isinstance(b, Conversation)
    assert (a.key, a.line) == ("talk.jsonl:3", 3)
    assert [(t.role, t.text) for t in a.turns] == [("user", "hello"), ("assistant", "hi"), ("user", "bye")]
    assert all(t.image_paths == () for t in a.turns)
    assert load_conversation_images(a) == [[], [], []]
    assert (b.key, b.line) == ("7", 6)


def test_crlf_and_utf8_bom_accepted(tmp_path: Path) -> None:
    f = tmp_path / "win.jsonl"
    line = json.dumps({"id": "w", "messages": [_user("caf\u00e9")]}).encode()
    f.write_bytes(b"\xef\xbb\xbf" + line + b"\r\n")
    [c] = read_chat_file(str(f))
    assert c.key == "w" and c.turns[0].text == "caf\u00e9"


# ------------------------------------------------------------------- bad lines

BAD_LINES: list[tuple[object, str]] = [
    ('{"messages": [{"role": "user" "text": "x"}]}', "not valid JSON (Expecting ',' delimiter at column 31)"),
    ('  {"id": 1,}', "not valid JSON (Expecting property name enclosed in double quotes at column 12)"),
    ({"id": "m"}, "missing 'messages'"),
    ({"messages": []}, "'messages' is empty"),
    ({"messages": "hi"}, "'messages' must be a list, got string"),
    ({"messages": [_user("a"), {"role": "user"}]}, "message 2 has no text"),
    ({"messages": [_user("")]}, "message 1 has empty text"),
    ({"messages": [_user("   ")]}, "message 1 has empty text"),
    ({"messages": [{"role": "user", "text": 3}]}, "message 1: text must be a string, got int"),
    (
        {"messages": [{"role": "system", "text": "x"}, _user("y")]},
        "message 1: role \"system\" is not 'user' or 'assistant'",
    ),
    ({"messages": [{"text": "x"}]}, "message 1 has no role"),
    ({"messages": ["x"]}, "message 1 must be an object, got string"),
    (
        {"messages": [_user("a"), {"role": "assistant", "text": "b", "images": ["a.png"]}, _user("c")]},
        "message 2: images are only allowed on user messages",
    ),
    ({"messages": [_user("a", "a.png")]}, "message 1: 'images' must be a list of paths, got string"),
    ({"messages": [_user("a", ["ok.png", 5])]}, "message 1: image 2 must be a non-empty path string"),
    (
        {"messages": [{"role": "user", "text": "a", "imgs": ["a.png"]}]},
        "message 1: unknown key 'imgs' (did you mean 'images'?)",
    ),
    (
        {"messages": [{"role": "user", "content": "a"}]},
        "message 1: unknown key 'content' (did you mean 'text'?)",
    ),
    ({"content": "a"}, "unknown key 'content'"),  # 'text' is no conversation key
    ({"mesages": [_user("a")]}, "unknown key 'mesages' (did you mean 'messages'?)"),
    ({"messages": [_user("a")], "max_new_tokens": 5}, "unknown key 'max_new_tokens'"),
    ({"messages": [_user("a"), {"role": "assistant", "text": "b"}]}, "last message must be from the user"),
    ({"id": ["x"], "messages": [_user("a")]}, "'id' must be a non-empty string or an integer"),
    ('{"messages": [{"role": "user", "text": "a", "text": "b"}]}', "duplicate key 'text' in a JSON object"),
    ("[1, 2]", "expected a JSON object, got list"),
    ("[" * 100_000, "not valid JSON (nested too deeply)"),
]


@pytest.mark.parametrize("bad, reason", BAD_LINES, ids=[r for _, r in BAD_LINES])
def test_bad_line_is_reported_and_good_lines_kept(tmp_path: Path, bad: object, reason: str) -> None:
    f = _write(tmp_path / "c.jsonl", [{"id": "first", **GOOD}, "# comment", bad, {"id": "last", **GOOD}])
    results = read_chat_file(str(f))
    assert [type(r) for r in results] == [Conversation, ChatLineError, Conversation]
    first, err, last = results
    assert (first.key, first.line, last.key, last.line) == ("first", 1, "last", 4)
    assert err.line == 3
    assert err.reason == f"line 3: {reason}"
    assert "\n" not in err.reason
    expected_key = "m" if isinstance(bad, dict) and bad.get("id") == "m" else "c.jsonl:3"
    assert err.key == expected_key


def test_duplicate_id_keeps_first_and_reports_second(tmp_path: Path) -> None:
    f = _write(
        tmp_path / "c.jsonl",
        [
            {"id": "x", **GOOD},
            {"id": "y", **GOOD},
            "",
            {"id": "x", "messages": [_user("again")]},
            {"id": 2, **GOOD},
            {"id": "2", **GOOD},
        ],
    )
    results = read_chat_file(str(f))
    assert [(type(r).__name__, r.key, r.line) for r in results] == [
        ("Conversation", "x", 1),
        ("Conversation", "y", 2),
        ("ChatLineError", "x", 4),
        ("Conversation", "2", 5),
        ("ChatLineError", "2", 6),
    ]
    assert results[2].reason == "line 4: duplicate id 'x' (first on line 1)"
    assert results[4].reason == "line 6: duplicate id '2' (first on line 5)"


def test_only_bad_lines_returns_errors_not_raise(tmp_path: Path) -> None:
    f = _write(tmp_path / "c.jsonl", ["{oops", {"messages": []}])
    results = read_chat_file(str(f))
    assert [(type(r), r.line) for r in results] == [(ChatLineError, 1), (ChatLineError, 2)]


# ------------------------------------------------------------------ images


def test_missing_image_raises_naming_image_and_line(tmp_path: Path) -> None:
    _png(tmp_path / "ok.png")
    f = _write(
        tmp_path / "c.jsonl",
        [
            "# header",
            {"id": "good", "messages": [_user("a", ["ok.png"])]},
            {
                "id": "bad",
                "messages": [
                    _user("a", ["ok.png"]),
                    {"role": "assistant", "text": "b"},
                    _user("c", ["gone.png"]),
                ],
            },
        ],
    )
    good, bad = read_chat_file(str(f))  # reading never opens images
    assert len(load_conversation_images(good)[0]) == 1
    with pytest.raises(InputError) as ei:
        load_conversation_images(bad)
    assert ei.value.path == str(tmp_path / "gone.png")
    assert ei.value.reason == f"line 3: message 3: {REASON_MISSING}"
    assert str(ei.value) == f"{tmp_path / 'gone.png'}: line 3: message 3: {REASON_MISSING}"


def test_broken_image_raises_naming_image_and_line(tmp_path: Path) -> None:
    (tmp_path / "notes.png").write_text("just some text, not an image\n")
    f = _write(tmp_path / "c.jsonl", [{"messages": [_user("a", ["notes.png"])]}])
    [c] = read_chat_file(str(f))
    with pytest.raises(InputError) as ei:
        load_conversation_images(c)
    assert ei.value.path == str(tmp_path / "notes.png")
    assert ei.value.reason.startswith("line 1: message 1: not an image")


# ------------------------------------------------------------- unusable file


def test_missing_chat_file(tmp_path: Path) -> None:
    with pytest.raises(InputError) as ei:
        read_chat_file(str(tmp_path / "nope.jsonl"))
    assert (ei.value.path, ei.value.reason) == (str(tmp_path / "nope.jsonl"), REASON_MISSING)


def test_empty_chat_file(tmp_path: Path) -> None:
    (tmp_path / "e.jsonl").write_bytes(b"")
    with pytest.raises(InputError) as ei:
        read_chat_file(str(tmp_path / "e.jsonl"))
    assert ei.value.reason == REASON_EMPTY


def test_comments_only_chat_file(tmp_path: Path) -> None:
    f = _write(tmp_path / "c.jsonl", ["# nothing here", "", "  "])
    with pytest.raises(InputError, match="holds no conversations"):
        read_chat_file(str(f))


def test_directory_as_chat_file(tmp_path: Path) -> None:
    with pytest.raises(InputError) as ei:
        read_chat_file(str(tmp_path))
    assert (ei.value.path, ei.value.reason) == (str(tmp_path), REASON_IS_DIR)


def test_non_utf8_chat_file(tmp_path: Path) -> None:
    f = tmp_path / "latin1.jsonl"
    f.write_bytes(json.dumps({"messages": [_user("x")]}).encode() + b"\n" + b'{"id": "caf\xe9"}\n')
    with pytest.raises(InputError) as ei:
        read_chat_file(str(f))
    assert ei.value.reason.startswith("not UTF-8 text")


def test_a_conversation_without_an_id_is_named_file_colon_line_and_resumes(tmp_path: Path) -> None:
    """Its input read "c.jsonl#c.jsonl:2" (the default key after the file's name); now
    "c.jsonl:2", as the README says, and a rerun still resumes it (its source is its content's
    digest, which a rerun computes again)."""
    from click.testing import CliRunner

    from vlmspec_cli.cli import cli

    chat = _write(tmp_path / "c.jsonl", [{"id": "named", "messages": [_user("what is two plus two?")]},
                                         {"messages": [_user("what is one plus one?")]}])
    out = tmp_path / "r.jsonl"
    args = ["caption", "--chat", str(chat), "--json", "--out", str(out), "--max-new-tokens", "4", "-q"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert [json.loads(l)["input"] for l in res.stdout.splitlines()] == [f"{chat}#named", f"{chat}:2"]
    again = CliRunner().invoke(cli, args)
    assert again.exit_code == 0 and again.stdout == "" and len(out.read_text().splitlines()) == 2


def _chat_run(chat: Path, out: Path):
    from click.testing import CliRunner

    from vlmspec_cli.cli import cli

    res = CliRunner().invoke(cli, ["caption", "--chat", str(chat), "--json", "--out", str(out),
                                   "--max-new-tokens", "4", "-q"])
    assert res.exit_code == 0, res.output
    return [json.loads(l) for l in res.stdout.splitlines()]


def test_an_edited_conversation_is_decoded_again_and_an_unchanged_one_is_not(tmp_path: Path) -> None:
    """The resume key covers every turn and every image's bytes: editing the first user turn,
    the assistant turn, or replacing an image under the same name decodes that conversation
    again; the untouched one is skipped each time."""
    a = _png(tmp_path / "a.png")
    e1 = {"id": "e1", "messages": [_user("describe the image.", ["a.png"]),
                                   {"role": "assistant", "text": "a red square."},
                                   _user("what colour is it?")]}
    e2 = {"id": "e2", "messages": [_user("what is one plus one?")]}
    chat, out = tmp_path / "c.jsonl", tmp_path / "r.jsonl"
    _write(chat, [e1, e2])
    assert [r["input"] for r in _chat_run(chat, out)] == [f"{chat}#e1", f"{chat}#e2"]
    assert _chat_run(chat, out) == []          # unchanged: nothing decoded

    edits = [lambda c: c["messages"][0].update(text="describe the picture."),
             lambda c: c["messages"][1].update(text="a blue square."),
             lambda c: c["messages"][0].update(images=["b.png"])]
    _png(tmp_path / "b.png", colour=(0, 0, 200))
    for n, edit in enumerate(edits, 1):
        edit(e1)
        _write(chat, [e1, e2])
        assert [r["input"] for r in _chat_run(chat, out)] == [f"{chat}#e1"], f"edit {n}"
    _png(tmp_path / "b.png", colour=(0, 200, 0))   # the same name, other pixels
    assert [r["input"] for r in _chat_run(chat, out)] == [f"{chat}#e1"]
    assert _chat_run(chat, out) == []
    assert len(out.read_text().splitlines()) == 2 + len(edits) + 1


def test_conversations_without_an_id_resume_however_their_lines_move(tmp_path: Path) -> None:
    """Unnamed conversations are known by their content, not FILE:LINE: a comment and a blank
    line inserted above them, or their order changed, decode none of them again."""
    convs = [{"messages": [_user(q)]} for q in ("what is one plus one?", "what is two plus two?",
                                                "name a colour.")]
    chat, out = tmp_path / "c.jsonl", tmp_path / "r.jsonl"
    _write(chat, convs)
    first = _chat_run(chat, out)
    assert [r["input"] for r in first] == [f"{chat}:{n}" for n in (1, 2, 3)]
    assert len({r["source"] for r in first}) == 3
    assert all(r["source"].startswith(f"{chat.resolve()}#sha256:") for r in first)
    chat.write_text("# a comment\n\n" + "".join(json.dumps(c) + "\n" for c in reversed(convs)))
    assert _chat_run(chat, out) == []
    assert len(out.read_text().splitlines()) == 3


def test_chat_file_bounds_a_long_line_too_many_lines_and_a_huge_file(tmp_path: Path, monkeypatch) -> None:
    """A --chat file is read bounded: a line past MAX_CHAT_LINE fails alone, the line past
    MAX_CONVERSATIONS is one error and nothing after it is read, a file past MAX_CHAT_BYTES
    is refused unread (a million-line file planned a million items at 2 GB)."""
    import vlmspec_cli.tasks.chat as chat

    monkeypatch.setattr(chat, "MAX_CHAT_LINE", 200)
    monkeypatch.setattr(chat, "MAX_CONVERSATIONS", 3)
    f = _write(tmp_path / "c.jsonl", [GOOD, {"messages": [_user("x" * 300)]}, GOOD, "# c", GOOD,
                                      GOOD, GOOD])
    out = read_chat_file(str(f))
    assert [type(o).__name__ for o in out] == ["Conversation", "ChatLineError", "Conversation",
                                              "ChatLineError"]
    assert out[1].reason == "line 2: longer than 200 characters; not read"
    assert out[3].reason == ("line 5: more than 3 conversations in one file; this line and the "
                             "rest are not read (split the file)")
    monkeypatch.setattr(chat, "MAX_CHAT_BYTES", 100)
    with pytest.raises(InputError) as ei:
        read_chat_file(str(f))
    assert ei.value.reason == (f"is {f.stat().st_size} bytes, more than the 100 bytes a --chat "
                               "file may be; not read (split it)")
