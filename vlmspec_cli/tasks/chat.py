"""Conversation files for ``vlmspec caption --chat FILE``.

The file is UTF-8 JSONL: one conversation per line; blank lines and lines
whose first non-blank character is ``#`` are skipped.  A conversation::

    {"id": "conv-1", "messages": [
        {"role": "user", "text": "describe the image.", "images": ["a.png"]},
        {"role": "assistant", "text": "a red circle ..."},
        {"role": "user", "text": "what colour was the circle?"}]}

(written on a single line in the file).

* ``id`` (optional): a non-empty string or an integer; unique within the
  file.  Default: ``"<file name>:<line number>"``.
* ``messages``: a non-empty list.  Each message has ``role`` (``"user"`` or
  ``"assistant"``) and ``text`` (a non-empty string); user messages may also
  have ``images``, a list of image paths, relative ones resolved against the
  directory of the JSONL file.  The last message must be from the user: the
  model writes the next assistant turn.
* Nothing else: an unknown key in a conversation or a message is an error
  (with a suggestion when a valid key is close).

Principle (as in :mod:`vlmspec_cli.tasks.inputs`): a bad line never loses
the good ones.  :func:`read_chat_file` turns each bad line into a
:class:`ChatLineError` and raises :class:`InputError` only when the file
itself is unusable.  Images are loaded later, per conversation, by
:func:`load_conversation_images`.

This module knows nothing about the UI (no click/rich imports).
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import stat
from dataclasses import dataclass
from typing import Any

from PIL import Image

from vlmspec_cli.suggest import did_you_mean
from vlmspec_cli.tasks.json_line import JsonLineError, parse_json_line
from vlmspec_cli.tasks.inputs import (MAX_IMAGE_BYTES, InputError, load_image, name_problem,
                                      read_regular_file, shown_name, size_text,
                                      stat_regular)

__all__ = ["ChatTurn", "Conversation", "ChatLineError", "read_chat_file", "load_conversation_images",
           "parse_messages", "fs_name", "conversation_digest"]

ROLES = ("user", "assistant")
# the bounds of a --chat file: its size (a larger one is refused unread), one conversation's
# line, and the conversations read from one file (past it: one error, the rest not read)
MAX_CHAT_BYTES = 64 * 1024 ** 2
MAX_CHAT_LINE = 1024 ** 2          # characters
MAX_CONVERSATIONS = 100_000
CONVERSATION_KEYS = ("id", "messages")
MESSAGE_KEYS = ("role", "text", "images")
# Common spellings from other chat formats that difflib would not find.
_KEY_HINTS = {"content": "text"}


@dataclass(frozen=True)
class ChatTurn:
    role: str  # "user" or "assistant"
    text: str
    image_paths: tuple[str, ...] = ()  # resolved against the file's directory


@dataclass
class Conversation:
    key: str  # the id, or "<file name>:<line number>"
    line: int  # 1-based line number in the file
    turns: list[ChatTurn]


@dataclass(frozen=True)
class ChatLineError:
    line: int
    key: str  # the id when it could be parsed, else "<file name>:<line number>"
    reason: str  # one line, starting with "line N: "


class _LineError(Exception):
    """Internal: what is wrong with one line (without the ``line N:`` prefix)."""


_JSON_TYPES = {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}


def _type_name(value: Any) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _check_keys(obj: dict, valid: tuple[str, ...], where: str) -> None:
    for key in obj:
        if key not in valid:
            hint = did_you_mean(key, valid, aliases=_KEY_HINTS)
            raise _LineError(f"{where}unknown key '{key}'{hint}")


def _parse_id(conv: Any) -> str | None:
    """The conversation's id as a key, or ``None`` when absent or invalid."""
    if not isinstance(conv, dict) or "id" not in conv:
        return None
    value = conv["id"]
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    return str(value) if str(value) else None


def _parse_message(i: int, msg: Any, base_dir: str) -> ChatTurn:
    if not isinstance(msg, dict):
        raise _LineError(f"message {i} must be an object, got {_type_name(msg)}")
    _check_keys(msg, MESSAGE_KEYS, f"message {i}: ")
    if "role" not in msg:
        raise _LineError(f"message {i} has no role")
    role = msg["role"]
    if role not in ROLES:
        raise _LineError(f"message {i}: role {json.dumps(role)} is not 'user' or 'assistant'")
    if "text" not in msg:
        raise _LineError(f"message {i} has no text")
    text = msg["text"]
    if not isinstance(text, str):
        raise _LineError(f"message {i}: text must be a string, got {_type_name(text)}")
    if not text.strip():
        raise _LineError(f"message {i} has empty text")
    if not _is_unicode(text):  # a JSON escape of half a surrogate pair: no tokenizer takes it
        raise _LineError(f"message {i}: text holds a lone surrogate (an escape like \\ud800), "
                         "not Unicode text")
    images = msg.get("images", [])
    if "images" in msg and role != "user":
        raise _LineError(f"message {i}: images are only allowed on user messages")
    if not isinstance(images, list):
        raise _LineError(f"message {i}: 'images' must be a list of paths, got {_type_name(images)}")
    paths: list[str] = []
    for j, p in enumerate(images, 1):
        if not isinstance(p, str) or not p:
            raise _LineError(f"message {i}: image {j} must be a non-empty path string")
        p = fs_name(p)
        if name_problem(p):
            raise _LineError(f"message {i}: image {j} ({shown_name(p)}): {name_problem(p)}")
        paths.append(p if os.path.isabs(p) else os.path.join(base_dir, p))
    return ChatTurn(role=role, text=text, image_paths=tuple(paths))


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def fs_name(path: str) -> str:
    """A path written in the (UTF-8) file as the file system names it, whatever the locale's
    encoding (under LC_ALL=C, "café.png" is the bytes c3 a9); unchanged when it cannot be
    (name_problem then says why)."""
    try:
        return os.fsdecode(path.encode("utf-8", "surrogateescape"))
    except UnicodeError:
        return path


def _parse_conversation(conv: Any, base_dir: str) -> list[ChatTurn]:
    if not isinstance(conv, dict):
        raise _LineError(f"expected a JSON object, got {_type_name(conv)}")
    _check_keys(conv, CONVERSATION_KEYS, "")
    if "id" in conv and _parse_id(conv) is None:
        raise _LineError("'id' must be a non-empty string or an integer")
    if "messages" not in conv:
        raise _LineError("missing 'messages'")
    messages = conv["messages"]
    if not isinstance(messages, list):
        raise _LineError(f"'messages' must be a list, got {_type_name(messages)}")
    if not messages:
        raise _LineError("'messages' is empty")
    turns = [_parse_message(i, m, base_dir) for i, m in enumerate(messages, 1)]
    if turns[-1].role != "user":
        raise _LineError("last message must be from the user")
    return turns


def parse_messages(messages: Any, base_dir: str) -> list[ChatTurn]:
    """A conversation's ``messages`` checked as a --chat line's are (for other files that
    hold conversations: ``vlmspec bench``); ValueError with the reason otherwise."""
    try:
        return _parse_conversation({"messages": messages}, base_dir)
    except _LineError as e:
        raise ValueError(str(e)) from None


def _read_text(path: str) -> str:
    size = stat_regular(path).st_size
    if size > MAX_CHAT_BYTES:
        raise InputError(path, f"is {size_text(size)}, more than the {size_text(MAX_CHAT_BYTES)} "
                               "a --chat file may be; not read (split it)")
    # a binary file fails on its first KB, not after being read whole
    data = read_regular_file(path, check_head=_not_utf8)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(path, f"not UTF-8 text (invalid byte at offset {e.start})") from None


def _not_utf8(head: bytes) -> str | None:
    try:  # incremental: a character cut at the end of the head is fine
        codecs.getincrementaldecoder("utf-8-sig")("strict").decode(head, final=False)
    except UnicodeDecodeError as e:
        return f"not UTF-8 text (invalid byte at offset {e.start})"
    return None


def read_chat_file(path: str) -> list[Conversation | ChatLineError]:
    """Parse a conversation JSONL file; results in file order.

    Never raises for a bad line (it becomes a :class:`ChatLineError`, as does a line
    longer than MAX_CHAT_LINE characters, and the line past MAX_CONVERSATIONS, after which
    nothing is read); raises :class:`InputError` when the file is missing, a directory,
    unreadable, empty, larger than MAX_CHAT_BYTES (unread), not UTF-8, or holds only
    blank and comment lines.  Images are not
    opened here (see :func:`load_conversation_images`).
    """
    path = os.fspath(path)
    text = _read_text(path)
    name = os.path.basename(path)
    base_dir = os.path.dirname(path)
    out: list[Conversation | ChatLineError] = []
    first_line: dict[str, int] = {}
    # split on "\n" only: str.splitlines() would also split at U+2028 etc.,
    # which JSON allows unescaped inside strings
    read = 0
    for n, raw in enumerate(text.split("\n"), 1):
        s = raw.strip()
        if not s or s.startswith("#"):
            continue
        key = f"{name}:{n}"
        read += 1
        if read > MAX_CONVERSATIONS:
            out.append(ChatLineError(line=n, key=key, reason=(
                f"line {n}: more than {MAX_CONVERSATIONS:,} conversations in one file; this "
                "line and the rest are not read (split the file)")))
            break
        if len(raw) > MAX_CHAT_LINE:
            out.append(ChatLineError(line=n, key=key, reason=(
                f"line {n}: longer than {MAX_CHAT_LINE:,} characters; not read")))
            continue
        try:
            try:  # parse the raw line so error columns match the file
                conv = parse_json_line(raw)
            except JsonLineError as e:
                raise _LineError(str(e)) from None
            key = _parse_id(conv) or key
            turns = _parse_conversation(conv, base_dir)
            if key in first_line:
                raise _LineError(f"duplicate id '{key}' (first on line {first_line[key]})")
        except _LineError as e:
            out.append(ChatLineError(line=n, key=key, reason=f"line {n}: {e}"))
            continue
        first_line[key] = n
        out.append(Conversation(key=key, line=n, turns=turns))
    if not out:
        raise InputError(path, "holds no conversations (only blank and comment lines)")
    return out


def load_conversation_images(conv: Conversation) -> list[list[Image.Image]]:
    """Load each turn's images (one list per turn, empty for text-only turns).

    Raises :class:`InputError` for the first image that cannot be used; its
    ``path`` is the image and its reason starts with ``line N: message M:``.
    """
    loaded: list[list[Image.Image]] = []
    for i, turn in enumerate(conv.turns, 1):
        images: list[Image.Image] = []
        for p in turn.image_paths:
            try:
                images.append(load_image(p))
            except InputError as e:
                raise InputError(e.path, f"line {conv.line}: message {i}: {e.reason}") from None
        loaded.append(images)
    return loaded


def conversation_digest(conv: Conversation) -> str:
    """``sha256:HEX`` of everything that makes the conversation: each turn's role and text
    and the bytes of each of its images (not their paths: a picture replaced under the same
    name is another conversation, the same picture under another name is not). Part of a
    --chat record's resume key, so an edited conversation is decoded again and an unchanged
    one is recognised wherever its line moves. An image that cannot be read contributes why
    (that job fails when it loads, and a failure is never "done")."""
    h = hashlib.sha256()
    for turn in conv.turns:
        h.update(json.dumps([turn.role, turn.text]).encode("utf-8", "surrogatepass"))
        for path in turn.image_paths:
            h.update(b"\0image\0" + _file_digest(path).encode("ascii"))
    return f"sha256:{h.hexdigest()}"


def _file_digest(path: str) -> str:
    """The SHA-256 of a regular file's bytes, or why there is none; never blocks (a FIFO is
    not opened) and never reads more than an image may be."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return "not-a-file"
        if st.st_size > MAX_IMAGE_BYTES:
            return f"too-large:{st.st_size}"
        h = hashlib.sha256()
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
                if fh.tell() > MAX_IMAGE_BYTES:   # grew since stat
                    return "too-large"
        return h.hexdigest()
    except OSError as e:
        return f"unreadable:{e.errno}"
