"""Load a saved checkpoint through `trust_remote_code=True` in a fresh Python that cannot import zpx_hf."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.modules["zpx_hf"] = None  # any `import zpx_hf` now raises ImportError
    import torch
    import transformers
    from transformers import {auto_class}
    try:
        import zpx_hf  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("zpx_hf must not be importable here")
    model = {auto_class}.from_pretrained({path!r}, trust_remote_code=True)
    model.eval()
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    inputs = torch.load({inputs!r})
    with torch.no_grad():
        out = model(**inputs)
    result = out.logits if hasattr(out, "logits") else out.last_hidden_state
    torch.save({{"output": result, "class": type(model).__name__}}, {result!r})
    """
)


def run_remote_code(checkpoint: Path, auto_class: str, inputs: dict[str, torch.Tensor], workdir: Path) -> dict:
    """Run `auto_class.from_pretrained(checkpoint, trust_remote_code=True)` in a subprocess without zpx_hf.

    Returns {"output": logits or last_hidden_state, "class": loaded class name}.
    """
    inputs_path = workdir / f"inputs_{auto_class}.pt"
    result_path = workdir / f"result_{auto_class}.pt"
    torch.save(inputs, inputs_path)
    script = _SCRIPT.format(
        auto_class=auto_class, path=str(checkpoint), inputs=str(inputs_path), result=str(result_path)
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env["HF_HUB_OFFLINE"] = "1"
    env["HF_MODULES_CACHE"] = str(workdir / "hf_modules")
    completed = subprocess.run(
        [sys.executable, "-c", script], cwd=workdir, env=env, capture_output=True, text=True, timeout=300
    )
    if completed.returncode != 0:
        raise AssertionError(f"remote-code load failed:\n{completed.stdout}\n{completed.stderr}")
    return torch.load(result_path)
