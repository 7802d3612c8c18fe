"""Reading a YAML file the user names (a profile, its includes, a file vlmspec may
overwrite) without trusting it.

A file is read only when it is a regular file of at most :data:`MAX_BYTES` (never a FIFO,
whose open would block, nor ``/dev/zero``, which never ends), and only as UTF-8 text.
Before anything is composed, its event stream (PyYAML's parser keeps its own stack, so it
does not recurse) is checked: collections nested at most :data:`MAX_DEPTH` deep (the
composer recurses once per level) and aliases adding at most :data:`MAX_ALIAS_SIZE` to the
document in all (a "billion laughs" document is a few hundred bytes whose aliases name a
billion nodes). An alias adds the size of what its anchor names, aliases inside it
included: a node counts 1 and a scalar its length too. Every refusal is a
:class:`YamlFileError` whose message is one line, without the file's name (the caller
adds it).

No click or rich here.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

MAX_BYTES = 1024 ** 2        # a profile is a few KiB; a hardware profile's tables, tens
MAX_DEPTH = 64               # a profile nests 2 levels, its measurements a few more
MAX_ALIAS_SIZE = MAX_BYTES   # what aliases may add: at most doubling the largest file

_O_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_COLLECTION_START = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_COLLECTION_END = (yaml.SequenceEndEvent, yaml.MappingEndEvent)


class YamlFileError(Exception):
    """A YAML file (or text) vlmspec will not read; ``str()`` says why, in one line."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _size(n: int) -> str:
    return f"{n / 1024 ** 2:.1f} MiB" if n >= 1024 ** 2 else f"{n:,} bytes"


def read_text(path: str | os.PathLike, what: str = "YAML file", limit: int = MAX_BYTES) -> str:
    """The text of ``path``: a regular file of at most ``limit`` bytes, UTF-8. Checked with
    ``os.stat`` before it is opened, and again on the open descriptor (opened
    non-blocking, so a FIFO put in its place cannot hang the read)."""
    def refuse(st: os.stat_result) -> None:
        if not stat.S_ISREG(st.st_mode):
            raise YamlFileError(f"is {_kind(st.st_mode)}, not a {what}")
        if st.st_size > limit:
            raise YamlFileError(f"{_size(st.st_size)}, over the {_size(limit)} a {what} may be")

    try:
        refuse(os.stat(path))
        fd = os.open(path, _O_FLAGS)
    except OSError as exc:
        raise YamlFileError(f"cannot read {what}: {exc.strerror or exc}") from None
    try:
        refuse(os.fstat(fd))
        chunks, total = [], 0
        while total <= limit and (chunk := os.read(fd, limit + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
    except OSError as exc:
        raise YamlFileError(f"cannot read {what}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:  # it grew since the check
        raise YamlFileError(f"over the {_size(limit)} a {what} may be")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise YamlFileError(f"not UTF-8 text (byte 0x{data[exc.start]:02x} at line {line}, "
                            f"offset {exc.start}); a {what} is a UTF-8 text file") from None


def check_events(text: str) -> None:
    """Raise YamlFileError when ``text``'s collections nest deeper than MAX_DEPTH or its
    aliases add more than MAX_ALIAS_SIZE (nodes + scalar characters). YAML syntax errors
    raise yaml.YAMLError, as loading would."""
    sizes: dict[str, int] = {}    # anchor -> size of its value, expanded
    open_: list[list] = []        # [anchor, size so far] per open collection
    added = 0                     # what the aliases add
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, _COLLECTION_START):
            if len(open_) >= MAX_DEPTH:
                raise YamlFileError(f"nested more than {MAX_DEPTH} levels deep (line "
                                    f"{event.start_mark.line + 1})")
            open_.append([event.anchor, 1])
            continue
        if isinstance(event, _COLLECTION_END):
            anchor, n = open_.pop()
        elif isinstance(event, yaml.ScalarEvent):
            anchor, n = event.anchor, 1 + len(event.value)
        elif isinstance(event, yaml.AliasEvent):
            anchor, n = None, sizes.get(event.anchor, 1)
            added += n
            if added > MAX_ALIAS_SIZE:
                raise YamlFileError(f"its aliases expand it past {_size(MAX_ALIAS_SIZE)} "
                                    f"(line {event.start_mark.line + 1}: *{event.anchor}); "
                                    "an alias bomb?")
        else:
            continue
        if anchor is not None:
            sizes[anchor] = n
        if open_:
            open_[-1][1] += n


def _yaml_error(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        return f"invalid YAML{where}: {exc.problem or exc.context or exc}"
    return f"invalid YAML: {exc}"


class _UniqueKeyLoader(yaml.SafeLoader):
    """The safe loader, refusing a key given twice in one mapping (PyYAML keeps the last
    silently: a profile's second ``method:`` overrode the first unseen)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}   # key -> the line it is first on
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":   # ``<<: *anchor``: merged
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:   # an unhashable key: the base constructor says so
                    break
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key '{key}' (first on line {first})",
                        key_node.start_mark)
                seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


def load_text(text: str) -> Any:
    """The YAML document in ``text`` (safe types only) once :func:`check_events` passed; a
    key given twice in one mapping is an error; every failure is a YamlFileError (syntax
    errors say where)."""
    try:
        check_events(text)
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        raise YamlFileError(_yaml_error(exc)) from None
    except ValueError as exc:  # e.g. an integer of more digits than int() converts
        raise YamlFileError(f"invalid YAML: {str(exc).split(';')[0]}") from None
    except RecursionError:  # not expected past check_events; never a traceback
        raise YamlFileError("nested too deeply to read") from None


def load_file(path: str | os.PathLike, what: str = "YAML file") -> Any:
    """The YAML document in ``path``, read and checked as :func:`read_text` and
    :func:`load_text` do."""
    return load_text(read_text(Path(path), what))
