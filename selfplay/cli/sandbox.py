"""`selfplay sandbox build-image`: build the Docker sandbox image, offline when no registry is reachable.

    selfplay sandbox build-image [--name NAME] [--method auto|debootstrap|dockerfile] [--force]

"auto" builds from `sandbox/image/Dockerfile` when a registry answers and otherwise by debootstrap + `docker import`
(the root filesystem tarball is cached under --cache-dir, so rebuilds take seconds). A second run with the same
recipe does nothing. The logic lives in `sandbox.image`; this module only parses arguments and reports.
"""

from __future__ import annotations

import argparse

from selfplay.runtime.errors import UserError


def configure(parser: argparse.ArgumentParser) -> None:
    from sandbox.image import DEFAULT_CACHE_DIR, DEFAULT_IMAGE, DEFAULT_MIRROR, METHODS

    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    build = sub.add_parser("build-image", help="build the Docker sandbox image (offline capable)")
    build.add_argument("--name", default=DEFAULT_IMAGE, help=f"image name (default {DEFAULT_IMAGE})")
    build.add_argument(
        "--method",
        choices=METHODS,
        default="auto",
        help="debootstrap + docker import (no registry needed), the Dockerfile, or auto (default)",
    )
    build.add_argument("--mirror", default=DEFAULT_MIRROR, help="Debian mirror for debootstrap")
    build.add_argument("--cache-dir", default=DEFAULT_CACHE_DIR, help="where the rootfs tarball is cached")
    build.add_argument("--force", action="store_true", help="rebuild even when the image is up to date")


def run(args: argparse.Namespace) -> int:
    if getattr(args, "action", None) != "build-image":
        raise UserError("say what to do: `selfplay sandbox build-image [--name NAME] [--method ...]`")
    from sandbox.errors import SandboxError
    from sandbox.image import build_image

    try:
        build_image(
            args.name,
            args.method,
            mirror=args.mirror,
            cache_dir=args.cache_dir,
            force=args.force,
            log=lambda line: print(line, flush=True),
        )
    except SandboxError as exc:
        raise UserError(str(exc)) from None
    return 0
