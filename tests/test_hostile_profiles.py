"""Hostile and careless profiles (issues 35 and 40): a profile or an included file that is
not UTF-8, nested 100k deep, an alias bomb, too big, a FIFO or a device, a profile folder
holding such a file, and sizes no run can use. Each is one line on stderr naming the file
or key and the reason, exit 2, no traceback, no hang, bounded memory, no file changed.

The cases that could hang or exhaust memory on a regression run in a subprocess with a
timeout and an address-space limit (``vlmspec profiles`` imports no torch: ~25 MB)."""

from __future__ import annotations

import hashlib
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import corpus
from vlmspec_cli.cli import cli
from vlmspec_cli.profile import ProfileError, load_profile

ROOT = Path(__file__).resolve().parent.parent
MEMORY_LIMIT = 1024 ** 3   # address space of a `vlmspec profiles` subprocess


def run(args):
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def vlmspec(*args, env=None, timeout=60) -> subprocess.CompletedProcess:
    env = dict(os.environ if env is None else env, COLUMNS="400",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "vlmspec_cli", *args], capture_output=True,
                          text=True, env=env, timeout=timeout, preexec_fn=_limit_memory)


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr and len(lines) == 1, stderr[-3000:]
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


def md5s(root: Path) -> dict[str, str]:
    return {str(p): hashlib.md5(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink()}


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    return corpus.make_bad_profiles(tmp_path_factory.mktemp("bad-profiles"))


def test_bad_profile_files_are_one_line_errors(bad):
    root = next(iter(bad.values()))[0].parent
    before = md5s(root)
    for case, (path, named, why) in bad.items():
        proc = vlmspec("profiles", str(path))
        line = one_error_line(proc.stderr)
        assert proc.returncode == 2 and f"{named}: " in line and why in line, (case, line)
        assert "secret" not in line, line        # a file that is no profile is not echoed
    assert md5s(root) == before


def test_bad_profile_given_to_a_command_with_p(bad):
    """The same refusals through -p (in process; the bomb is the subprocess test's)."""
    for case, (path, named, why) in bad.items():
        if case == "billion-laughs.yaml":
            continue
        res = run(["caption", "x.png", "-p", str(path), "--dry-run"])
        line = one_error_line(res.stderr)
        assert res.exit_code == 2 and f"{named}: " in line and why in line, (case, line)


def test_a_bad_file_in_the_profile_folder_is_listed_not_fatal(bad, tmp_path):
    folder = tmp_path / "profiles"
    folder.mkdir()
    for case, (path, _, _) in bad.items():
        if case != "includer.yaml":
            (folder / Path(case).with_suffix(".yaml").name).write_bytes(path.read_bytes())
    (folder / "good.yaml").write_text("name: good\ndescription: a good one\n")
    os.mkfifo(folder / "fifo.yaml")
    os.symlink("/dev/zero", folder / "zero.yaml")
    before = md5s(folder)
    env = dict(os.environ, VLMSPEC_PROFILES=str(folder))

    proc = vlmspec("profiles", env=env)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    listed = proc.stdout.split()
    assert {"good", "fifo", "zero", "latin1", "billion-laughs", "deep-flow-lists"} <= set(listed)
    rows = {line.split("│")[1].strip(): line for line in proc.stderr.splitlines()
            if line.count("│") >= 3}
    assert "a good one" in rows["good"]
    for name, why in (("fifo", "is a FIFO"), ("zero", "is a character device"),
                      ("latin1", "not UTF-8 text"), ("billion-laughs", "aliases expand"),
                      ("deep-flow-maps", "nested more than 64"), ("huge", "over the 1.0 MiB")):
        assert "unreadable: " in rows[name] and why in rows[name], rows[name]

    # the did-you-mean hint reads no profile; a name that is a FIFO is refused, not read
    for args, message in ((["profiles", "goood"], "unknown profile 'goood' (did you mean 'good'?)"),
                          (["profiles", "fifo"], f"{folder / 'fifo.yaml'}: is a FIFO"),
                          (["profiles", "zero"], f"{folder / 'zero.yaml'}: is a character device")):
        proc = vlmspec(*args, env=env)
        assert proc.returncode == 2 and message in one_error_line(proc.stderr), proc.stderr
    assert md5s(folder) == before


def test_profile_search_path_naming_a_device_or_a_fifo(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    for target in ("/dev/zero", str(tmp_path / "fifo")):
        env = dict(os.environ, VLMSPEC_PROFILES=target)
        proc = vlmspec("profiles", env=env)
        assert proc.returncode == 0 and "tinyworld-caption" in proc.stdout.split(), proc.stderr
        proc = vlmspec("profiles", "nosuch", env=env)
        assert proc.returncode == 2 and "unknown profile 'nosuch'" in one_error_line(proc.stderr)


def test_deep_or_exploding_set_values():
    deep = "[" * corpus.DEEP + "]" * corpus.DEEP
    with pytest.raises(ProfileError, match="cannot parse value: nested more than 64 levels"):
        load_profile(None, ["drafting.inputs=" + deep])
    # a text key takes what YAML cannot parse as the text itself
    assert load_profile(None, ["generation.prompt=" + deep]).generation.prompt == deep
    # the anchors inside one flow list: [&l0 [lol, ...], &l1 [*l0, ...], ...]
    bomb = "[" + ", ".join(line.split(": ", 1)[1] for line in
                           corpus.billion_laughs().splitlines()[:-1]) + "]"
    proc = vlmspec("profiles", "--set", "drafting.inputs=" + bomb)
    line = one_error_line(proc.stderr)
    assert proc.returncode == 2 and "--set drafting.inputs=" in line and "aliases expand" in line


@pytest.mark.parametrize("setting, bound", [
    ("runtime.threads=100000", "<= 1024"),
    ("runtime.prefill_threads=5000", "<= 1024"),
    ("hardware.threads=100000", "<= 1024"),
    ("hardware.prefill_threads=2000", "<= 1024"),
    ("drafting.gamma=100000", "<= 64"),
    ("tree.total_tokens=10000000", "<= 512"),
    ("tree.depth=100000", "<= 64"),
    ("tree.top_k=100000", "<= 64"),
    ("adaptive_tree.max_depth=100000", "<= 64"),
    ("adaptive_tree.max_top_k=100000", "<= 64"),
])
def test_sizes_past_their_bound_are_profile_errors(setting, bound):
    key = setting.split("=")[0]
    res = run(["profiles", "--set", setting])
    line = one_error_line(res.stderr)
    assert res.exit_code == 2 and f"key '{key}' must be >= 1 and {bound}" in line, line


def test_a_thread_count_as_text_is_bounded_too(tmp_path):
    path = tmp_path / "threads.yaml"
    path.write_text('runtime:\n  threads: "100000"\n')
    res = run(["profiles", str(path)])
    line = one_error_line(res.stderr)
    assert res.exit_code == 2 and "key 'runtime.threads' must be >= 1 and <= 1024" in line
    assert load_profile(None, ["runtime.threads=1024"]).runtime.threads == 1024   # (YAML's int: int or text keys keep it)
    assert load_profile(None, ["drafting.gamma=64", "tree.total_tokens=512"]).drafting.gamma == 64


def test_an_unknown_method_is_named_where_it_was_set(tmp_path):
    """A method name the registry lacks is one error line that says which option, --set or
    profile file gave it, as the other profile errors do."""
    yaml_file = tmp_path / "p.yaml"
    yaml_file.write_text("include: tinyworld-caption\nmethod: chian\n")
    image = str(ROOT / "examples" / "images" / "scene1.png")
    hint = "unknown method 'chian' (did you mean 'chain'?)"
    for args, where in ((["--set", "method=chian"], "--set method=chian: "),
                        (["-m", "chian"], "--method chian: "),
                        (["-p", str(yaml_file)], f"{yaml_file}: key 'method': "),
                        (["-p", str(yaml_file), "--set", "method=tre"], "--set method=tre: ")):
        res = run(["caption", image, "--dry-run", *args])
        line = one_error_line(res.stderr)
        assert res.exit_code == 2 and line.startswith("error: " + where), line
        assert hint in line or "unknown method 'tre'" in line, line


def test_option_errors_name_the_option_typed():
    """A bad option value is named by its option (they said "command line option
    'drafting.inputs'" for --inputs, "'target.device'" for --device, and a count past the
    64-bit range named the profile key with a negative lower bound)."""
    image = str(ROOT / "examples" / "images" / "scene1.png")
    for args, start in ((["--inputs", "X"], "error: --inputs X: key 'drafting.inputs' must be one of"),
                        (["--device", "gpu"], "error: --device gpu: key 'target.device' must be one of")):
        res = run(["caption", image, "--dry-run", *args])
        assert res.exit_code == 2 and one_error_line(res.stderr).startswith(start), res.stderr
    res = run(["caption", image, "--dry-run", "--max-new-tokens", str(10 ** 20)])
    assert res.exit_code == 2 and "'--max-new-tokens': 100000000000000000000 is too large" in res.output
