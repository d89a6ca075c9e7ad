"""One command-line shape for the training jobs: `zpx-train CONFIG [--flag value ...]` and friends.

Every command runs its job through `guarded`, the one place where an error the user can fix becomes one line
on stderr, `PROG: <kind> error: <what, and the fix>`, and an exit code:

- 0 done (and for `--help`, which prints the command's short usage);
- 2 a config, data, file or Hub error: `ConfigError`, a `ValueError` while the config is read and checked,
  an `OSError` (a missing, unreadable or unwritable file, a full disk) or a file torch or safetensors cannot
  read or write. Config checks run before anything is built, so most of these stop a run before it starts;
- 1 training diverged (the step is named);
- 130 interrupted (Ctrl-C, SIGINT): the line names the newest complete checkpoint and the resume command.

Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .config import ConfigError
from .run_folder import checkpoint_problem, checkpoints
from .trainer import TrainingDivergedError

EXIT_DIVERGED, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130
HELP_FLAGS = ("-h", "--help")


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def expected_error(error: BaseException) -> tuple[str, str] | None:
    """`(kind, one line)` for a file the job could not read or write (or a network failure, which requests and
    huggingface_hub raise as `OSError`), or None when `error` is not such a failure."""
    from safetensors import SafetensorError

    if isinstance(error, OSError) and error.errno is None and error.filename is None:  # requests, the Hub
        return "network error", f"{_first_line(error)}; check the network and your login (HF_TOKEN or `hf auth login`)."
    if isinstance(error, OSError):
        what = error.strerror or _first_line(error)
        name = f" {error.filename!r}" if error.filename else ""
        full = error.errno == errno.ENOSPC
        fix = "free space on that disk or choose another output_dir" if full else "check the path and its permissions"
        return "file error", f"{what}:{name}; {fix}." if name else f"{what}; {fix}."
    if isinstance(error, RuntimeError) and "inline_container" in str(error):  # torch.save's zip writer
        return "file error", (
            f"torch could not finish writing a checkpoint file ({_first_line(error)}); the disk is probably full: "
            "free space or choose another output_dir."
        )
    if isinstance(error, SafetensorError):
        full = any(sign in str(error) for sign in ("StorageFull", "No space left"))
        hint = "the disk is full: free space or choose another output_dir" if full else "it may be truncated"
        return "file error", f"a safetensors file cannot be read or written ({_first_line(error)}); {hint}."
    return None


def last_complete_checkpoint(output_dir: str) -> Path | None:
    """The newest `checkpoint-N` in `output_dir` that `resume last` would take (complete files only)."""
    return next((p for p in reversed(checkpoints(output_dir)) if checkpoint_problem(p) is None), None)


def interrupted_message(prog: str, run: Any) -> str:
    """What an interrupted run left: the newest complete checkpoint and how to continue from it."""
    from transformers import TrainingArguments

    output_dir = run[TrainingArguments].output_dir if run is not None and TrainingArguments in run.args else None
    if output_dir is None:
        return "interrupted before training started; nothing was written."
    checkpoint = last_complete_checkpoint(output_dir)
    if checkpoint is None:
        return f"interrupted before the first checkpoint in {output_dir}; the run starts over when run again."
    command = "zpx-train" if prog == "zpx-main" else prog
    return (
        f"interrupted; {checkpoint} is the last complete checkpoint and is intact: continue with "
        f"`{command} {run.path} --output_dir {output_dir} --resume_from_checkpoint last` (and this run's flags)."
    )


def guarded(job: Callable[[], Any], prog: str, run: Any = None, reading_config: bool = False) -> tuple[int, Any]:
    """`(0, job())`, or the exit code and None after printing one line for an error the user can fix.

    `reading_config`: the job reads and checks a config, so a `ValueError` is a bad value, not a bug.
    `run`: the run config of a training job, whose checkpoints an interruption names."""
    try:
        return 0, job()
    except TrainingDivergedError as error:
        print(f"{prog}: training error: {error}", file=sys.stderr)
        return EXIT_DIVERGED, None
    except ValueError as error:
        if not (reading_config or isinstance(error, ConfigError)):
            raise
        print(f"{prog}: config error: {' '.join(str(error).split())}", file=sys.stderr)
        return EXIT_USAGE, None
    except KeyboardInterrupt as error:
        said = error.args[0] if error.args and isinstance(error.args[0], str) else None  # e.g. an undone overwrite
        print(f"{prog}: {said or interrupted_message(prog, run)}", file=sys.stderr)
        return EXIT_INTERRUPTED, None
    except Exception as error:
        found = expected_error(error)
        if found is None:
            raise
        print(f"{prog}: {found[0]}: {found[1]}", file=sys.stderr)
        return EXIT_USAGE, None


def usage_text(usage: str) -> str:
    """A command's `--help`: its module docstring (command lines, config layout) and the exit codes."""
    codes = "Exit codes: 0 done, 1 training diverged, 2 a config, data or file error (one line), 130 interrupted."
    return f"{usage.strip()}\n\nAny config key can be given as --key value. {codes}"


def cli_main(
    argv: Sequence[str] | None,
    usage: str,
    load_config: Callable[[str, Sequence[str]], Any],
    run: Callable[[Any], dict],
    done_message: Callable[[dict], str],
) -> int:
    """Parse `CONFIG [flags]`, run the job, print the metrics and `done_message` on the main process."""
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = usage.strip().split("\n\n")[1].split()[0]  # the first command line of the docstring
    if any(flag in HELP_FLAGS for flag in argv):
        print(usage_text(usage))
        return 0
    if not argv or argv[0].startswith("-"):
        print(usage.strip().split("\n\n")[1], file=sys.stderr)
        return EXIT_USAGE
    code, config = guarded(lambda: load_config(argv[0], argv[1:]), prog, reading_config=True)
    if config is None:
        return code
    code, result = guarded(lambda: run(config), prog, run=config)
    if result is None:
        return code
    if result["trainer"].is_world_process_zero():
        from .report import metrics_table

        print(metrics_table(result["metrics"]))
        print(done_message(result))
    return 0


__all__ = ["cli_main", "expected_error", "guarded", "interrupted_message", "last_complete_checkpoint", "usage_text"]
