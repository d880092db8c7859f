"""Serve a model exported by customops.export with Triton Inference Server (through PyTriton).

    python -m customops.serve exported/ [--port 8000] [--grpc-port 8001] [--metrics-port 8002] \\
        [--host 127.0.0.1] [--name model] [--format auto|pt|pt2] [--device cpu|cuda] \\
        [--max-batch N] [--max-queue-delay-us 1000] [--instances 1] [--drain-timeout 30]

Clients call model NAME (default ``model``) over HTTP or gRPC with inputs ``INPUT__0``, ... and
get ``OUTPUT__0``, ...; the first dimension is the batch. SIGINT or SIGTERM stops the server
after the requests it accepted (up to --drain-timeout seconds), then prints the batches that
Triton formed as one ``customops.serve: batches {json}`` line.
"""

import argparse
import json
import os
import signal
import sys
import tempfile
import threading


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m customops.serve", description=__doc__.splitlines()[0])
    parser.add_argument("exported", help="the folder that python -m customops.export wrote (--out)")
    parser.add_argument("--name", default="model", help="the exported model's name (--name of the export)")
    parser.add_argument("--format", default="auto", choices=["auto", "pt", "pt2"], help="auto: pt where it exists")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000, help="HTTP port")
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002, help="Prometheus metrics (/metrics)")
    parser.add_argument("--max-batch", type=int, help="most rows per request and per batch (default: the config's)")
    parser.add_argument("--max-queue-delay-us", type=int, default=1000, help="how long a batch waits for more requests")
    parser.add_argument("--instances", type=int, default=1, help="model instances (threads running batches)")
    parser.add_argument("--drain-timeout", type=int, default=30, help="seconds to finish accepted requests on exit")
    parser.add_argument("--verbose", action="store_true", help="print tritonserver's log (else it goes to a file)")
    args = parser.parse_args(argv)

    def fail(message: str) -> int:
        print(f"customops.serve: error: {message}", file=sys.stderr)
        return 1

    try:
        import pytriton  # noqa: F401
    except ImportError:
        return fail("serving needs PyTriton: pip install 'customops[serve]' (or nvidia-pytriton)")
    import numpy

    if int(numpy.__version__.split(".")[0]) >= 2:
        # Seen with PyTriton 0.5.7 and 0.7.0: every response came back empty.
        return fail(
            f"numpy {numpy.__version__} is installed, with which PyTriton answers every request with an empty "
            "output; install numpy<2 (pip install 'customops[serve]' brings PyTriton 0.7, which pins it)"
        )
    import torch

    from . import BatchStats, ServeError, bind, load_served_model, use_this_interpreters_libpython

    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        return fail(f"--device {args.device}: no CUDA device is available")
    if args.max_queue_delay_us < 0 or args.instances < 1:
        return fail("--max-queue-delay-us must be >= 0 and --instances >= 1")
    try:
        served = load_served_model(args.exported, args.name, args.format, args.device)
    except ServeError as e:
        return fail(str(e))
    max_batch = served.max_batch_size if args.max_batch is None else args.max_batch
    if max_batch < 1:
        return fail(f"--max-batch must be >= 1 (the exported config has {served.max_batch_size}), got {max_batch}")

    from pytriton.triton import Triton, TritonConfig

    use_this_interpreters_libpython()
    # tritonserver's own log goes to a file unless --verbose; a failure names the file.
    log_fd, log_path = (
        (None, None) if args.verbose else tempfile.mkstemp(prefix="customops-tritonserver-", suffix=".log")
    )
    if log_fd is not None:
        os.close(log_fd)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    config = TritonConfig(
        http_address=args.host,
        http_port=args.port,
        grpc_address=args.host,
        grpc_port=args.grpc_port,
        metrics_address=args.host,
        metrics_port=args.metrics_port,
        exit_timeout_secs=args.drain_timeout,
        log_verbose=1 if args.verbose else None,
        log_file=log_path,
    )
    stats = BatchStats()
    triton = Triton(config=config)
    try:
        bind(triton, served, max_batch, args.max_queue_delay_us, stats, args.instances)
        triton.run()
        print(
            f"customops.serve: serving {served.path} as model {served.name!r} on http://{args.host}:{args.port} "
            f"(gRPC {args.grpc_port}, metrics {args.metrics_port}), max batch {max_batch}, "
            f"queue delay {args.max_queue_delay_us} us, {args.device}",
            flush=True,
        )
        while not stop.wait(0.5):
            if not triton.is_alive():
                return fail(f"tritonserver exited (its log: {log_path or 'above'})")
    except Exception as e:  # noqa: BLE001 - PyTriton raises several types when the server cannot start
        return fail(f"the server did not start: {type(e).__name__}: {e} (tritonserver's log: {log_path or 'above'})")
    finally:
        triton.stop()  # tritonserver finishes the accepted requests first (exit_timeout_secs)
    if log_path:
        os.remove(log_path)
    print("customops.serve: batches " + json.dumps(stats.summary()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
