"""Tests for vlmspec_cli.profile (fast, no models)."""

import textwrap

import pytest

from vlmspec_cli.profile import (
    DraftingSpec,
    ModelSpec,
    Profile,
    ProfileError,
    list_profiles,
    load_profile,
    profile_keys,
    profile_search_path,
    profile_to_dict,
    profile_to_yaml,
    resolve_profile_path,
)


def write(path, text):
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def test_default_profile_values(monkeypatch):
    monkeypatch.delenv("VLMSPEC_PROFILES")   # the shipped default, not the tests' (conftest)
    p = load_profile()
    assert p.name == "tinyworld-caption"
    assert p.task == "caption"
    assert p.target == ModelSpec(model="zoo:tinyworld/llava-target-deep")
    assert p.draft == ModelSpec(model="zoo:tinyworld/llava-deep-draft")
    assert p.method == "hidden" and p.hidden.model == "zoo:tinyworld/llava-deep-hidden"
    assert p.drafting == DraftingSpec(gamma=12, length="auto", inputs=["multimodal"])
    assert p.sampling.temperature == 0.0 and isinstance(p.sampling.temperature, float)
    assert p.sampling.seed == 0
    assert p.generation.max_new_tokens == 64
    assert p.generation.prompt == "describe the image."
    assert p.lossless is True
    assert p.source.endswith("tinyworld-caption.yaml")
    # Shipped default profile equals the dataclass defaults apart from name/description,
    # its thread count (tiny models: 1 thread; the key's default is auto), γ (calibrated
    # for the tiny pair; the key's default, 5, is the real pairs'), its method and head (its
    # target's own hidden-state head; the key's default, chain, needs no trained head); its
    # draft length is the key's default, auto (chosen per round, up to γ; drafting off while
    # it does not pay)
    assert p.runtime.threads == 1 and Profile().runtime.threads == "auto"
    assert Profile().drafting.gamma == 5 and Profile().drafting.length == "auto"
    shipped = profile_to_dict(p) | {"name": "x", "description": ""}
    shipped["runtime"]["threads"] = "auto"
    shipped["drafting"]["gamma"] = 5
    shipped["method"], shipped["hidden"]["model"] = Profile().method, Profile().hidden.model
    assert shipped == profile_to_dict(Profile()) | {"name": "x"}


def test_llava_profile_loads():
    p = load_profile("llava15-7b")
    assert p.target.model == "llava-hf/llava-1.5-7b-hf"
    assert p.generation.max_new_tokens == 128


def test_source_is_not_a_key():
    assert "source" not in profile_to_dict(Profile())
    assert "source" not in profile_keys()
    assert "drafting.gamma" in profile_keys()


def test_include_deep_merge(tmp_path):
    write(tmp_path / "base.yaml", """
        description: base
        target: {model: base/target, dtype: float16}
        drafting: {gamma: 3, inputs: [text, caption]}
        """)
    child = write(tmp_path / "child.yaml", """
        include: base.yaml
        name: child
        target: {device: cpu}
        drafting: {inputs: [pooled]}
        """)
    p = load_profile(str(child))
    assert p.name == "child" and p.description == "base"
    assert p.target.model == "base/target"      # from include
    assert p.target.dtype == "float16"          # from include, merged with child's section
    assert p.target.device == "cpu"             # from child
    assert p.drafting.gamma == 3
    assert p.drafting.inputs == ["pooled"]      # lists are replaced, not merged


def test_include_by_profile_name(tmp_path):
    child = write(tmp_path / "c.yaml", "include: [tinyworld-caption]\nname: c\n")
    p = load_profile(str(child))
    assert p.name == "c" and p.generation.prompt == "describe the image."


def test_include_cycle(tmp_path):
    write(tmp_path / "a.yaml", "include: b.yaml\n")
    write(tmp_path / "b.yaml", "include: a.yaml\n")
    with pytest.raises(ProfileError, match="cycle") as e:
        load_profile(str(tmp_path / "a.yaml"))
    assert "a.yaml -> " in str(e.value) and "b.yaml" in str(e.value)


def test_precedence(tmp_path):
    f = write(tmp_path / "p.yaml", "sampling: {temperature: 0.3}\n")
    empty = write(tmp_path / "empty.yaml", "name: empty\n")
    assert load_profile(str(empty)).sampling.temperature == 0.0   # dataclass default
    assert load_profile(str(f)).sampling.temperature == 0.3
    assert load_profile(str(f), ["sampling.temperature=0.5"]).sampling.temperature == 0.5
    p = load_profile(str(f), ["sampling.temperature=0.5"], {"sampling.temperature": 0.7})
    assert p.sampling.temperature == 0.7
    # None in the cli dict means "flag not given".
    p = load_profile(str(f), ["sampling.temperature=0.5"], {"sampling.temperature": None})
    assert p.sampling.temperature == 0.5
    # Later --set wins over earlier.
    p = load_profile(str(f), ["sampling.temperature=0.5", "sampling.temperature=0.6"])
    assert p.sampling.temperature == 0.6


def test_set_parses_types():
    p = load_profile(None, [
        "drafting.gamma=7",
        "drafting.inputs=[text, multimodal]",
        "hardware.latency_ratio=0.5",
        "target.revision=null",
        "target.trust_remote_code=true",
        "generation.prompt=what is: this?",   # str keys take the raw text
        "sampling.top_p=1",                   # int accepted for float
    ])
    assert p.drafting.gamma == 7
    assert p.drafting.inputs == ["text", "multimodal"]
    assert p.hardware.latency_ratio == 0.5
    assert p.target.revision is None
    assert p.target.trust_remote_code is True
    assert p.generation.prompt == "what is: this?"
    assert p.sampling.top_p == 1.0 and isinstance(p.sampling.top_p, float)
    with pytest.raises(ProfileError, match="KEY=VALUE"):
        load_profile(None, ["drafting.gamma"])


def test_unknown_key_nested_suggests(tmp_path):
    f = write(tmp_path / "x.yaml", "drafting:\n  gama: 3\n")
    with pytest.raises(ProfileError) as e:
        load_profile(str(f))
    msg = str(e.value)
    assert "x.yaml" in msg and "'drafting.gama'" in msg and "'drafting.gamma'" in msg
    with pytest.raises(ProfileError, match=r"drafting\.gama.*drafting\.gamma"):
        load_profile(None, ["drafting.gama=3"])
    with pytest.raises(ProfileError, match=r"drafting\.gama.*drafting\.gamma"):
        load_profile(None, cli={"drafting.gama": 3})


def test_unknown_key_top_level(tmp_path):
    f = write(tmp_path / "x.yaml", "methdo: chain\n")
    with pytest.raises(ProfileError, match=r"'methdo'.*did you mean 'method'"):
        load_profile(str(f))
    f = write(tmp_path / "y.yaml", "temperature: 0.5\n")
    with pytest.raises(ProfileError, match="sampling.temperature"):
        load_profile(str(f))
    f = write(tmp_path / "z.yaml", "zzzz: 1\n")
    with pytest.raises(ProfileError, match="valid keys.*drafting"):
        load_profile(str(f))


def test_wrong_type(tmp_path):
    f = write(tmp_path / "x.yaml", "drafting:\n  gamma: '3'\n")
    with pytest.raises(ProfileError, match=r"x\.yaml.*'drafting\.gamma'.*int"):
        load_profile(str(f))
    f = write(tmp_path / "b.yaml", "target: {trust_remote_code: 1}\n")
    with pytest.raises(ProfileError, match=r"target\.trust_remote_code.*bool"):
        load_profile(str(f))
    f = write(tmp_path / "s.yaml", "sampling: 3\n")
    with pytest.raises(ProfileError, match=r"'sampling' must be a mapping"):
        load_profile(str(f))


def test_bad_choice_and_range(tmp_path):
    f = write(tmp_path / "x.yaml", "target: {dtype: fp16}\n")
    with pytest.raises(ProfileError, match=r"target\.dtype.*bfloat16"):
        load_profile(str(f))
    with pytest.raises(ProfileError, match=r"drafting\.inputs.*multimodal"):
        load_profile(None, ["drafting.inputs=[txt]"])
    with pytest.raises(ProfileError, match=r"target\.device.*cuda:N"):
        load_profile(None, ["target.device=gpu"])
    assert load_profile(None, ["target.device=cuda:1"]).target.device == "cuda:1"
    with pytest.raises(ProfileError, match=r"sampling\.top_p"):
        load_profile(None, ["sampling.top_p=0"])
    with pytest.raises(ProfileError, match=r"drafting\.gamma.*>= 1"):
        load_profile(None, cli={"drafting.gamma": 0})
    for bad in ("0", "-1", "many", "1.5"):
        with pytest.raises(ProfileError, match=r"runtime\.threads.*auto or a positive count"):
            load_profile(None, [f"runtime.threads={bad}"])
    f = write(tmp_path / "t.yaml", "runtime: {threads: 3}\n")
    assert load_profile(str(f)).runtime.threads == 3
    assert load_profile(None, ["runtime.threads=auto"]).runtime.threads == "auto"
    with pytest.raises(ProfileError, match=r"hardware\.threads.*>= 1"):
        load_profile(None, ["hardware.threads=0"])


def test_malformed_yaml_line(tmp_path):
    f = write(tmp_path / "bad.yaml", "name: ok\ndrafting:\n  gamma: [1, 2\n")
    with pytest.raises(ProfileError) as e:
        load_profile(str(f))
    msg = str(e.value)
    assert "bad.yaml" in msg and "line " in msg and "column" in msg


def test_non_mapping_yaml(tmp_path):
    f = write(tmp_path / "list.yaml", "- a\n- b\n")
    with pytest.raises(ProfileError, match=r"list\.yaml.*mapping"):
        load_profile(str(f))


def test_yaml_roundtrip(tmp_path):
    p = load_profile(None, ["drafting.inputs=[text, pooled]", "hardware.latency_ratio=0.25",
                            "target.revision=abc", "sampling.temperature=0.9"])
    f = tmp_path / "dump.yaml"
    f.write_text(profile_to_yaml(p))
    q = load_profile(str(f))
    assert q == p
    assert profile_to_dict(q) == profile_to_dict(p)


def test_list_and_resolve():
    names = {n: (path, desc) for n, path, desc in list_profiles()}
    assert "tinyworld-caption" in names and "llava15-7b" in names
    assert names["tinyworld-caption"][1]
    assert resolve_profile_path("tinyworld-caption.yaml") == names["tinyworld-caption"][0]
    with pytest.raises(ProfileError, match="available:.*tinyworld-caption"):
        resolve_profile_path("no-such-profile")


def test_env_var_priority(tmp_path, monkeypatch):
    d = tmp_path / "mine"
    d.mkdir()
    write(d / "tinyworld-caption.yaml", "name: shadowed\n")
    write(d / "extra.yaml", "name: extra\ndescription: mine\n")
    monkeypatch.setenv("VLMSPEC_PROFILES", str(d))
    assert profile_search_path()[0] == d
    assert load_profile().name == "shadowed"
    assert load_profile("extra").name == "extra"
    listed = {n: path for n, path, _ in list_profiles()}
    assert listed["tinyworld-caption"] == d / "tinyworld-caption.yaml"
    assert "llava15-7b" in listed


@pytest.mark.quick
def test_profiles_keys_lists_every_set_key_with_its_value():
    """`vlmspec profiles --keys [NAME]`: one line per key --set takes (every schema key, in
    schema order), what it takes and its value in that profile; each listed value, given
    back with --set, loads."""
    from click.testing import CliRunner

    from vlmspec_cli.cli import cli
    from vlmspec_cli.profile import profile_keys

    res = CliRunner().invoke(cli, ["profiles", "--keys", "tinyworld-video"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    rows = [line.split("\t") for line in res.stdout.splitlines()]
    assert [r[0] for r in rows] == profile_keys() and all(len(r) == 3 for r in rows)
    table = {key: (what, value) for key, what, value in rows}
    assert table["task"] == ("caption|image|video", "video")
    assert table["drafting.gamma"] == ("int (>= 1, <= 64)", "5")
    assert table["hidden.model"][1] == "zoo:tinyworld/qwen-video-hidden"   # tests/profiles
    sets = [f"{key}={value}" for key, (_, value) in table.items()
            if key.split(".")[0] in ("drafting", "tree", "video", "sampling", "generation")]
    assert load_profile("tinyworld-video", sets).video.frames == 8


def test_model_paths_in_a_file_resolve_against_that_file(tmp_path, monkeypatch):
    """A ``*.model`` path written in a profile (or an included one) is read from that file's
    folder, as ``include:`` is; hub ids, zoo names, none and --set values (the current
    directory's) stay as given; a missing folder is "no such directory" before loading."""
    from vlmspec_cli.runtime.models.loading import ModelLoadError, require_safetensors

    (tmp_path / "base" / "head").mkdir(parents=True)
    (tmp_path / "mine").mkdir()
    write(tmp_path / "base" / "base.yaml", """
        target: {model: ./target}
        draft: {model: org/some-draft}
        hidden: {model: head}
        twig: {model: none}
        """)
    child = write(tmp_path / "mine" / "child.yaml", """
        include: ../base/base.yaml
        captioner: {model: ../models/captioner}
        """)
    monkeypatch.chdir(tmp_path / "mine")
    p = load_profile(str(child))
    assert p.target.model == str(tmp_path / "base" / "target")
    assert p.hidden.model == str(tmp_path / "base" / "head")
    assert p.captioner.model == str(tmp_path / "models" / "captioner")
    assert (p.draft.model, p.twig.model) == ("org/some-draft", "none")
    assert load_profile(str(child), ["target.model=./here"]).target.model == "./here"
    with pytest.raises(ModelLoadError, match=r"^target model '.*/base/target': no such directory$"):
        require_safetensors(p.target.model, "target")


def test_a_drafting_input_letter_in_a_profile_is_explained():
    """--inputs M,T takes letters; a profile or --set takes the names, and says which name
    a letter stands for (it said only "must be one of ... (got 'M')")."""
    with pytest.raises(ProfileError, match=r"got 'T'\): 'T' is the command line's letter for "
                                           r"'text'; write text here"):
        load_profile("tinyworld-caption", overrides=["drafting.inputs=[multimodal,T]"])
    with pytest.raises(ProfileError, match=r"\(got 'X'\)$"):
        load_profile("tinyworld-caption", overrides=["drafting.inputs=[X]"])
