"""The run folder, one mechanism per kind: atomic files, one lock, one identity, complete checkpoints.

- `atomic_write` (and `publish_folder` for a whole saved model): the file is written beside its target,
  fsynced and moved over it with `os.replace`, so a reader or a kill sees the old file or the new one,
  never half of one.
- `FolderLock`: `fcntl.flock` on `_zpx.lock` inside the folder, held for the whole job; a second job on
  the same folder stops at once (the lock goes with the process, so a killed job never leaves it behind).
- The marker `zpx_run.json` records the run's identity (`RunConfig.fingerprint`, job, family, config
  file) and whether the run finished. `check_identity` refuses a folder or a checkpoint of another run.
- No write goes through a link: `atomic_write` refuses a target that is a symbolic link, the lock file is opened
  with `O_NOFOLLOW`, and `RunFolder` refuses a folder holding links (`links_in`) before it writes anything.
- Every checkpoint ends with `zpx_checkpoint.json` (`write_manifest`, written atomically after its files): the
  size and sha256 of each file. `checkpoint_problem` is the one verification of a checkpoint (structure, trainer
  state, complete optimizer state, checksums); `resolve_resume` takes the newest checkpoint that passes it,
  naming every newer one it skips, and refuses a discovered checkpoint of another run.
- `RunFolder` ties them together for one output folder: lock, guard, overwrite (the old run is moved aside
  and restored if the new run fails, removed once it succeeds; only a folder with its own run marker and no
  other run inside it is replaced), marker, and `finish()` at the end.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import stat
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
MANIFEST = "zpx_checkpoint.json"  # size and sha256 of every file of a checkpoint, written after them
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


def link_refused(path: Path, key: str | None = None) -> ConfigError:
    """The one-line refusal of a symbolic link where a run folder writes: nothing is written through it."""
    where = f"key `{key}`: " if key else ""
    return ConfigError(
        f"{where}{path} is a symbolic link (to {os.readlink(path)}); a run folder writes only its own files, never "
        "through a link: remove the link (or choose another folder)."
    )


def atomic_write(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Write `data` to `path` through a temporary file in the same folder, fsync, then `os.replace`; a `path` that
    is a symbolic link is refused (`ConfigError`), not replaced or written through."""
    target = Path(path)
    if target.is_symlink():
        raise link_refused(target)
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


def atomic_write_json(path: str | os.PathLike[str], value: Any) -> None:
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

    def __init__(self, folder: str | os.PathLike[str], key: str = "training.output_dir") -> None:
        self.folder, self.key = Path(folder), key
        self._file: Any = None
        self.created = False

    def acquire(self) -> FolderLock:
        import fcntl

        self.created = not self.folder.exists()
        path = self.folder / LOCK_FILE
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            # O_NOFOLLOW: a planted link is refused, never followed (truncating its target); O_NONBLOCK: a FIFO
            # in its place does not block the open
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except OSError as error:  # a file in the way, a read-only folder, no permission, a link
            if error.errno == errno.ELOOP and path.is_symlink():
                raise link_refused(path, self.key) from None
            raise ConfigError(
                f"key `{self.key}`: cannot write to {self.folder} ({error.strerror or error}); choose a folder you "
                "can write."
            ) from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
            os.close(fd)
            what = "has other hard links" if stat.S_ISREG(info.st_mode) else "is not a regular file"
            raise ConfigError(f"key `{self.key}`: {path} {what}, so writing it would change another file; delete it.")
        handle = os.fdopen(fd, "r+", encoding="utf-8", errors="replace")
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
            with contextlib.suppress(OSError):
                self.folder.rmdir()
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


def read_marker(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
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


def check_identity(
    ours: RunIdentity,
    folder: str | os.PathLike[str],
    key: str,
    what: str,
    fix: str = "use a checkpoint of this run, or start over without it",
) -> None:
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
            f"key `{key}`: {what} {place} belongs to another {theirs.describe()}, not this {ours.describe()}; {fix}."
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


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(folder: str | os.PathLike[str]) -> None:
    """Record the size and sha256 of every file of a saved checkpoint in `zpx_checkpoint.json` (atomically, after
    the files, so a checkpoint whose save was cut short has none)."""
    place = Path(folder)
    files = {
        p.relative_to(place).as_posix(): {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
        for p in sorted(place.rglob("*"))
        if p.is_file() and p.name != MANIFEST and not p.is_symlink()
    }
    atomic_write_json(place / MANIFEST, {"files": files})


def _manifest_problem(place: Path) -> str | None:
    """Why the files of `place` are not the ones its manifest recorded at save time (None when they are)."""
    path = place / MANIFEST
    if not path.is_file():
        return f"no {MANIFEST}, the checksums a save writes last: its save was cut short, or an older zpx-hf wrote it"
    value = json.loads(path.read_text(encoding="utf-8"))  # JSON: `checkpoint_problem` read every .json first
    files = value.get("files") if isinstance(value, dict) else None
    if not isinstance(files, dict) or not all(isinstance(e, dict) for e in files.values()):
        return f"unreadable {MANIFEST}"
    for name, entry in files.items():
        saved = place / name
        if not saved.is_file():
            return f"{name} is missing ({MANIFEST} lists it)"
        if saved.stat().st_size != entry.get("bytes"):
            return f"{name} has {saved.stat().st_size} bytes, not the {entry.get('bytes')} saved"
        if file_sha256(saved) != entry.get("sha256"):
            return f"{name} changed since it was saved (sha256 differs from {MANIFEST})"
    return None


def checkpoint_problem(folder: str | os.PathLike[str]) -> str | None:
    """Why `folder` is not a checkpoint to resume from (None when it is): a missing or truncated trainer state,
    weights (`*.safetensors`), optimizer / scheduler / RNG state (`*.pt`, `*.pth`) or JSON file; a trainer state
    without `global_step`; optimizer state without its scheduler or the reverse; a file whose size or sha256 is
    not the one `zpx_checkpoint.json` recorded at save time (or no such manifest)."""
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
    state = json.loads((place / TRAINER_STATE).read_text(encoding="utf-8"))
    step = state.get("global_step") if isinstance(state, dict) else None
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return f"{TRAINER_STATE} has no global_step"
    names = [p.name for p in place.iterdir()]
    if not any(name.startswith("global_step") for name in names):  # DeepSpeed keeps both in global_step*/
        optimizer = any(name.startswith("optimizer") for name in names)
        if optimizer != ("scheduler.pt" in names):
            missing = "scheduler.pt" if optimizer else "optimizer.pt"
            return f"no {missing} (the optimizer state is incomplete)"
    return _manifest_problem(place)


def links_in(folder: str | os.PathLike[str]) -> list[Path]:
    """Symbolic links anywhere under `folder` (a linked folder is listed, not entered)."""
    found = []
    for root, folders, files in os.walk(folder):
        found += [Path(root, name) for name in sorted(folders + files) if os.path.islink(os.path.join(root, name))]
    return found


def checkpoints(folder: str | os.PathLike[str]) -> list[Path]:
    """`checkpoint-N` folders of a run, oldest first."""
    place = Path(folder)
    if not place.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in place.iterdir() if p.is_dir() and (m := _CHECKPOINT.match(p.name))]
    return [p for _, p in sorted(found)]


def is_model_only(checkpoint: str | os.PathLike[str]) -> bool:
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
            # a checkpoint of another run copied in: refused, not skipped (someone put it there)
            check_identity(ours, candidate, key, "checkpoint", f"move it out of {training_args.output_dir}")
            problem = checkpoint_problem(candidate)
            if problem is None:
                chosen = candidate
                break
            skipped.append(f"{candidate.name} ({problem})")
        if chosen is None:
            incomplete = f" (cannot be resumed: {'; '.join(skipped)})" if skipped else ""
            raise ConfigError(
                f"key `{key}` = {value!r}: no complete checkpoint in {training_args.output_dir}{incomplete}; train "
                "without it first or name a checkpoint folder."
            )
        if training_args.process_index == 0:
            if skipped:
                print(
                    f"warning: resuming from {chosen.name}, not the newest checkpoint: skipped {'; '.join(skipped)} "
                    "(left as they are: delete them once you have looked)",
                    file=sys.stderr,
                    flush=True,
                )
            print(f"resuming from {chosen}", flush=True)
    else:
        chosen = Path(value)
        if not chosen.is_dir():
            raise ConfigError(f"key `{key}`: {value!r} is not a checkpoint folder.")
        check_identity(ours, chosen, key, "checkpoint")
        problem = checkpoint_problem(chosen)
        if problem:
            raise ConfigError(
                f"key `{key}`: {value!r} is not a complete checkpoint ({problem}); name another checkpoint of "
                "this run, or `last` for the newest complete one."
            )
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
        folder: str | os.PathLike[str],
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
        self._note_replaced()
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
        if holds_run and self.overwrite:
            self._check_replaceable(recorded)
        links = links_in(self.folder)
        if links:
            raise link_refused(links[0], self.key)
        self._resolve(marker if ours else None)  # before the marker is rewritten: it says whether the run finished
        shutil.rmtree(self.folder / STAGING, ignore_errors=True)  # a final save that a kill interrupted
        if self.overwrite and holds_run:
            self._move_aside()
        self.write_marker(finished=False)

    def _check_replaceable(self, recorded: RunIdentity | None) -> None:
        """An overwrite deletes only what a run wrote: a folder with its own run marker and no other run in it."""
        if recorded is None:
            names = sorted(p.name for p in self._entries())
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            raise ConfigError(
                f"key `{self.key}`: {self.folder} has no run marker ({RUN_MARKER}) of its own but holds {shown}; "
                "--overwrite_output_dir replaces only a run's own folder, so give that run's folder, a new one, or "
                "move those files away yourself."
            )
        nested = [
            path.parent
            for entry in self._entries()
            if entry.is_dir() and not entry.is_symlink() and not _CHECKPOINT.match(entry.name)
            for path in sorted(entry.rglob(RUN_MARKER))
            if getattr(identity_of(read_marker(path.parent)), "fingerprint", None) != recorded.fingerprint
        ]
        if nested:
            listed = ", ".join(str(p.relative_to(self.folder)) for p in nested[:3])
            raise ConfigError(
                f"key `{self.key}`: {self.folder} holds other runs ({listed}); --overwrite_output_dir would delete "
                "them with it, so choose another folder (or move them out first)."
            )

    def _note_replaced(self) -> None:
        """Say that `.zpx-replaced/` holds the run a killed overwrite replaced, and how to get it back."""
        aside = self.folder / ASIDE
        if not aside.is_dir():
            return
        replaced = identity_of(read_marker(aside))
        what = replaced.describe() if replaced else "files"
        print(
            f"warning: {aside} holds the {what} that an interrupted overwrite replaced; the next run to finish in "
            f"{self.folder} deletes it. To restore it, delete every other entry of {self.folder} and move the "
            f"contents of {ASIDE}/ back into it.",
            file=sys.stderr,
            flush=True,
        )

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
            if error is None:
                return
            note = None
            if self.restore():
                note = (
                    f"the overwrite is undone: {self.folder} holds the run it held before (this run's files are gone)"
                )
            # Ctrl-C: the CLI boundary's one line already names the last complete checkpoint
            elif not isinstance(error, (ConfigError, KeyboardInterrupt)) and self.main_process:
                saved = checkpoints(self.folder)
                note = f"the checkpoints saved before it in {self.folder} are intact" if saved else None
            if self.main_process and [p.name for p in self._entries()] == [RUN_MARKER]:
                # the job failed before writing anything (e.g. a data file datasets cannot parse): no run is left
                # behind, and the lock's release removes a folder this job created
                (self.folder / RUN_MARKER).unlink(missing_ok=True)
            if note and isinstance(error, KeyboardInterrupt):  # the CLI prints this one line, not its resume advice
                error.args = (f"interrupted; {note}; run the same command again to start the overwrite over.",)
            elif note and error.args and isinstance(error.args[0], str):
                error.args = (f"{error.args[0].rstrip('.')}; {note}.", *error.args[1:])
            elif note:
                print(f"note: {note}", file=sys.stderr, flush=True)
        finally:
            self.lock.release()


__all__ = [
    "ASIDE",
    "FolderLock",
    "LOCK_FILE",
    "MANIFEST",
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
    "link_refused",
    "links_in",
    "publish_folder",
    "read_marker",
    "resolve_resume",
    "write_manifest",
]
