"""``vlmspec caption --executor ray`` on a local 2-CPU Ray cluster started here: the same
records as the local executor, a bad input fails alone, and a killed run resumes."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest
import ray
from click.testing import CliRunner

from vlmspec_cli.cli import cli
from vlmspec_cli.tasks.records import record_key

ROOT = Path(__file__).resolve().parent.parent
IMAGES = sorted(str(p) for p in (ROOT / "examples" / "images").glob("*.png"))
# a fixed γ: records are compared field by field, and an auto length's rounds follow timings
FAST = ["--max-new-tokens", "12", "-q", "--set", "drafting.length=fixed"]
TIMING = {"wall_s", "tokens_per_s", "prefill_s", "caption_s", "decode_s", "prefill_share"}


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             logging_level=logging.WARNING)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def broken(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("bad") / "notes.png"
    path.write_text("this is a text file, not a png\n")
    return str(path)


def run(args):
    return CliRunner().invoke(cli, ["caption", *args], catch_exceptions=False)


def stdout_records(result) -> list[dict]:
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def file_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def untimed(record: dict) -> dict:
    record = json.loads(json.dumps(record))
    for key in TIMING:
        record.get("stats", {}).pop(key, None)
    return record


@pytest.fixture(scope="module")
def local_records(broken) -> dict[str, dict]:
    """Every input decoded by the local executor, by input path."""
    res = run([*IMAGES, broken, "--json", *FAST])
    assert res.exit_code == 1, res.output
    recs = stdout_records(res)
    assert len(recs) == len(IMAGES) + 1
    return {r["input"]: r for r in recs}


def test_ray_records_equal_local_and_a_bad_input_fails_alone(ray_cluster, local_records, broken,
                                                            tmp_path):
    out = tmp_path / "caps.jsonl"
    inputs = [IMAGES[0], broken, *IMAGES[1:]]
    res = run([*inputs, "--json", "--out", str(out), "--executor", "ray", "--workers", "2", *FAST])
    assert res.exit_code == 1, res.output  # one input failed, the rest were done
    assert f"{broken}: not an image" in res.output  # reported on stderr, naming the file

    emitted = stdout_records(res)
    assert [r["input"] for r in emitted] == inputs  # in input order, each once
    assert file_records(out) == emitted  # --out holds exactly what was emitted
    for rec in emitted:
        assert untimed(rec) == untimed(local_records[rec["input"]])
    bad = next(r for r in emitted if r["input"] == broken)
    assert bad["error"] and bad["output"] is None
    assert all(r["error"] is None and r["output"] for r in emitted if r["input"] != broken)
    assert not Path(f"{out}.shards").exists()  # merged shards are removed
    assert ray.is_initialized()  # the caller's Ray is left running


def test_killed_run_resumes_from_out_and_shards(ray_cluster, local_records, tmp_path):
    a, b, c, d = IMAGES[:4]
    out = tmp_path / "caps.jsonl"
    shards = Path(f"{out}.shards")
    shards.mkdir()
    # the killed run: a was merged into --out; a (again) and b were in one worker's shard,
    # which it was appending c to when the run died
    out.write_text(json.dumps(local_records[a]) + "\n")
    torn = json.dumps(local_records[c])[:57]
    (shards / "shard-dead0001.jsonl").write_text(
        json.dumps(local_records[a]) + "\n" + json.dumps(local_records[b]) + "\n" + torn)

    res = run([a, b, c, d, "--json", "--out", str(out), "--executor", "ray", *FAST])
    assert res.exit_code == 0, res.output
    assert sorted(r["input"] for r in stdout_records(res)) == [c, d]  # only the rest decoded
    recs = file_records(out)
    assert sorted(r["input"] for r in recs) == [a, b, c, d]  # each input exactly once
    assert recs[1] == local_records[b]  # b merged from the shard as it was written
    for rec in recs:
        assert untimed(rec) == untimed(local_records[rec["input"]])
    assert not shards.exists()


def test_run_ray_function_without_out(ray_cluster, local_records):
    from vlmspec_cli.profile import load_profile
    from vlmspec_cli.tasks.caption import image_jobs
    from vlmspec_cli.tasks.inputs import expand_inputs
    from vlmspec_cli.tasks.ray_executor import run_ray

    class Events:
        def __init__(self):
            self.calls = []

        def __getattr__(self, name):
            return lambda *args: self.calls.append((name, args))

    prof = load_profile(None, ["drafting.length=fixed"], cli={"generation.max_new_tokens": 12})
    jobs = image_jobs(expand_inputs(IMAGES[4:]), prof.generation.prompt)  # two images
    events, emitted = Events(), []
    summary = run_ray(prof, jobs, events, emit=emitted.append, workers=1)
    assert (summary.items, summary.done, summary.failures, summary.skipped) == (2, 2, 0, 0)
    assert summary.stats.new_tokens == sum(r["stats"]["new_tokens"] for r in emitted)
    assert [untimed(r) for r in emitted] == [untimed(local_records[p]) for p in IMAGES[4:]]
    assert [name for name, _ in events.calls].count("item_done") == 2
    assert events.calls[0] == ("batch_started", (2, 0))


def test_missing_ray_says_how_to_install(monkeypatch, tmp_path):
    from vlmspec_cli.tasks.ray_executor import RayExecutorError, run_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(RayExecutorError, match=r"pip install 'vlmspec\[ray\]'"):
        run_ray(None, [], None)
    res = run([IMAGES[0], "--executor", "ray", *FAST])
    assert res.exit_code == 2 and "pip install 'vlmspec[ray]'" in res.output


def test_ray_usage_errors_and_recipe_key(tmp_path):
    res = run([IMAGES[0], "--executor", "ray", "--compare", *FAST])
    assert res.exit_code == 2 and "--executor ray" in res.output
    from vlmspec_cli.cli.recipes import load_recipe

    recipe = tmp_path / "r.yaml"
    recipe.write_text("steps:\n  - caption: {inputs: [a.png], out: o.jsonl, executor: ray, "
                      "workers: 2, ray_address: auto}\n")
    (step,) = load_recipe(recipe, cli.commands).steps
    assert step.argv[-6:] == ["--executor", "ray", "--workers", "2", "--ray-address", "auto"]


def test_foreign_shard_or_shard_file_refused_untouched(tmp_path):
    out = tmp_path / "caps.jsonl"
    shards = Path(f"{out}.shards")
    shards.write_text("my notes, not a folder\n")
    res = run([IMAGES[0], "--out", str(out), "--executor", "ray", *FAST])
    assert res.exit_code == 2 and "the Ray shard folder of --out is a file" in res.stderr
    assert shards.read_text() == "my notes, not a folder\n"
    shards.unlink()
    shards.mkdir()
    foreign = shards / "shard-mine.jsonl"
    foreign.write_text('{"id": 1}\n{"id": 2}\n')
    res = run([IMAGES[0], "--out", str(out), "--executor", "ray", *FAST])
    assert res.exit_code == 2
    assert f"{foreign}: not a vlmspec results JSONL file" in res.stderr
    assert foreign.read_text() == '{"id": 1}\n{"id": 2}\n' and out.read_bytes() == b""


def _reaper_of(driver: int, timeout: float = 120.0) -> str:
    """The session folder the reaper of ``driver``'s local Ray watches, once it runs."""
    import os
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for name in filter(str.isdigit, os.listdir("/proc")):
            try:
                argv = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"vlmspec_cli.tasks.ray_reaper" in argv and argv[-2:-1] == [str(driver).encode()]:
                return argv[-3].decode()
        time.sleep(0.2)
    raise AssertionError("no Ray reaper started")


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="the reaper reads /proc (Linux)")
def test_a_killed_or_terminated_ray_run_leaves_no_process_and_says_one_line(tmp_path):
    """SIGKILL of the driver left Ray's DashboardAgent and RuntimeEnvAgent running with
    parent 1; SIGTERM ended in exit 15 and the core worker's native stack dump. Now the
    reaper stops every process of the session, and SIGTERM is one line and 143."""
    import os
    import re
    import signal
    import subprocess
    import time

    from vlmspec_cli.tasks.ray_reaper import members

    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(24):
        (folder / f"s{i}.png").write_bytes(Path(IMAGES[i % len(IMAGES)]).read_bytes())
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for sig in (signal.SIGKILL, signal.SIGTERM):
        proc = subprocess.Popen([sys.executable, "-m", "vlmspec_cli", "caption", str(folder),
                                 "--executor", "ray", "--workers", "1", "--max-new-tokens", "48",
                                 "-q"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, env=env)
        session = _reaper_of(proc.pid)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
        if sig == signal.SIGTERM:
            assert proc.returncode == 143, err
            (line,) = [l for l in err.splitlines() if l.strip()]
            assert re.fullmatch(r"error: terminated: \d+ input\(s\) finished", line), err
        end = time.monotonic() + 60
        while members(session, {os.getpid()}) and time.monotonic() < end:
            time.sleep(0.5)
        assert members(session, {os.getpid()}) == [], f"{sig!r} left processes of {session}"
