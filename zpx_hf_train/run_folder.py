"""The run folder, one mechanism per kind: atomic files, one lock, one identity, complete checkpoints.

- `atomic_write` (and `publish_folder` for a whole saved model): the file is written beside its target,
  fsynced and moved over it with `os.replace`, so a reader or a kill sees the old file or the new one,
  never half of one.
- `FolderLock`: `fcntl.flock` on `_zpx.lock` inside the folder, held for the whole job; a second job on
  the same folder stops at once (the lock goes with the process, so a killed job never leaves it behind).
- The marker `zpx_run.json` records the run's identity (`RunConfig.fingerprint`, job, family, config
  file) and whether the run finished. `check_identity` refuses a folder or a checkpoint of another run.
- `checkpoint_problem` says why a checkpoint folder is incomplete (a truncated `trainer_state.json` or
  weights file, a missing one); `resolve_resume` picks the newest complete checkpoint and names the rest.
- `RunFolder` ties them together for one output folder: lock, guard, overwrite (the old run is moved aside
  and restored if the new run fails, removed once it succeeds), marker, and `finish()` at the end.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .config import ConfigError

RUN_MARKER = "zpx_run.json"
TRAINER_STATE = "trainer_state.json"
LOCK_FILE = "_zpx.lock"  # "_*": never uploaded by `Trainer.push_to_hub`
ASIDE = ".zpx-replaced"  # the run an overwrite replaces, until the new run has finished
STAGING = ".zpx-staging"  # a final model being saved, before its files are moved into place
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
_OPTIMIZER_STATE = ("optimizer", "scheduler.pt", "global_step")  # Trainer's names (DeepSpeed: global_step*/)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some platforms cannot open a directory; the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, data: str | bytes) -> None:
    """Write `data` to `path` through a temporary file in the same folder, fsync, then `os.replace`."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    _fsync_dir(target.parent)


def atomic_write_json(path: str | os.PathLike, value: Any) -> None:
    atomic_write(path, json.dumps(value, indent=2) + "\n")


def publish_folder(staging: Path, target: Path) -> None:
    """Move every file saved under `staging` into `target` (each with an atomic `os.replace`), then drop `staging`."""
    for source in sorted(p for p in staging.rglob("*") if p.is_file()):
        with open(source, "rb") as f:
            os.fsync(f.fileno())
        destination = target / source.relative_to(staging)
        destination.parent.mkdir(parents=True, exist_ok=True)
        os.replace(source, destination)
    shutil.rmtree(staging)
    _fsync_dir(target)


class FolderLock:
    """An exclusive `flock` on `folder/_zpx.lock` for the life of a job; `ConfigError` if another job holds it."""

    def __init__(self, folder: str | os.PathLike, key: str = "training.output_dir") -> None:
        self.folder, self.key = Path(folder), key
        self._file: Any = None
        self.created = False

    def acquire(self) -> FolderLock:
        import fcntl

        self.created = not self.folder.exists()
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            handle = open(self.folder / LOCK_FILE, "a+", encoding="utf-8")
        except OSError as error:  # a file in the way, a read-only folder, no permission
            raise ConfigError(
                f"key `{self.key}`: cannot write to {self.folder} ({error.strerror or error}); choose a folder you "
                "can write."
            ) from None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise ConfigError(
                f"key `{self.key}`: {self.folder} is in use by another job (pid {holder}); wait for it to finish "
                "or choose another folder."
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._file = handle
        return self

    def release(self) -> None:
        """Unlock; a folder this lock created and the job left empty is removed (while still locked, so a job
        that opens the lock file meanwhile finds it held, and one that comes later makes a new one)."""
        if self._file is None:
            return
        if self.created and [p.name for p in self.folder.iterdir()] == [LOCK_FILE]:
            (self.folder / LOCK_FILE).unlink(missing_ok=True)
            try:
                self.folder.rmdir()
            except OSError:
                pass
        self._file.close()  # closing the file releases the flock
        self._file = None


@dataclass(frozen=True)
class RunIdentity:
    """What a run marker records about the run that wrote a folder."""

    fingerprint: str
    job: str
    model_type: str | None
    config: str

    def describe(self) -> str:
        family = f"{self.model_type}, " if self.model_type else ""
        return f"{self.job} run ({family}config {self.config}, fingerprint {self.fingerprint})"


def read_marker(folder: str | os.PathLike) -> dict[str, Any] | None:
    """The marker of `folder` as a dict, or None; a marker that is not JSON is refused naming it."""
    path = Path(folder) / RUN_MARKER
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path} is not a readable run marker ({error}); delete it or choose another folder.") from (
            error
        )
    return value if isinstance(value, dict) else None


def identity_of(marker: dict[str, Any] | None) -> RunIdentity | None:
    if marker is None:
        return None
    return RunIdentity(
        fingerprint=str(marker.get("fingerprint")),
        job=str(marker.get("job", "zpx-train")),
        model_type=marker.get("model_type"),
        config=str(marker.get("config", "unknown")),
    )


def check_identity(ours: RunIdentity, folder: str | os.PathLike, key: str, what: str) -> None:
    """Refuse `folder` (a checkpoint, or its run folder) unless its marker records this run's fingerprint."""
    place = Path(folder)
    marker = read_marker(place)
    if marker is None and _CHECKPOINT.match(place.name):
        marker = read_marker(place.parent)  # a checkpoint written before its own marker: its run folder's
    theirs = identity_of(marker)
    if theirs is None:
        raise ConfigError(
            f"key `{key}`: {what} {place} has no run marker ({RUN_MARKER}), so it cannot be shown to belong to this "
            f"{ours.describe()}; use a checkpoint written by this run."
        )
    if theirs.fingerprint != ours.fingerprint:
        raise ConfigError(
            f"key `{key}`: {what} {place} belongs to another {theirs.describe()}, not this {ours.describe()}; "
            "use a checkpoint of this run, or start over without it."
        )


def _safetensors_problem(path: Path) -> str | None:
    """Why a `.safetensors` file is not whole: its JSON header must parse and end where the file ends."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"truncated {path.name}"
        (length,) = struct.unpack("<Q", head)
        if length > size - 8:
            return f"truncated {path.name}"
        try:
            header = json.loads(f.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError):
            return f"truncated {path.name}"
    ends = [entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"]
    if 8 + length + max(ends, default=0) != size:
        return f"truncated {path.name}"
    return None


def checkpoint_problem(folder: str | os.PathLike) -> str | None:
    """Why `folder` is not a complete checkpoint (None when it is): a missing or truncated trainer state,
    weights (`*.safetensors`), optimizer / scheduler / RNG state (`*.pt`, `*.pth`) or JSON file."""
    place = Path(folder)
    if not (place / TRAINER_STATE).is_file():
        return f"no {TRAINER_STATE}"
    files = sorted(p for p in place.iterdir() if p.is_file())
    if not any(p.suffix == ".safetensors" for p in files):
        return "no *.safetensors weights"
    for path in files:
        if path.suffix == ".json":
            try:
                json.loads(path.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError):
                return f"truncated {path.name}"
        elif path.suffix == ".safetensors":
            problem = _safetensors_problem(path)
            if problem:
                return problem
        elif path.suffix in (".pt", ".pth"):
            try:
                zipfile.ZipFile(path).close()  # torch.save writes a zip: a cut one has no central directory
            except (zipfile.BadZipFile, OSError):
                return f"truncated {path.name}"
    return None


def checkpoints(folder: str | os.PathLike) -> list[Path]:
    """`checkpoint-N` folders of a run, oldest first."""
    place = Path(folder)
    if not place.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in place.iterdir() if p.is_dir() and (m := _CHECKPOINT.match(p.name))]
    return [p for _, p in sorted(found)]


def is_model_only(checkpoint: str | os.PathLike) -> bool:
    """A checkpoint saved with `save_only_model: true`: no optimizer or scheduler state to resume from."""
    return not any(p.name.startswith(_OPTIMIZER_STATE) for p in Path(checkpoint).iterdir())


@dataclass
class Resume:
    """The checkpoint a job resumes from, and whether it already reached `max_steps` (then the job only finishes:
    saves, evaluates and reports the run a kill interrupted after its last training step)."""

    checkpoint: str
    step: int
    finish_only: bool = False


def resolve_resume(training_args: Any, ours: RunIdentity, finished: bool) -> Resume | None:
    """`resume_from_checkpoint`: a checkpoint folder of this run, or `last`/`true` for the newest complete one in
    output_dir (incomplete ones are skipped with a warning naming them). `finished`: the run's marker says the run
    ended; then a checkpoint at `max_steps` is refused, else the run is finished from it."""
    key = "training.resume_from_checkpoint"
    value = training_args.resume_from_checkpoint
    if value is None or value.lower() in ("false", "none", ""):
        return None
    if value.lower() in ("last", "true"):
        found = checkpoints(training_args.output_dir)
        skipped: list[str] = []
        chosen = None
        for candidate in reversed(found):
            problem = checkpoint_problem(candidate)
            if problem is None:
                chosen = candidate
                break
            skipped.append(f"{candidate.name} ({problem})")
        if chosen is None:
            incomplete = f" (incomplete: {', '.join(skipped)})" if skipped else ""
            raise ConfigError(
                f"key `{key}` = {value!r}: no complete checkpoint in {training_args.output_dir}{incomplete}; train "
                "without it first or name a checkpoint folder."
            )
        if training_args.process_index == 0:
            if skipped:
                print(f"warning: skipped incomplete checkpoints: {', '.join(skipped)}", file=sys.stderr, flush=True)
            print(f"resuming from {chosen}", flush=True)
    else:
        chosen = Path(value)
        if not chosen.is_dir():
            raise ConfigError(f"key `{key}`: {value!r} is not a checkpoint folder.")
        problem = checkpoint_problem(chosen)
        if problem:
            raise ConfigError(f"key `{key}`: {value!r} is not a complete checkpoint ({problem}).")
        check_identity(ours, chosen, key, "checkpoint")
    if is_model_only(chosen):
        raise ConfigError(
            f"key `{key}`: {chosen} is model-only (saved with `save_only_model: true`): it holds no optimizer or "
            "learning-rate schedule state, so resuming would restart both silently; resume only runs saved with "
            "`save_only_model: false`, or start over with --overwrite_output_dir true."
        )
    step = int(json.loads((chosen / TRAINER_STATE).read_text(encoding="utf-8")).get("global_step", 0))
    reached = 0 < training_args.max_steps <= step
    if reached and finished:
        raise ConfigError(
            f"key `training.max_steps` = {training_args.max_steps}: {chosen.name} already reached step {step} and the "
            "run has finished, so resuming would train nothing; raise --max_steps."
        )
    if reached and training_args.process_index == 0:
        print(f"{chosen.name} reached max_steps ({step}): finishing the run (final save, evaluation, report)")
    return Resume(str(chosen), step, finish_only=reached)


class RunFolder:
    """One folder a job writes, for the life of the job (a context manager): locked, guarded, marked.

    On entry (process 0): refuse a folder that is one of `inputs` (the base model); take the lock; refuse a
    folder holding another run unless `overwrite` (then its contents move to `.zpx-replaced/`) or a resume of
    this run (with `overwrites_only`, only a folder that job wrote may be replaced); with `training_args`,
    choose the checkpoint to resume (`self.resume`); write the marker.
    On an exception the overwrite is undone (the old run comes back). `finish()` marks the run finished
    and drops the replaced run."""

    def __init__(
        self,
        folder: str | os.PathLike,
        identity: RunIdentity,
        *,
        overwrite: bool,
        resume_asked: bool,
        key: str = "training.output_dir",
        inputs: dict[str, str] | None = None,
        main_process: bool = True,
        training_args: Any = None,
        overwrites_only: str | None = None,
    ) -> None:
        self.folder, self.identity, self.key = Path(folder), identity, key
        self.overwrite, self.resume_asked, self.main_process = overwrite, resume_asked, main_process
        self.inputs = inputs or {}
        self.overwrites_only = overwrites_only  # a job name: overwrite replaces only that job's outputs here
        self.lock = FolderLock(self.folder, key)
        self.replaced = False
        self.training_args = training_args
        self.resume: Resume | None = None

    def _entries(self) -> list[Path]:
        if not self.folder.is_dir():
            return []
        return [p for p in self.folder.iterdir() if not p.name.startswith(".") and p.name != LOCK_FILE]

    def __enter__(self) -> RunFolder:
        for name, source in self.inputs.items():
            if Path(source).exists() and self.folder.resolve() == Path(source).resolve():
                raise ConfigError(
                    f"key `{self.key}`: {self.folder} is the {name} this job reads; write the run to another folder."
                )
        if not self.main_process:  # rank 0 has checked and marked the folder (see `open_run`)
            self._resolve(read_marker(self.folder))
            return self
        self.lock.acquire()
        try:
            self._guard()
        except BaseException:
            self.lock.release()
            raise
        return self

    def _guard(self) -> None:
        marker = read_marker(self.folder)
        recorded = identity_of(marker)
        ours = recorded is not None and recorded.fingerprint == self.identity.fingerprint
        holds_run = [p.name for p in self._entries()] not in ([], [RUN_MARKER])
        if holds_run and not self.overwrite:
            if not self.resume_asked:
                raise ConfigError(
                    f"key `{self.key}`: {self.folder} is not empty (an earlier run); pass --resume_from_checkpoint "
                    "last to continue it, --overwrite_output_dir true to replace it, or choose another folder."
                )
            if not ours:
                what = "no run marker" if recorded is None else f"a run of another config ({recorded.fingerprint})"
                raise ConfigError(
                    f"key `{self.key}`: {self.folder} holds {what}, not this config ({self.identity.fingerprint}); "
                    "resume only into the folder of the same run, or pass --overwrite_output_dir true to start over."
                )
        if (
            holds_run
            and self.overwrite
            and self.overwrites_only
            and getattr(recorded, "job", None) != self.overwrites_only
        ):
            what = "files of no run" if recorded is None else f"another {recorded.describe()}"
            raise ConfigError(
                f"key `{self.key}`: {self.folder} holds {what}; --overwrite_output_dir replaces only "
                f"{self.overwrites_only}'s own outputs there, so choose another folder."
            )
        if self.overwrite and self.resume_asked:
            raise ConfigError(
                "keys `overwrite_output_dir` and `training.resume_from_checkpoint` contradict each other; drop one."
            )
        self._resolve(marker if ours else None)  # before the marker is rewritten: it says whether the run finished
        shutil.rmtree(self.folder / STAGING, ignore_errors=True)  # a final save that a kill interrupted
        if self.overwrite and holds_run:
            self._move_aside()
        self.write_marker(finished=False)

    def _resolve(self, marker: dict[str, Any] | None) -> None:
        if self.training_args is not None:
            finished = bool(marker and marker.get("finished", True))
            self.resume = resolve_resume(self.training_args, self.identity, finished)

    def _move_aside(self) -> None:
        aside = self.folder / ASIDE
        if aside.is_dir():  # an earlier overwrite was killed: what is here is its unfinished run, not the old one
            for entry in self._entries():
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        else:
            aside.mkdir()
            for entry in self._entries():
                os.replace(entry, aside / entry.name)
        self.replaced = True

    def restore(self) -> bool:
        """Undo an overwrite after a failure: this run's files go, the replaced run comes back. True if restored."""
        aside = self.folder / ASIDE
        if not (self.main_process and self.replaced and aside.is_dir()):
            return False
        for entry in self._entries():
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        for entry in aside.iterdir():
            os.replace(entry, self.folder / entry.name)
        aside.rmdir()
        self.replaced = False
        return True

    def marker(self, finished: bool = False) -> dict[str, Any]:
        return {**asdict(self.identity), "finished": finished}

    def write_marker(self, finished: bool) -> None:
        atomic_write_json(self.folder / RUN_MARKER, self.marker(finished))

    def finish(self) -> None:
        """The run is whole: mark it finished and drop the run an overwrite replaced."""
        if not self.main_process:
            return
        self.write_marker(finished=True)
        shutil.rmtree(self.folder / ASIDE, ignore_errors=True)
        self.replaced = False

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> None:
        """After a failure, say what the folder holds now: the replaced run (an overwrite is undone), or this
        run's checkpoints."""
        try:
            note = None
            if error is not None and self.restore():
                note = (
                    f"the overwrite is undone: {self.folder} holds the run it held before (this run's files are gone)"
                )
            # Ctrl-C: the CLI boundary's one line already names the last complete checkpoint
            elif error is not None and not isinstance(error, (ConfigError, KeyboardInterrupt)) and self.main_process:
                saved = checkpoints(self.folder)
                note = f"the checkpoints saved before it in {self.folder} are intact" if saved else None
            if error is not None and self.main_process and [p.name for p in self._entries()] == [RUN_MARKER]:
                # the job failed before writing anything (e.g. a data file datasets cannot parse): no run is left
                # behind, and the lock's release removes a folder this job created
                (self.folder / RUN_MARKER).unlink(missing_ok=True)
            if note and error.args and isinstance(error.args[0], str):
                error.args = (f"{error.args[0].rstrip('.')}; {note}.", *error.args[1:])
            elif note:
                print(f"note: {note}", file=sys.stderr, flush=True)
        finally:
            self.lock.release()


__all__ = [
    "ASIDE",
    "FolderLock",
    "LOCK_FILE",
    "RUN_MARKER",
    "Resume",
    "RunFolder",
    "RunIdentity",
    "STAGING",
    "TRAINER_STATE",
    "atomic_write",
    "atomic_write_json",
    "check_identity",
    "checkpoint_problem",
    "checkpoints",
    "is_model_only",
    "publish_folder",
    "read_marker",
    "resolve_resume",
]
