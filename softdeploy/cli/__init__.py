"""The ``softdeploy`` command: a thin layer over library calls.

softdeploy ops      the operator registry (inputs, attributes, kernel variant on this CPU)
softdeploy doctor   is the native library found and loadable; versions; CPU features; with MODEL, its int8
                    target, format and the kernel path its int8 nodes take here
softdeploy demo     a small model using the softmax-family ops: trained, exported, run with stock
                    onnxruntime and with softdeploy's kernels; agreement and latency
softdeploy quantize int8 dynamic (per-channel) or static QDQ with calibration through our kernels, for a
                    --target CPU class (portable: fast and exact on every x86-64 class);
                    --max-drop keeps the nodes too sensitive to quantize in float and says why
softdeploy compare  one model in every variant (torch, onnxruntime fp32 stock / softdeploy, int8
                    dynamic / static) on the same data: task accuracy, agreement, latency, size;
                    with no arguments: all-MiniLM-L6-v2 MaxSim retrieval on chatterbot-corpus
softdeploy export   FACTORY OUT.onnx: export the module a factory returns, validate it against torch
softdeploy optimize IN.onnx OUT.onnx: rewrite standard-op patterns into softdeploy ops; per-rule report
softdeploy compile  compile an ONNX model with TVM (optionally MetaSchedule-tuned, locally or over RPC)
softdeploy distill  OUT: distil all-MiniLM-L6-v2 into a 3-layer student (layer reduction, one-shot or in
                    stages, or paraphrase-MiniLM-L3); MSE or softened KD; resumable; OUT/student.safetensors
softdeploy serve    MODEL.onnx | WORKFLOW.yaml: HTTP serving on Ray Serve (replicas, dynamic batching; extra [serve])
softdeploy generate MODEL_DIR: text generation from a transformers causal-LM folder on onnxruntime, optionally with
                    soft thinking (SoftTokenEmbedding); the same loop on torch eager with --backend torch
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence


def _parser(only_ops: bool = False) -> argparse.ArgumentParser:
    """Every verb's arguments; with ``only_ops``, the ``ops`` verb's alone (the other verbs' choices and help
    texts import the cases, torch and onnxscript: seconds that listing the registry must not pay)."""
    # Each verb's module is imported here, inside main's guard against Ctrl-C, and only the ones a parse needs.
    from softdeploy.cli.ops import cmd_ops

    parser = argparse.ArgumentParser(
        prog="softdeploy", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("ops", help="list the operator registry").set_defaults(fn=cmd_ops)
    if only_ops:
        _add_verbose(parser, sub)
        return parser
    from softdeploy.cli.compare import _add_compare_parser, cmd_run
    from softdeploy.cli.compile import cmd_compile
    from softdeploy.cli.demo import cmd_demo
    from softdeploy.cli.distill import _add_distill_parser
    from softdeploy.cli.doctor import cmd_doctor
    from softdeploy.cli.export import _add_export_commands
    from softdeploy.cli.quantize import _add_quantize_parser
    from softdeploy.cli.serve import _add_serve_parser

    p = sub.add_parser("doctor", help="check the native library and the environment (and a quantized MODEL)")
    p.add_argument(
        "model", nargs="?", help="an ONNX model: its int8 target, format and the path its int8 nodes take here"
    )
    p.set_defaults(fn=cmd_doctor)
    p = sub.add_parser("demo", help="train, export and run a small model with the softmax-family ops")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="folder for the exported model (default: a new temporary folder)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing model file in --out")
    p.set_defaults(fn=cmd_demo)
    _add_quantize_parser(sub)
    _add_compare_parser(sub)
    p = sub.add_parser(
        "run",
        help="your own model: export, quantize (accuracy budget on your metric), compare -- from one workflow file",
        description="WORKFLOW is a YAML or JSON file (schema: softdeploy/workflow/schema.json): model (ONNX file or "
        "torch factory), data, metrics, quantize (mode, max_drop), variants. Reports go to OUT/NAME/.",
    )
    p.add_argument("workflow")
    p.add_argument("--quick", action="store_true", help="fewer timing rounds (smoke test)")
    p.set_defaults(fn=cmd_run)
    _add_export_commands(sub)
    p = sub.add_parser("compile", help="compile an ONNX model with TVM (tuned schedules, RPC devices)")
    p.add_argument("model", help="ONNX model (com.softdeploy ops allowed)")
    p.add_argument("--backend", choices=["tvm"], default="tvm")
    p.add_argument("--shape", action="append", default=[], help="static input shape NAME=1x128 (repeat per input)")
    p.add_argument("--tune-trials", type=int, default=0, help="MetaSchedule trials in all (0: no tuning)")
    p.add_argument("--records", default=None, help="tuning database folder (read, and written by --tune-trials)")
    p.add_argument("--untuned", action="store_true", help="TVM's default schedules only (for comparison)")
    p.add_argument("--target-cpu", default=None, help="LLVM CPU name (default: this machine's)")
    p.add_argument("--rpc", default=None, metavar="HOST:PORT", help="TVM RPC tracker: tune and measure there")
    p.add_argument("--key", default=None, help="device key of the RPC servers")
    p.add_argument("-o", "--output", default=None, help="compiled library (default MODEL_tvm.so)")
    p.add_argument("--overwrite", action="store_true", help="replace the library (and its .json) if they exist")
    p.set_defaults(fn=cmd_compile)
    _add_distill_parser(sub)
    _add_serve_parser(sub)
    from softdeploy.cli.generate import add_parser as add_generate_parser

    add_generate_parser(sub)
    _add_verbose(parser, sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The ``softdeploy`` entry point: parses ``argv`` and runs the command; bad input is one ``softdeploy: error: ...``
    line with exit 2, other failures one line with exit 1 (``--verbose`` adds the traceback), Ctrl-C at any point --
    start-up included -- one line with exit 130."""
    try:
        words = sys.argv[1:] if argv is None else list(argv)
        verb = next((w for w in words if not w.startswith("-")), None)
        args = _parser(only_ops=verb == "ops").parse_args(argv)
        import traceback  # noqa: F401 -- what _run needs, imported here, inside the interrupt guard

        import softdeploy.terminal  # noqa: F401
    except KeyboardInterrupt:
        return _interrupted()
    return _run(args)


def entry() -> None:
    """The console script (and ``python -m softdeploy.cli``): :func:`main`, then exit. After Ctrl-C the process ends
    at once (``os._exit``) once its one line is out: an interrupt may land inside a native library's start-up (torch,
    onnxruntime), whose static destructors then abort at interpreter exit ("terminate called ..."). Every output is
    written atomically (:mod:`softdeploy.files`), so nothing is left half-written by ending there."""
    import os
    import signal

    from softdeploy.interrupts import hold_during_imports

    hold_during_imports()  # a Ctrl-C inside a native library's import must not abort the process
    try:
        code = main()
        # The command is over: a Ctrl-C from here on must not turn its exit into death by signal during the
        # interpreter's shutdown (the outputs are written, the exit code stands).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except KeyboardInterrupt:  # in the instant between the two
        code = _interrupted()
    if code == 130:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(130)
    sys.exit(code)


def _interrupted() -> int:
    """The one line for Ctrl-C, said with further Ctrl-Cs held off (a second one must not turn it into a traceback)."""
    import signal
    import threading

    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main_thread else None
    try:
        print("softdeploy: interrupted", file=sys.stderr)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    return 130


def _add_verbose(parser: argparse.ArgumentParser, sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``--verbose`` before or after the verb: on the main parser, and on every verb's parser with a
    suppressed default (so that a verb's parse does not reset a --verbose given before it)."""
    help_ = (
        "show the libraries' warnings and output (torch, onnxruntime, TVM) instead of keeping them in a log "
        "file; on an error, also print the Python traceback"
    )
    parser.add_argument("--verbose", "-v", action="store_true", help=help_)
    for verb in sub.choices.values():
        verb.add_argument("--verbose", "-v", action="store_true", default=argparse.SUPPRESS, help=help_)


def _run(args: argparse.Namespace) -> int:
    """Runs the verb. A softdeploy error (bad input: a file, an argument, a model) is one line and exit
    code 2; any other exception is one line with its type and exit code 1; --verbose adds the traceback.
    Without --verbose the libraries' warnings and output go to a log file (softdeploy.terminal)."""
    import traceback

    from softdeploy.errors import SoftdeployError
    from softdeploy.terminal import cli_session

    try:
        with cli_session(args.command, verbose=args.verbose):
            return int(args.fn(args))
    except KeyboardInterrupt:
        return _interrupted()
    except SoftdeployError as e:
        if args.verbose:
            traceback.print_exc()
        print(f"softdeploy: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        if _from_interrupt(e):  # Ctrl-C that a library turned into its own error (pybind11: "initialization failed")
            return _interrupted()
        if args.verbose:
            traceback.print_exc()
        first = next((line for line in str(e).splitlines() if line.strip()), "")
        hint = "" if args.verbose else " (run with --verbose for the traceback)"
        print(f"softdeploy: error: {type(e).__name__}: {first}{hint}", file=sys.stderr)
        return 1


def _from_interrupt(e: BaseException) -> bool:
    """Whether ``e`` was raised from or while handling a KeyboardInterrupt: a native module interrupted in its
    import re-raises the interrupt as ``ImportError: initialization failed`` with the interrupt as its cause."""
    seen: set[int] = set()
    cause: BaseException | None = e
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False
