"""A bounded load test of ``python -m customops.serve`` on loopback.

    python -m customops.serve.loadtest [EXPORTED [--name model] [--format auto|pt|pt2]] \\
        [--clients 1 4 16] [--requests 400] [--max-rows 64] [--max-batch N] \\
        [--max-queue-delay-us 2000] [--device cpu] [--seed 0] [--out results.md]

With ``EXPORTED`` (a folder that ``python -m customops.export`` wrote), it serves that model;
each request is 1..``--max-rows`` rows at the export's example sizes, of seeded random values (floating inputs standard
normal, integers 0..7, booleans either), and each response is checked against the same model
file run in this process on that request alone. Without it, it serves the main job's MLP
(FusedLinearSigmoid 64->128->64, then nn.Linear to 10, seeded weights), exported to TorchScript
in a temporary folder, and checks against eager.

For each client count K it starts the server on free loopback ports, sends ``--requests``
requests from K concurrent clients (tritonclient over HTTP), reads Triton's metrics, stops the
server with SIGTERM and prints, per K: throughput, p50/p99 latency, errors (a failed request or
a wrong output; the exit status is 1 if any) and the batches that Triton formed (requests and
rows per forward call, as the server counted them).
"""

import argparse
import dataclasses
import datetime
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import nn

IN_FEATURES = 64


def make_model() -> nn.Module:
    from customops.nn import FusedLinearSigmoid

    torch.manual_seed(0)
    return nn.Sequential(FusedLinearSigmoid(IN_FEATURES, 128), FusedLinearSigmoid(128, 64), nn.Linear(64, 10)).eval()


def free_ports(n: int) -> List[int]:
    """n distinct free TCP ports on 127.0.0.1 (bound, read, released)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class Server:
    """``python -m customops.serve`` in a subprocess on loopback ports; ``stop()`` sends SIGTERM and
    returns (exit status, the batch summary the server printed)."""

    def __init__(self, exported: str, *extra: str, name: str = "model", startup_timeout: float = 180.0):
        self.http, self.grpc, self.metrics = free_ports(3)
        self.name = name
        cmd = [sys.executable, "-m", "customops.serve", exported, "--name", name, "--host", "127.0.0.1"]
        cmd += ["--port", str(self.http)]
        cmd += ["--grpc-port", str(self.grpc), "--metrics-port", str(self.metrics), *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: List[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.url = f"127.0.0.1:{self.http}"
        deadline = time.monotonic() + startup_timeout
        while not self.ready():
            if self.proc.poll() is not None:
                self._reader.join(5)
                raise RuntimeError(f"the server exited with {self.proc.returncode}:\n" + "".join(self.lines[-30:]))
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(
                    f"the server was not ready within {startup_timeout} s:\n" + "".join(self.lines[-30:])
                )
            time.sleep(0.3)

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.url}/v2/models/{self.name}/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics}/metrics", timeout=10) as r:
            return r.read().decode()

    def stop(self, timeout: float = 60.0):
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            code = None
        self._reader.join(10)
        summary = None
        for line in self.lines:
            if line.startswith("customops.serve: batches "):
                summary = json.loads(line.split(" ", 2)[2])
        return code, summary

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def metric(text: str, name: str, model: str = "model") -> float:
    """The value of Prometheus metric ``name`` for ``model`` (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(name + "{") and f'model="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@dataclasses.dataclass
class Workload:
    """What the clients send to model ``name`` and how each response is checked: per input its
    name, numpy dtype and shape without the batch dim; ``reference`` maps a request's arrays to
    the expected outputs (``outputs``, in order). The first dim of each is the batch, of at most
    ``max_batch`` rows (the exported config's; None: the load test's own export decides)."""

    name: str
    inputs: List[Tuple[str, np.dtype, Tuple[int, ...]]]
    outputs: List[str]
    reference: Callable[[List[np.ndarray]], List[np.ndarray]]
    description: str = ""
    max_batch: Optional[int] = None

    def request(self, rng: np.random.Generator, max_rows: int) -> List[np.ndarray]:
        rows = int(rng.integers(1, max_rows + 1))
        return [_random_array(rng, dtype, (rows,) + shape) for _, dtype, shape in self.inputs]


def _random_array(rng: np.random.Generator, dtype: np.dtype, shape: Tuple[int, ...]) -> np.ndarray:
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(0, 8, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _close(y: np.ndarray, ref: np.ndarray) -> bool:
    """Whether a served output matches the reference's: within 1e-4 (float32; 1e-2 in 16 bits,
    1e-9 in float64; exact otherwise), as batching changes the kernels' order of summation."""
    if y is None or y.shape != ref.shape:
        return False
    if not np.issubdtype(ref.dtype, np.floating):
        return bool(np.array_equal(y, ref))
    rtol = {2: 1e-2, 4: 1e-4}.get(ref.dtype.itemsize, 1e-9)
    return bool(np.allclose(y, ref, rtol=rtol, atol=rtol / 10, equal_nan=True))


def module_workload(model: nn.Module, features: int = IN_FEATURES, name: str = "model") -> Workload:
    """Requests of (rows, features) float32 to a model exported from ``model``, checked against eager."""

    def reference(xs):
        with torch.no_grad():
            return [model(torch.from_numpy(xs[0])).numpy()]

    return Workload(name, [("INPUT__0", np.dtype(np.float32), (features,))], ["OUTPUT__0"], reference)


def exported_workload(exported: str, name: str = "model", fmt: str = "auto", device: str = "cpu") -> Workload:
    """Requests to the model that customops.export wrote to ``exported``, at its example sizes,
    checked against the same model file loaded here (customops.serve's loader). Raises ServeError."""
    from customops.export._common import _dtype_name

    from . import ServeError, _call, load_served_model

    served = load_served_model(exported, name, fmt, device)
    if served.max_batch_size < 1:
        raise ServeError(f"{served.path}: its config does not batch (max_batch_size 0), and customops.serve batches")
    inputs = [
        (t.name, np.dtype(_dtype_name(t.dtype)), tuple(shape[1:]))
        for t, shape in zip(served.inputs, served.example_shapes)
    ]

    def reference(xs):
        return [o.cpu().numpy() for o in _call(served, [torch.from_numpy(x) for x in xs])]

    sizes = ", ".join(f"{n} {d} (rows, {', '.join(map(str, s))})" for n, d, s in inputs)
    outputs = [t.name for t in served.outputs]
    return Workload(name, inputs, outputs, reference, f"{served.path}: {sizes}", served.max_batch_size)


def run_clients(url: str, workload: Workload, clients: int, requests: int, max_rows: int, seed: int) -> Dict:
    """Sends ``requests`` requests of ``workload`` (1..max_rows rows each) to ``url`` from
    ``clients`` threads, each response checked against the workload's reference; returns
    ``seconds``, ``latencies`` (s, of the correct responses), ``errors`` (messages), ``rows``."""
    import tritonclient.http as httpclient
    from tritonclient.utils import np_to_triton_dtype

    latencies, errors, rows = [], [], [0]
    lock = threading.Lock()
    counts = [requests // clients + (1 if i < requests % clients else 0) for i in range(clients)]

    def client(i: int):
        rng = np.random.default_rng(seed + i)
        conn = httpclient.InferenceServerClient(url, connection_timeout=60, network_timeout=120)
        try:
            for _ in range(counts[i]):
                xs = workload.request(rng, max_rows)
                inputs = []
                for (input_name, _, _), x in zip(workload.inputs, xs):
                    inp = httpclient.InferInput(input_name, list(x.shape), np_to_triton_dtype(x.dtype))
                    inp.set_data_from_numpy(x, binary_data=True)
                    inputs.append(inp)
                start = time.perf_counter()
                try:
                    result = conn.infer(workload.name, inputs)
                except Exception as e:  # noqa: BLE001 - every failure is counted, by its message
                    with lock:
                        errors.append(f"{type(e).__name__}: {e}")
                    continue
                elapsed = time.perf_counter() - start
                ys = [result.as_numpy(n) for n in workload.outputs]
                ok = all(_close(y, ref) for y, ref in zip(ys, workload.reference(xs)))
                n = xs[0].shape[0]
                with lock:
                    if ok:
                        latencies.append(elapsed)
                        rows[0] += n
                    else:
                        errors.append(f"wrong output for a request of {n} rows")
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"seconds": time.perf_counter() - start, "latencies": latencies, "errors": errors, "rows": rows[0]}


def percentile(values: List[float], q: float) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def run_level(exported: str, workload: Workload, clients: int, args) -> Dict:
    extra = ["--max-queue-delay-us", str(args.max_queue_delay_us), "--device", args.device, "--format", args.format]
    if args.max_batch is not None:
        extra += ["--max-batch", str(args.max_batch)]
    server = Server(exported, *extra, name=workload.name)
    try:
        before = server.metrics_text()
        result = run_clients(server.url, workload, clients, args.requests, args.max_rows, args.seed)
        after = server.metrics_text()
    except BaseException:  # Ctrl-C too: SIGTERM first, so that customops.serve stops its tritonserver
        server.stop(timeout=15)  # then SIGKILL
        raise
    code, summary = server.stop()
    lat = [s * 1e3 for s in result["latencies"]]
    count = lambda name: metric(after, name, workload.name) - metric(before, name, workload.name)  # noqa: E731
    executions, served = count("nv_inference_exec_count"), count("nv_inference_request_success")
    return {
        "clients": clients,
        "requests": args.requests,
        "ok": len(lat),
        "rows": result["rows"],
        "seconds": result["seconds"],
        "p50_ms": percentile(lat, 50),
        "p99_ms": percentile(lat, 99),
        "mean_ms": statistics.fmean(lat) if lat else float("nan"),
        "errors": len(result["errors"]) + (0 if code == 0 else 1),
        "error_messages": sorted(set(result["errors"]))[:5] + ([] if code == 0 else [f"server exit status {code}"]),
        "triton_executions": executions,
        "triton_requests": served,
        "server_batches": summary,
    }


def describe_batches(summary) -> str:
    if not summary:
        return "(the server printed no summary)"
    if not summary["forward_calls"]:
        return "no forward call succeeded"
    rows = summary["rows_per_call"]
    reqs = summary["requests_per_call"]
    sizes = sorted(int(k) for k in rows)
    multi = sum(v for k, v in reqs.items() if int(k) > 1)
    return (
        f"{summary['forward_calls']} calls; rows/call {sizes[0]}..{sizes[-1]} (median "
        f"{statistics.median([int(k) for k, v in rows.items() for _ in range(v)]):.0f}); "
        f"requests/call max {max(int(k) for k in reqs)}, {multi} calls of >1 request"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m customops.serve.loadtest", description=__doc__.splitlines()[0])
    parser.add_argument("exported", nargs="?", help="a folder that python -m customops.export wrote (default: the MLP)")
    parser.add_argument("--name", default="model", help="the exported model's name (--name of the export)")
    parser.add_argument("--format", default="auto", choices=["auto", "pt", "pt2"], help="auto: pt where it exists")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--requests", type=int, default=400, help="requests per client count, over all clients")
    parser.add_argument("--max-rows", type=int, default=64, help="rows per request: uniform in 1..max-rows")
    parser.add_argument(
        "--max-batch", type=int, help="the server's --max-batch (default: 256 for the MLP, else the config's)"
    )
    parser.add_argument("--max-queue-delay-us", type=int, default=2000)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="also write the results as markdown here")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.requests > 100_000 or min(args.clients) < 1 or max(args.clients) > 256:
        parser.error("--requests must be 1..100000 and --clients 1..256 each (the test is bounded)")
    if args.max_batch is not None and args.max_batch < 1:
        parser.error(f"--max-batch must be >= 1, got {args.max_batch}")
    if args.max_queue_delay_us < 0:
        parser.error(f"--max-queue-delay-us must be >= 0, got {args.max_queue_delay_us}")
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        print(f"customops.serve.loadtest: error: --device {args.device}: no CUDA device is available", file=sys.stderr)
        return 1

    import customops
    from customops.export import export_model

    from . import ServeError

    with tempfile.TemporaryDirectory(prefix="customops-loadtest-") as tmp:
        if args.exported is None:
            args.max_batch = 256 if args.max_batch is None else args.max_batch
            model = make_model()
            exported = tmp
            export_model(model, torch.randn(8, IN_FEATURES), tmp, formats=("pt",), triton_max_batch_size=args.max_batch)
            workload = module_workload(model)
            workload.description = (
                "FusedLinearSigmoid 64->128, FusedLinearSigmoid 128->64, Linear 64->10 (TorchScript), checked against "
                "eager"
            )
        else:
            exported = args.exported
            try:
                workload = exported_workload(exported, args.name, args.format, args.device)
            except ServeError as e:
                print(f"customops.serve.loadtest: error: {e}", file=sys.stderr)
                return 1
            workload.description += ", checked against the same file run here on each request alone"
        max_batch = args.max_batch if args.max_batch is not None else workload.max_batch
        if not 1 <= args.max_rows <= max_batch:
            parser.error(f"--max-rows must be 1..{max_batch} (the server's max batch)")
        results = []
        for k in args.clients:
            try:
                r = run_level(exported, workload, k, args)
            except RuntimeError as e:  # the server did not start: its own message, one line each
                print(f"customops.serve.loadtest: error: {e}", file=sys.stderr)
                return 1
            results.append(r)
            print(
                f"clients {k}: {r['ok']}/{r['requests']} ok, {r['ok'] / r['seconds']:.1f} req/s, "
                f"{r['rows'] / r['seconds']:.0f} rows/s, p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, "
                f"errors {r['errors']}; Triton: {r['triton_requests']:.0f} successful requests in "
                f"{r['triton_executions']:.0f} executions; batches: {describe_batches(r['server_batches'])}",
                flush=True,
            )
            for m in r["error_messages"]:
                print(f"  error: {m}")
    cpu = _cpu_name()
    load = " ".join(f"{v:.1f}" for v in os.getloadavg())
    header = (
        f"# customops.serve load test\n\n"
        f"- date: {datetime.date.today().isoformat()}\n"
        f"- machine: {cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}; load average "
        f"at the end {load} (the clients and their checks share the cores with the server)\n"
        f"- torch {torch.__version__}, customops {customops.__version__}, device {args.device}\n"
        f"- command: `python -m customops.serve.loadtest {' '.join(argv if argv is not None else sys.argv[1:])}`\n"
        f"- model: {workload.description}; max batch {max_batch} rows, queue delay {args.max_queue_delay_us} us; "
        f"requests of 1..{args.max_rows} rows\n\n"
    )
    table = [
        "| clients | requests | errors | req/s | rows/s | p50 ms | p99 ms | Triton executions (metrics) | "
        "forward calls | requests per call (max) | rows per call (median, max) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        s = r["server_batches"] or {"forward_calls": 0, "requests_per_call": {"0": 0}, "rows_per_call": {"0": 0}}
        row_sizes = [int(k) for k, v in s["rows_per_call"].items() for _ in range(v)]
        table.append(
            f"| {r['clients']} | {r['requests']} | {r['errors']} | {r['ok'] / r['seconds']:.1f} | "
            f"{r['rows'] / r['seconds']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['triton_executions']:.0f} | "
            f"{s['forward_calls']} | "
            f"{s['requests'] / max(1, s['forward_calls']):.2f} ({max(map(int, s['requests_per_call']), default=0)}) | "
            f"{statistics.median(row_sizes) if row_sizes else 0:.0f}, {max(row_sizes) if row_sizes else 0} |"
        )
    text = header + "\n".join(table) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)
    return 0 if all(r["errors"] == 0 for r in results) else 1


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"model name\s*:\s*(.+)", f.read())
            return m.group(1).strip() if m else platform.processor()
    except OSError:
        return platform.processor()


if __name__ == "__main__":
    sys.exit(main())
