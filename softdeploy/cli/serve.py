"""``softdeploy serve``: HTTP serving of a model or a workflow on Ray Serve."""

from __future__ import annotations

import argparse


def _serve_model_path(target: str) -> str:
    """The ONNX file of ``softdeploy serve TARGET``: TARGET itself, or the model of a workflow file."""
    from pathlib import Path

    from softdeploy.errors import ArgumentError

    if Path(target).suffix.lower() in (".yaml", ".yml", ".json"):
        from softdeploy.workflow import load_workflow

        workflow = load_workflow(target)
        if workflow.factory or workflow.folder:
            raise ArgumentError(
                f"serve {target}: its model {workflow.model!r} is a torch "
                f"{'factory' if workflow.factory else 'model folder'} (rule: serve an ONNX model: "
                "export it first with `softdeploy export`)"
            )
        return workflow.model
    return target


def cmd_serve(args: argparse.Namespace) -> int:
    """``softdeploy serve MODEL.onnx | WORKFLOW.yaml``: the model on Ray Serve until Ctrl-C."""
    import time

    from softdeploy.errors import ArgumentError
    from softdeploy.serve.app import ServeOptions, serve_model

    options = ServeOptions(
        replicas=args.replicas,
        cpus_per_replica=args.cpus_per_replica,
        max_batch_size=args.max_batch_size,
        batch_wait_s=args.batch_wait_ms / 1000.0,
        kernels=args.kernels,
        max_body_bytes=args.max_body_bytes,
    )
    try:
        import ray  # noqa: F401 -- the extra's presence, checked before any work
    except ImportError as e:
        raise ArgumentError("serve needs Ray Serve: pip install 'softdeploy[serve]'") from e
    started = serve_model(
        _serve_model_path(args.model),
        options,
        address=args.address,
        host=args.host,
        port=args.port,
        num_cpus=args.num_cpus,
    )
    print(
        f"serving {args.model} at {started.url}/ ({args.replicas} replica(s) x {args.cpus_per_replica} CPU(s), "
        f"batches up to {args.max_batch_size}); GET /metadata, /healthz; Ctrl-C stops",
        flush=True,
    )
    try:
        while True:
            time.sleep(3600)
    finally:
        from ray import serve

        serve.shutdown()


def _add_serve_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``softdeploy serve``'s arguments."""
    p = sub.add_parser(
        "serve",
        help="serve an ONNX model over HTTP on Ray Serve (replicas, dynamic batching); extra [serve]",
        description="Replicas open softdeploy.runtime.Session (kernel library registered, one intra-op thread per "
        "reserved CPU). POST / with a JSON, .npy or .npz body; GET /healthz, /metadata, /stats.",
    )
    p.add_argument("model", help="ONNX model, or a workflow file (YAML/JSON) whose model is an ONNX file")
    p.add_argument("--replicas", type=int, default=1, help="Ray Serve replicas (default 1)")
    p.add_argument(
        "--cpus-per-replica", type=int, default=1, help="CPUs per replica = its intra-op threads (default 1)"
    )
    p.add_argument("--max-batch-size", type=int, default=16, help="largest dynamic batch; 1 turns batching off")
    p.add_argument("--batch-wait-ms", type=float, default=5.0, help="how long a batch waits to fill (default 5 ms)")
    p.add_argument("--kernels", choices=["native", "portable", "auto"], default="native")
    p.add_argument("--max-body-bytes", type=int, default=64 * 1024 * 1024, help="larger bodies get a 400")
    p.add_argument("--address", default=None, help="join this Ray cluster (e.g. HEAD:6379); default: a local Ray")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray (default: all)")
    p.add_argument("--host", default="127.0.0.1", help="HTTP host (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    p.set_defaults(fn=cmd_serve)
