"""One command-line shape for the training jobs: `zpx-train CONFIG [--flag value ...]` and friends.

Exit codes: 0 done; 2 a config, data or Hub error (one line naming the key or file and the fix, printed
before training starts wherever the check can be made up front); 1 training diverged (the step is named).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from .config import ConfigError
from .trainer import TrainingDivergedError


def guarded(job: Callable[[], Any]) -> tuple[int, Any]:
    """`(0, job())`, or `(2, None)` for a config/data/Hub error and `(1, None)` for a diverged run, each
    reported as one line on stderr."""
    try:
        return 0, job()
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        return 2, None
    except TrainingDivergedError as error:
        print(f"training error: {error}", file=sys.stderr)
        return 1, None


def cli_main(
    argv: Sequence[str] | None,
    usage: str,
    load_config: Callable[[str, Sequence[str]], Any],
    run: Callable[[Any], dict],
    done_message: Callable[[dict], str],
) -> int:
    """Parse `CONFIG [flags]`, run the job, print the metrics and `done_message` on the main process."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-"):
        print(usage.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    code, result = guarded(lambda: run(load_config(argv[0], argv[1:])))
    if result is None:
        return code
    if result["trainer"].is_world_process_zero():
        from .report import metrics_table

        print(metrics_table(result["metrics"]))
        print(done_message(result))
    return 0


__all__ = ["cli_main", "guarded"]
