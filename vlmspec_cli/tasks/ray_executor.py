"""``vlmspec caption --executor ray``: the same batch, sharded over a Ray actor pool.

The driver turns the jobs into plain rows (index, path, prompt, known error) and feeds
them to ``ray.data``; each actor of a fixed pool (one per GPU, or ``workers`` CPU actors)
builds ONE session in ``__init__`` and runs :func:`tasks.caption.run_batch` on its rows,
so records are made by exactly the code local runs use. Every record is appended
atomically to the actor's own shard (``<out>.shards/shard-<uuid>.jsonl``) before it goes
back to the driver, which appends it to ``--out``, tells the events and ``emit`` (in input
order), and removes the shards once everything is merged.

Resume: a killed run leaves its shards behind. The next run first merges them into
``--out`` (a torn last record is skipped -- its input is decoded again --, records
already there are not repeated), then skips every input with a successful record,
exactly like a local rerun. ``--out`` is locked for the whole run, so its shard folder
is this run's alone; a shard that is not a vlmspec JSONL, or a file where the folder
should be, stops the run (OutputError) before any worker starts, untouched.

An input that fails inside a worker becomes an error record as in local runs; a row lost
with a crashed worker process (tried twice) becomes an error record too, and the rest
completes. Ray is imported lazily: local runs never need it. No click or rich here.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import shutil
import signal
import tempfile
import uuid
import warnings
from contextlib import contextmanager
from dataclasses import fields, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

from vlmspec_cli.tasks import ray_reaper
from vlmspec_cli.tasks.caption import Job, base_record, job_key, jobs_to_do
from vlmspec_cli.tasks.jobs import BatchSummary, JobEvents, Tally
from vlmspec_cli.tasks.records import record_key
from vlmspec_cli.tasks.sink import JsonlSink, OutputError, read_records

__all__ = ["RayExecutorError", "INSTALL_HINT", "run_ray", "merge_shards", "shard_dir_for"]

INSTALL_HINT = "pip install 'vlmspec[ray]'"
SHARD_GLOB = "shard-*.jsonl"
# rows per Ray block at most; one row per block isolates a crashing input
_MAX_BLOCKS = 4096


class RayExecutorError(Exception):
    """Ray is missing, or the workers could not start (the message says why)."""


def _import_ray():
    try:
        import ray
        import ray.data  # noqa: F401  (the [data] extra: pyarrow, pandas)
    except ImportError as exc:
        raise RayExecutorError(f"--executor ray needs Ray Data ({exc}); install it with: "
                               f"{INSTALL_HINT}") from None
    return ray


def shard_dir_for(out_path: str | os.PathLike) -> Path:
    return Path(f"{os.fspath(out_path)}.shards")


def _canonical(record: dict) -> str:
    return json.dumps(record, sort_keys=True, ensure_ascii=False)


def _check_shard_dir(shard_dir: Path) -> None:
    if shard_dir.exists() and not shard_dir.is_dir():
        raise OutputError(f"{shard_dir}: the Ray shard folder of --out is a file; move it "
                          "away or choose another --out")


def merge_shards(shard_dir: str | os.PathLike, sink: JsonlSink) -> int:
    """Append the records of shards left by an earlier (killed) run to ``sink`` and remove
    the shards. A record already in ``sink`` (or a second success for an input that has
    one) is not repeated. Returns the number of records appended."""
    shard_dir = Path(shard_dir)
    shards = sorted(shard_dir.glob(SHARD_GLOB)) if shard_dir.is_dir() else []
    if not shards:
        return 0
    done = sink.done_keys()
    seen = {_canonical(r) for r in sink.records()}
    merged = 0
    for shard in shards:
        for rec in read_records(shard):  # a torn last record (worker killed) is skipped
            text = _canonical(rec)
            key = record_key(rec)
            if text in seen or (rec.get("error") is None and key is not None and key in done):
                continue
            sink.append(rec)
            seen.add(text)
            if rec.get("error") is None and key is not None:
                done.add(key)
            merged += 1
        shard.unlink()  # only after its records are in sink, fsynced
    _rmdir_quiet(shard_dir)
    return merged


def _rmdir_quiet(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        pass


class _Silent:
    """JobEvents that hear nothing (inside a worker)."""

    def batch_started(self, total, skipped): pass
    def item_started(self, item): pass
    def item_skipped(self, item): pass
    def tokens(self, item, generated, limit): pass
    def item_done(self, record): pass
    def item_failed(self, item, reason, record): pass


def _worker_class(profile, shard_dir: str, cwd: str):
    """The actor class (a closure: no constructor arguments in Ray's object store)."""

    class CaptionWorker:
        def __init__(self):
            from vlmspec_cli.session import build_session

            if os.path.isdir(cwd):
                os.chdir(cwd)  # relative inputs and model paths mean what they meant
            self.fatal = None
            try:
                self.session = build_session(profile)
            except Exception as exc:  # reported once by the driver, exit 2 there
                self.fatal = str(exc) or type(exc).__name__
                return
            Path(shard_dir).mkdir(parents=True, exist_ok=True)
            self.shard = JsonlSink(Path(shard_dir) / f"shard-{uuid.uuid4().hex}.jsonl")

        def __call__(self, batch):
            from vlmspec_cli.tasks.caption import image_jobs, run_batch
            from vlmspec_cli.tasks.inputs import InputItem

            index = [int(i) for i in batch["i"]]
            if self.fatal is not None:
                return {"i": index, "record": [json.dumps({"__fatal__": self.fatal})] * len(index)}
            jobs = [replace(image_jobs([InputItem(str(p), (str(e) if e else None))], str(q))[0],
                            source=str(s))
                    for p, q, e, s in zip(batch["path"], batch["prompt"], batch["error"],
                                          batch["source"])]
            out: list[dict] = []

            def keep(record: dict) -> None:
                self.shard.append(record)  # durable before the driver hears of it
                out.append(record)

            run_batch(self.session, jobs, _Silent(), sink=None, emit=keep)
            # records come out as jobs finish (batched decoding reorders): match by key
            slots: dict[tuple, list[int]] = {}
            for i, job in zip(index, jobs):
                slots.setdefault(job_key(profile, job), []).append(i)
            return {"i": [slots[record_key(r)].pop(0) for r in out],
                    "record": [json.dumps(r, ensure_ascii=False) for r in out]}

    return CaptionWorker


def _runtime_env() -> dict | None:
    """Workers import vlmspec_cli. When it is not installed (a source checkout), put the
    checkout in front of each worker's own PYTHONPATH (a folder that a remote node lacks
    is skipped by Python); an installed vlmspec needs nothing."""
    try:
        importlib.metadata.distribution("vlmspec")
        return None
    except importlib.metadata.PackageNotFoundError:
        root = str(Path(__file__).resolve().parents[2])
        return {"env_vars": {"PYTHONPATH": f"{root}{os.pathsep}${{PYTHONPATH}}"}}


def run_ray(profile, items: list[Job], events: JobEvents, sink: JsonlSink | None = None,
            emit: Callable[[dict], None] | None = None, workers: int = 2,
            address: str | None = None, shard_dir: str | os.PathLike | None = None,
            ) -> BatchSummary:
    """Caption ``items`` (image jobs from :func:`tasks.caption.image_jobs`) on a Ray actor
    pool; same records, resume keys, events and summary as :func:`run_batch`.

    ``address``: an existing cluster (``auto``, ``ray://host:10001``...); without it a
    local Ray with ``workers`` CPUs is started and shut down at the end. A Ray the caller
    already initialised is used as is and left running. Shards go to ``shard_dir``
    (default ``<out>.shards``, or a temporary folder without ``sink``); on a cluster it
    should be a folder every node can reach for resume to recover in-flight records.
    Raises RayExecutorError when Ray is missing or the workers cannot build a session.
    """
    ray = _import_ray()
    if workers < 1:
        raise ValueError("workers must be >= 1")
    summary = BatchSummary(items=len(items))
    temp_dir = None
    if shard_dir is None:
        if sink is not None:
            shard_dir = shard_dir_for(sink.path)
        else:
            shard_dir = temp_dir = tempfile.mkdtemp(prefix="vlmspec-shards-")
    shard_dir = Path(shard_dir).resolve()
    _check_shard_dir(shard_dir)
    todo = _not_done(profile, items, sink, shard_dir, summary)
    events.batch_started(len(todo), summary.skipped)
    if not todo:
        _cleanup(temp_dir, shard_dir)
        return summary

    started, reaper = _init_ray(ray, address, workers)
    deliver = _Delivery(todo, summary, events, sink, emit)
    try:
        with _data_context():
            for row in _dataset(ray, profile, todo, workers, str(shard_dir)).iter_rows():
                record = json.loads(row["record"])
                if "__fatal__" in record:
                    raise RayExecutorError(f"a Ray worker could not load the models: "
                                           f"{record['__fatal__']}")
                deliver(int(row["i"]), record)
        deliver.recover_shards(profile, shard_dir)
        deliver.fail_lost(profile)
        _cleanup(temp_dir, shard_dir)
    finally:
        if started:
            ray.shutdown()
        if reaper is not None:   # end of file: it stops whatever of the session is left
            reaper.stdin.close()
    return summary


def _not_done(profile, items: list[Job], sink: JsonlSink | None, shard_dir: Path,
              summary: BatchSummary) -> list[Job]:
    """The jobs without a successful record in ``sink`` (after merging the shards an
    earlier run left into it); counts the others as skipped."""
    done: set = set()
    if sink is not None:
        merge_shards(shard_dir, sink)
        done = sink.done_keys()
    todo, summary.skipped = jobs_to_do(profile, items, done)
    return todo


def _init_ray(ray, address: str | None, workers: int):
    """Connect to ``address`` or start a local Ray with ``workers`` CPUs, unless the caller
    already did. Returns (whether this call started it, and so must shut it down; the
    reaper of a local Ray it started, ray_reaper.py, or None).

    ``ray.init`` installs its own SIGTERM handler (``sys.exit(15)``, and the core worker's
    native stack dump); the process's handlers are put back, so SIGTERM stops a Ray run as
    any run: one line, exit 143."""
    started, reaper = False, None
    if not ray.is_initialized():
        kwargs = dict(include_dashboard=False, log_to_driver=False,
                      logging_level=logging.WARNING)
        handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            if address:
                ray.init(address=address, **kwargs)
            else:   # a local Ray of this run's own: its token notice ("Token authentication
                # is enabled ... RAY_AUTH_MODE=disabled to opt out") is no concern of the user's
                logging.getLogger("ray._private.authentication.authentication_token_setup"
                                  ).setLevel(logging.ERROR)
                ray.init(num_cpus=workers, **kwargs)
                reaper = ray_reaper.start(_session_dir(ray))
        finally:
            for sig, handler in handlers.items():
                if handler is not None:
                    signal.signal(sig, handler)
        started = True
    logging.getLogger("ray.data").setLevel(logging.ERROR)  # no "progress bars disabled"
    return started, reaper


def _session_dir(ray) -> str | None:
    """The folder of the local Ray session this process started (Ray keeps it on its
    node object; None if this Ray version does not say)."""
    try:
        return ray._private.worker._global_node.get_session_dir_path()
    except AttributeError:
        return None


class _Delivery:
    """``deliver(i, record)``: the record of ``todo[i]`` goes to the summary, the sink, the
    events and ``emit`` (tasks/jobs.py Tally, as in local runs), once per job."""

    def __init__(self, todo: list[Job], summary: BatchSummary, events: JobEvents,
                 sink: JsonlSink | None, emit: Callable[[dict], None] | None):
        self.todo, self.events = todo, events
        self.tally = Tally(summary, events, sink, emit)
        self.received: dict[int, dict] = {}
        self.lossless: list[bool] = []

    def __call__(self, i: int, record: dict) -> None:
        job = self.todo[i]
        self.received[i] = record
        self.lossless.append(record.get("lossless", True))
        self.events.item_started(job)
        if record.get("error") is None:
            self.tally.finished(record)
        else:
            self.tally.failed(job, record)

    def recover_shards(self, profile, shard_dir: Path) -> None:
        """Rows a crashed worker wrote to its shard but never returned (the shards left by
        earlier runs were merged and removed before: these are all this run's)."""
        index = {job_key(profile, job): i for i, job in enumerate(self.todo)}
        for shard in sorted(shard_dir.glob(SHARD_GLOB)):
            for rec in read_records(shard):  # live workers still hold their shards
                i = index.get(record_key(rec))
                if i is not None and i not in self.received:
                    self(i, rec)

    def fail_lost(self, profile) -> None:
        """A failure record for every job lost with a worker that died on it, twice."""
        lossless = self.lossless
        from vlmspec_cli.drafters import method_class

        session_like = SimpleNamespace(profile=profile, method=method_class(profile.method),
                                       lossless=all(lossless) if lossless else profile.lossless)
        for i, job in enumerate(self.todo):
            if i not in self.received:
                record = base_record(session_like, job, job.prompt)
                record["error"] = "failed: the Ray worker running it died (see the Ray logs)"
                self(i, record)


def _dataset(ray, profile, todo: list[Job], workers: int, shard_dir: str):
    from ray.data import ActorPoolStrategy

    rows = [{"i": i, "path": job.path, "prompt": job.prompt, "error": job.error or "",
             "source": job.source if job.source is not None else os.path.realpath(job.path)}
            for i, job in enumerate(todo)]
    gpus = int(ray.cluster_resources().get("GPU", 0))
    use_gpu = gpus > 0 and not str(profile.target.device).startswith(("cpu", "mps"))
    if use_gpu:
        size, resources = min(workers, gpus), {"num_gpus": 1, "num_cpus": 1}
    else:
        cpus = int(ray.cluster_resources().get("CPU", workers))
        size, resources = max(1, min(workers, cpus)), {"num_cpus": 1}
    size = min(size, len(rows))
    if use_gpu:  # Ray shows each actor its one GPU as cuda:0
        profile = replace(profile, **{
            f.name: replace(getattr(profile, f.name), device="cuda")
            for f in fields(profile) if str(getattr(getattr(profile, f.name), "device", "")
                                            ).startswith("cuda:")})

    # run_batch gets as many rows as it decodes together (generation.batch_size, if any)
    rows_per_call = profile.generation.rows   # (auto: one; the workers do not measure)
    dataset = ray.data.from_items(rows, override_num_blocks=min(len(rows), _MAX_BLOCKS))
    return dataset.map_batches(
        _worker_class(profile, shard_dir, os.getcwd()), batch_size=rows_per_call,
        batch_format="numpy", compute=ActorPoolStrategy(size=size, max_tasks_in_flight_per_actor=1),
        runtime_env=_runtime_env(), max_restarts=-1, max_task_retries=1, **resources)


@contextmanager
def _data_context():
    """Ray Data settings for this run, the caller's restored afterwards; Ray's own
    deprecation notes and under-used-pool hints are not the user's business."""
    from ray.data import DataContext

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"ray\.")
        warnings.filterwarnings("ignore", message=".*(ray_remote_args|concurrency|concurrent actors)")
        ctx = DataContext.get_current()
        saved = (ctx.execution_options.preserve_order, ctx.enable_progress_bars,
                 ctx.max_errored_blocks)
        ctx.execution_options.preserve_order = True  # records come back in input order
        ctx.enable_progress_bars = False
        ctx.max_errored_blocks = -1  # a row lost with a crashed worker fails alone
        try:
            yield
        finally:
            (ctx.execution_options.preserve_order, ctx.enable_progress_bars,
             ctx.max_errored_blocks) = saved


def _cleanup(temp_dir, shard_dir: Path) -> None:
    if temp_dir is not None:
        shutil.rmtree(temp_dir, ignore_errors=True)
        return
    for shard in shard_dir.glob(SHARD_GLOB):
        shard.unlink()  # every record in them is in --out now
    _rmdir_quiet(shard_dir)
