from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

import pytest
from PIL import Image, ImageFile

try:  # works whether or not tests/ is a package
    from .corpus import make_bad_corpus, make_good_images
except ImportError:  # pragma: no cover
    from corpus import make_bad_corpus, make_good_images

from vlmspec_cli.tasks.inputs import (
    IMAGE_EXTENSIONS,
    InputError,
    InputItem,
    expand_inputs,
    load_image,
)


def _touch_png(p: Path, colour=(10, 20, 30), size=(4, 4)) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(p, format="PNG")
    return p


def _paths(items):
    return [it.path for it in items]


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """shots/ with nested, hidden, mixed-case and non-image entries; cwd = tmp_path."""
    monkeypatch.chdir(tmp_path)
    s = Path("shots")
    _touch_png(s / "b.png")
    _touch_png(s / "a.png")
    _touch_png(s / "C.JPG")
    _touch_png(s / "sub" / "d.png")
    _touch_png(s / "sub" / "deeper" / "e.webp")
    _touch_png(s / ".hidden.png")
    _touch_png(s / ".cache" / "f.png")
    (s / "readme.txt").write_text("hi")
    (s / "noext").write_bytes(b"x")
    return s


# ---------------------------------------------------------------- expansion


def test_image_extensions_constant():
    assert IMAGE_EXTENSIONS == (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff")


def test_explicit_files_kept_as_given_whatever_extension(tree):
    items = expand_inputs(["shots/readme.txt", "shots/a.png", "./shots/noext"])
    assert items == [
        InputItem("shots/readme.txt"),
        InputItem("shots/a.png"),
        InputItem("./shots/noext"),
    ]


def test_directory_recursive_sorted_filtered_hidden_skipped(tree):
    items = expand_inputs(["shots"])
    assert _paths(items) == [
        "shots/C.JPG",
        "shots/a.png",
        "shots/b.png",
        "shots/sub/d.png",
        "shots/sub/deeper/e.webp",
    ]
    assert all(it.error is None for it in items)
    # trailing slash gives the same user-facing names
    assert _paths(expand_inputs(["shots/"])) == _paths(items)


def test_directory_custom_extensions(tree):
    assert _paths(expand_inputs(["shots"], extensions=(".webp",))) == ["shots/sub/deeper/e.webp"]


def test_directory_named_like_image_is_descended(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _touch_png(Path("d") / "album.png" / "inner.png")
    assert expand_inputs(["d"]) == [InputItem("d/album.png/inner.png")]


def test_directory_dangling_symlink_becomes_error_item(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _touch_png(Path("d") / "ok.png")
    os.symlink("nowhere.png", "d/broken.png")
    os.symlink("nowhere.txt", "d/broken.txt")  # not an image extension: ignored
    items = expand_inputs(["d"])
    assert _paths(items) == ["d/broken.png", "d/ok.png"]
    assert "no such file or directory" in items[0].error
    assert items[1].error is None


def test_directory_symlink_cycle_terminates(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _touch_png(Path("d") / "a.png")
    os.symlink("..", "d/loop")
    assert _paths(expand_inputs(["d"])) == ["d/a.png"]


def test_glob_sorted_and_recursive(tree):
    assert _paths(expand_inputs(["shots/*.png"])) == ["shots/a.png", "shots/b.png"]
    assert _paths(expand_inputs(["shots/**/*.png"])) == [
        "shots/a.png",
        "shots/b.png",
        "shots/sub/d.png",
    ]
    # matched directories are skipped, non-image files filtered
    assert _paths(expand_inputs(["shots/*"])) == ["shots/C.JPG", "shots/a.png", "shots/b.png"]


def test_glob_with_literal_extension_keeps_those_files(tree):
    assert _paths(expand_inputs(["shots/*.txt"])) == ["shots/readme.txt"]


def test_glob_matching_nothing_is_error_item(tree):
    items = expand_inputs(["shots/*.nope", "nothere/*.png"])
    assert items == [
        InputItem("shots/*.nope", "no files match this pattern"),
        InputItem("nothere/*.png", "no files match this pattern"),
    ]


def test_existing_path_with_glob_chars_is_not_a_glob(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _touch_png(Path("odd[1].png"))
    assert expand_inputs(["odd[1].png"]) == [InputItem("odd[1].png")]


def test_missing_path_is_error_item(tree):
    items = expand_inputs(["shots/a.png", "gone.png", "shots/b.png"])
    assert items == [
        InputItem("shots/a.png"),
        InputItem("gone.png", "no such file or directory"),
        InputItem("shots/b.png"),
    ]


def test_stdin_comments_blanks_and_order(tree):
    stdin = io.StringIO(
        "# a list\n\n  shots/b.png  \n\t\nshots/sub\r\n# shots/a.png\n-\nmissing.png\nshots/*.jpg\n"
    )
    items = expand_inputs(["shots/C.JPG", "-", "-"], stdin=stdin)
    assert _paths(items) == [
        "shots/C.JPG",
        "shots/b.png",
        "shots/sub/d.png",
        "shots/sub/deeper/e.webp",
        "-",
        "missing.png",
        "shots/*.jpg",
    ]
    errors = {it.path: it.error for it in items if it.error}
    assert "stdin" in errors["-"]
    assert errors["missing.png"] == "no such file or directory"
    # case-insensitive extension, but the glob itself is case-sensitive: C.JPG is not *.jpg
    assert errors["shots/*.jpg"].startswith("no ")


def test_dedupe_keeps_first_occurrence(tree):
    items = expand_inputs(["shots/b.png", "shots", "./shots/a.png", "shots/*.png", "gone", "gone"])
    assert _paths(items) == [
        "shots/b.png",
        "shots/C.JPG",
        "shots/a.png",
        "shots/sub/d.png",
        "shots/sub/deeper/e.webp",
        "gone",
    ]


def test_bad_corpus_directory_expansion(tmp_path):
    root = tmp_path / "bad"
    expected = make_bad_corpus(root)
    items = expand_inputs([str(root)])
    names = [os.path.basename(it.path) for it in items]
    assert names == sorted(names)
    assert "folder.png" not in names  # directories are descended, never items
    assert "missing.png" not in names
    by_name = {os.path.basename(it.path): it for it in items}
    if "dangling.png" in expected:
        assert expected["dangling.png"] in by_name["dangling.png"].error
    # every other bad file is found and fails later, at load, with its reason
    for name, item in by_name.items():
        if item.error is None:
            with pytest.raises(InputError) as ei:
                load_image(item.path)
            assert expected[name] in ei.value.reason


# ---------------------------------------------------------------- loading


def test_load_image_bad_corpus_reasons(tmp_path):
    root = tmp_path / "bad"
    expected = make_bad_corpus(root)
    assert {"missing.png", "empty.png", "truncated.png", "notes.jpg", "folder.png"} <= set(expected)
    for name, reason in expected.items():
        path = str(root / name)
        with pytest.raises(InputError) as ei:
            load_image(path)
        msg = str(ei.value)
        assert name in msg, msg
        assert reason in msg, msg
        assert msg == f"{path}: {ei.value.reason}"
        assert ei.value.path == path


def test_truncated_jpeg_fails(tmp_path):
    p = tmp_path / "t.jpg"
    buf = io.BytesIO()
    Image.frombytes("RGB", (64, 64), os.urandom(64 * 64 * 3)).save(buf, format="JPEG", quality=95)
    p.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    with pytest.raises(InputError, match="truncated or corrupt image"):
        load_image(str(p))


def test_truncated_fails_even_if_global_flag_flipped(tmp_path):
    root = tmp_path / "bad"
    make_bad_corpus(root)
    ImageFile.LOAD_TRUNCATED_IMAGES = True
    try:
        with pytest.raises(InputError, match="truncated"):
            load_image(str(root / "truncated.png"))
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = False


def test_header_only_png_is_corrupt_not_unrecognized(tmp_path):
    p = tmp_path / "head.png"
    p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    with pytest.raises(InputError, match="truncated or corrupt image"):
        load_image(str(p))


def test_fifo_is_not_a_regular_file(tmp_path):
    p = tmp_path / "pipe.png"
    os.mkfifo(p)
    with pytest.raises(InputError, match="not a regular file"):
        load_image(str(p))  # must not block


def test_input_error_str_and_pickle():
    e = InputError("x/y.png", "empty file (0 bytes)")
    assert str(e) == "x/y.png: empty file (0 bytes)"
    e2 = pickle.loads(pickle.dumps(e))
    assert (e2.path, e2.reason, str(e2)) == (e.path, e.reason, str(e))


def test_good_images_load_as_rgb(tmp_path):
    paths = make_good_images(tmp_path / "good", 3)
    assert len(paths) == 3 and len({p.read_bytes() for p in paths}) == 3
    for p in paths:
        im = load_image(str(p))
        assert im.mode == "RGB" and im.size == (16, 16)


def test_jpeg_loads_as_rgb(tmp_path):
    p = tmp_path / "a.jpeg"
    Image.new("RGB", (8, 8), (200, 100, 50)).save(p, format="JPEG")
    im = load_image(str(p))
    assert im.mode == "RGB" and im.size == (8, 8)


def test_rgba_alpha_composited_on_white(tmp_path):
    p = tmp_path / "a.png"
    im = Image.new("RGBA", (4, 4), (255, 0, 0, 0))  # fully transparent red
    im.putpixel((0, 0), (0, 0, 255, 255))  # one opaque blue pixel
    im.save(p)
    out = load_image(str(p))
    assert out.mode == "RGB"
    assert out.getpixel((1, 1)) == (255, 255, 255)
    assert out.getpixel((0, 0)) == (0, 0, 255)


def test_palette_with_transparency_loads_as_rgb(tmp_path):
    p = tmp_path / "p.gif"
    im = Image.new("P", (4, 4), 0)
    im.putpalette([0, 255, 0] + [255, 0, 0] + [0] * (254 * 3))
    im.putpixel((0, 0), 1)
    im.save(p, transparency=0)
    out = load_image(str(p))
    assert out.mode == "RGB"
    assert out.getpixel((0, 0)) == (255, 0, 0)
    assert out.getpixel((2, 2)) == (255, 255, 255)  # transparent index -> white


def test_palette_and_gray16_and_la(tmp_path):
    p = tmp_path / "pal.png"
    Image.new("RGB", (4, 4), (0, 128, 255)).convert("P", palette=Image.Palette.ADAPTIVE).save(p)
    assert load_image(str(p)).mode == "RGB"

    p16 = tmp_path / "g16.png"
    Image.new("I;16", (4, 4), 40000).save(p16)
    px = load_image(str(p16)).getpixel((0, 0))
    assert px[0] == px[1] == px[2] and 140 < px[0] < 170  # scaled, not clipped to 255

    pla = tmp_path / "la.png"
    Image.new("LA", (4, 4), (0, 0)).save(pla)
    assert load_image(str(pla)).getpixel((0, 0)) == (255, 255, 255)


def test_explicit_non_image_extension_file_that_is_an_image_loads(tmp_path):
    p = tmp_path / "photo.dat"
    Image.new("RGB", (4, 4), (1, 2, 3)).save(p, format="PNG")
    assert expand_inputs([str(p)]) == [InputItem(str(p))]
    assert load_image(str(p)).getpixel((0, 0)) == (1, 2, 3)


def test_an_empty_path_is_one_clear_error():
    """'' (a recipe's --var left empty, a script's unset variable): an error item saying so,
    shown as '' (it read as "error: : no such file or directory")."""
    from vlmspec_cli.tasks.inputs import REASON_EMPTY_PATH, InputError, expand_inputs

    item, = expand_inputs([""])
    assert item.path == "" and item.error == REASON_EMPTY_PATH
    assert str(InputError(item.path, item.error)) == "'': an empty path names no file"
