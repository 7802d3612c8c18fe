"""tasks/output_files.py: the one rule every whole-file output follows (new file, or with
--force a file in the output's own format; never an input; atomic), and the profile
include chain calibrate checks against."""

from __future__ import annotations

import os

import pytest
from PIL import Image

from corpus import write_foreign_json, write_foreign_yaml, write_user_notes
from vlmspec_cli.png_mark import mark_png
from vlmspec_cli.profile import include_chain
from vlmspec_cli.tasks.output_files import (OutputRefused, is_own_png, is_profile, png_text,
                                            refusal, write_checked)

PNG = dict(ours=is_own_png, what="PNG image vlmspec wrote")


def own_png(path, **text) -> None:
    import io

    buf = io.BytesIO()
    Image.new("RGB", (2, 2), "red").save(buf, format="PNG")
    path.write_bytes(mark_png(buf.getvalue(), **text))


def test_refusal_rules(tmp_path):
    new, png, notes = tmp_path / "new.png", tmp_path / "a.png", tmp_path / "b.png"
    own_png(png)
    write_user_notes(notes)
    assert refusal(new, force=False, **PNG) is None
    assert refusal(png, force=False, **PNG) == "exists (use --force to overwrite)"
    assert refusal(png, force=True, **PNG) is None
    assert "is not a PNG image" in refusal(notes, force=True, **PNG)
    # a person's photo is a PNG too: --force does not replace it, and the hint without
    # --force does not suggest it (it used to say "use --force", which then refused)
    photo = tmp_path / "photo.png"
    Image.new("RGB", (2, 2), "blue").save(photo)
    for force in (False, True):
        assert refusal(photo, force=force, **PNG) == (
            "exists and is not a PNG image vlmspec wrote: not overwritten, even with --force")
    assert refusal(tmp_path, force=True, **PNG) == "is a directory"
    link = tmp_path / "link.png"
    os.symlink(png, link)
    assert "is an input" in refusal(link, force=True, inputs=[png], **PNG)   # one file, two names
    assert refusal(png / "sub" / "x.png", force=True, **PNG) == f"cannot be created: {png} is not a folder"
    dangling = tmp_path / "dangling.png"
    os.symlink(tmp_path / "gone", dangling)
    assert refusal(dangling, force=True, **PNG).startswith("is a symbolic link to a missing file")


def test_is_profile(tmp_path):
    hw, mine, empty = tmp_path / "hw.yaml", tmp_path / "mine.yaml", tmp_path / "empty.yaml"
    hw.write_text("# written by vlmspec profile\nhardware: {latency_ratio: 0.2}\n")
    mine.write_text("include: tinyworld-caption\nname: mine\nmethod: tabed\n")
    empty.write_text("")
    assert is_profile(hw) and is_profile(hw, "hardware") and is_profile(mine)
    assert not is_profile(mine, "hardware") and not is_profile(empty)
    for make in (write_user_notes, write_foreign_yaml, write_foreign_json):
        other = tmp_path / f"{make.__name__}.yaml"
        make(other)
        assert not is_profile(other)


def test_write_checked_is_atomic_and_never_clobbers(tmp_path):
    target = tmp_path / "sub" / "out.png"
    png = (tmp_path / "model.png")
    own_png(png)
    first = png.read_bytes()
    write_checked(target, first, force=False, **PNG)     # folder created
    with pytest.raises(OutputRefused, match="out.png: exists"):
        write_checked(target, first + b"second", force=False, **PNG)
    write_checked(target, first + b"third", "--plot out.png", force=True, **PNG)
    assert target.read_bytes().endswith(b"third") and os.listdir(target.parent) == ["out.png"]


def test_the_pngs_vlmspec_writes_say_so(tmp_path):
    """mark_png adds tEXt chunks after IHDR (PIL still reads the image and its text);
    png_text reads them back from the chunk headers; plots and images carry the mark."""
    from vlmspec_cli.plot import Bars, bar_chart_png

    own = tmp_path / "own.png"
    own_png(own, **{"vlmspec-job": '{"prompt": "a red circle"}'})
    assert png_text(own) == {"Software": "vlmspec", "vlmspec-job": '{"prompt": "a red circle"}'}
    with Image.open(own) as im:
        im.load()
        assert im.size == (2, 2) and im.getpixel((0, 0)) == (255, 0, 0)
        assert im.text["Software"] == "vlmspec"
    chart = tmp_path / "chart.png"
    chart.write_bytes(bar_chart_png(["a"], [Bars("s", [1.0])]))
    assert is_own_png(chart) and is_own_png(own)
    plain = tmp_path / "plain.png"
    Image.new("RGB", (2, 2)).save(plain)
    assert png_text(plain) == {} and not is_own_png(plain)
    assert png_text(tmp_path / "missing.png") is None and png_text(tmp_path) is None
    with pytest.raises(ValueError):
        mark_png(b"GIF89a")


def test_include_chain(tmp_path, monkeypatch):
    monkeypatch.delenv("VLMSPEC_PROFILES")   # the shipped profiles, not the tests' (conftest)
    chain = include_chain("tinyworld-tabed")
    assert [p.stem for p in chain] == ["tinyworld-tabed", "tinyworld-caption"]
    (tmp_path / "hw.yaml").write_text("hardware: {latency_ratio: 0.2}\n")
    base = tmp_path / "base.yaml"
    base.write_text("include: [tinyworld-tabed, hw.yaml]\n")
    assert [p.stem for p in include_chain(str(base))] == ["base", "tinyworld-tabed",
                                                          "tinyworld-caption", "hw"]
