"""``softdeploy demo``: the softmax-family demo (:mod:`softdeploy.demo`)."""

from __future__ import annotations

import argparse


def cmd_demo(args: argparse.Namespace) -> int:
    """``softdeploy demo``: see softdeploy.demo.run_demo."""
    from softdeploy.demo import run_demo

    run_demo(threads=args.threads, out=args.out, overwrite=args.overwrite)
    return 0
