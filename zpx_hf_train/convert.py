"""Convert a Llama-architecture checkpoint (Llama, Mistral, Qwen2) into a ZPX checkpoint with the same logits.

    zpx-convert SRC OUT [--phase-channels C] [--fixed-lambdas] [--seed N] [--overwrite] [--family zpx]

SRC is a local checkpoint folder (`save_pretrained`); OUT receives safetensors weights, remote code, the
source's tokenizer and generation config, and a model card naming the source. The per-head lambdas start at 0
and are trained (`--fixed-lambdas`: kept at 0). Exit codes: 0 done, 2 a source the conversion cannot carry
exactly, or a file error (one line naming it). Continue training with `zpx-train` and `model: {init_from: OUT}`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from zpx_hf.conversion_llama import ConversionError, convert_llama_to_zpx

from .cli import EXIT_USAGE, guarded

PROG = "zpx-convert"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2 (argparse prints the usage too)
        print(f"{PROG}: usage error: {message}; see {PROG} --help.", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def main(argv: Sequence[str] | None = None) -> int:
    """`zpx-convert SRC OUT [...]`."""
    parser = _Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("source", metavar="SRC", help="local LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM")
    parser.add_argument("output", metavar="OUT", help="folder for the ZPX checkpoint")
    parser.add_argument("--phase-channels", type=int, default=8, help="phase channels C per head (default 8)")
    parser.add_argument("--fixed-lambdas", action="store_true", help="keep both lambdas fixed at 0 (not trained)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the new phase encoder's initialisation")
    parser.add_argument("--overwrite", action="store_true", help="write into a non-empty OUT")
    parser.add_argument("--family", default="zpx", help="target family: zpx (pct and versor are refused: no exact map)")
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as stop:  # --help (0) or a usage error (2, one line printed)
        return int(stop.code or 0)

    def convert() -> str:
        return str(
            convert_llama_to_zpx(
                args.source,
                args.output,
                phase_channels=args.phase_channels,
                learnable_lambdas=not args.fixed_lambdas,
                seed=args.seed,
                overwrite=args.overwrite,
                family=args.family,
            )
        )

    try:
        code, output = guarded(convert, PROG)
    except ConversionError as error:
        print(f"{PROG}: conversion error: {' '.join(str(error).split())}", file=sys.stderr)
        return EXIT_USAGE
    if output is not None:
        print(f"converted {args.source} -> {output}")
    return code


if __name__ == "__main__":
    sys.exit(main())
