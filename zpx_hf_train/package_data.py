"""The files that ship with the training stack: run configs (`configs/*.yaml`, `configs/accelerate/`) and
model-card templates (`model_cards/<name>.md`).

They live once, in the repository's `configs/` and `model_cards/`; the wheel carries them as package data
`zpx_hf_train/configs/` and `zpx_hf_train/model_cards/` (pyproject's `package-dir` maps the folders there).
`data_folder` reads the installed package's folder through `importlib.resources`, and in a source checkout
(where `zpx_hf_train/` holds only modules) the repository's folder beside it.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]


def data_folder(name: str) -> Path:
    """`zpx_hf_train/<name>/` of the installed package, else `<repository>/<name>/` of a source checkout."""
    installed = resources.files(__package__).joinpath(name)
    for folder in (installed, REPOSITORY / name):
        if folder.is_dir():
            return Path(str(folder))
    raise FileNotFoundError(
        f"zpx_hf_train's {name}/ folder is missing (looked in {installed} and {REPOSITORY / name}): the package is "
        "installed without its data; reinstall zpx-hf from its wheel or run from a full source checkout."
    )


def shipped_configs() -> dict[str, Path]:
    """The shipped run configs by name (`zpx-tiny` -> `.../configs/zpx-tiny.yaml`)."""
    return {path.stem: path for path in sorted(data_folder("configs").glob("*.yaml"))}


__all__ = ["REPOSITORY", "data_folder", "shipped_configs"]
