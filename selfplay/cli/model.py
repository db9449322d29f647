"""`selfplay model import FILE.gguf --out DIR`: a GGUF model file as a plain Hugging Face folder.

    selfplay model import FILE.gguf|ALIAS|gguf:PACKAGE/FILE.gguf --out DIR [--overwrite] [--no-progress]

The folder holds the dequantised weights (safetensors), a config without quantisation and the tokenizer with the
chat template the file carries; it is checked by reloading it and comparing its logits on a fixed prompt with the
GGUF-loaded model's, and appears only once complete (selfplay/models/gguf_import.py). Configs may instead name the
file directly (`model.name_or_path=smollm2-135m-instruct`): it is then imported once into the model cache.
"""

from __future__ import annotations

import argparse
import json

from selfplay.runtime.errors import UserError


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    imp = sub.add_parser("import", help="a GGUF file as a plain Hugging Face model folder")
    imp.add_argument(
        "source", metavar="FILE.gguf", help="a .gguf file, an alias (smollm2-135m-instruct) or gguf:PACKAGE/FILE.gguf"
    )
    imp.add_argument("--out", required=True, metavar="DIR", help="the folder to write (must not hold files)")
    imp.add_argument("--overwrite", action="store_true", help="replace DIR if it already holds files")
    imp.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    if getattr(args, "action", None) != "import":
        raise UserError("say what to do: `selfplay model import FILE.gguf --out DIR`")
    from selfplay.models.gguf_import import import_gguf, locate_gguf

    path = locate_gguf(args.source, key="FILE.gguf")
    report = import_gguf(path, args.out, progress=not args.no_progress, overwrite=args.overwrite)
    print(json.dumps({k: v for k, v in report.items() if k != "check_prompt"}, indent=1))
    print(
        f"wrote {args.out}: {report['architecture']}, {report['parameters'] / 1e6:.1f} M parameters, logits "
        f"within {report['logits_max_abs_diff']:.1e} of the GGUF model's"
    )
    return 0
