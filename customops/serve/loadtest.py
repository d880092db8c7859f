"""A bounded load test of ``python -m customops.serve`` on loopback.

    python -m customops.serve.loadtest [--clients 1 4 16] [--requests 400] [--max-rows 64] \\
        [--max-batch 256] [--max-queue-delay-us 2000] [--device cpu] [--seed 0] [--out results.md]

Exports a model of customops' ops (the main job's MLP: FusedLinearSigmoid 64->128->64, then
nn.Linear to 10, seeded weights) to TorchScript in a temporary folder, and for each client count
K starts the server on free loopback ports, sends ``--requests`` requests from K concurrent
clients (tritonclient over HTTP; each request 1..``--max-rows`` rows of seeded random input),
checks every response against the eager model, reads Triton's metrics, stops the server with
SIGTERM and prints, per K: throughput, p50/p99 latency, errors (a failed request or a wrong
output; the exit status is 1 if any) and the batches that Triton formed (requests and rows per
forward call, as the server counted them).
"""

import argparse
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
from typing import Dict, List

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


def run_clients(
    url: str, model: nn.Module, clients: int, requests: int, max_rows: int, seed: int, features: int = IN_FEATURES
) -> Dict:
    """Sends ``requests`` requests of (1..max_rows, features) float32 inputs to model ``model`` at
    ``url`` from ``clients`` threads, each output checked against eager ``model``; returns
    ``seconds``, ``latencies`` (s, of the correct responses), ``errors`` (messages), ``rows``."""
    import tritonclient.http as httpclient

    latencies, errors, rows = [], [], [0]
    lock = threading.Lock()
    counts = [requests // clients + (1 if i < requests % clients else 0) for i in range(clients)]

    def client(i: int):
        rng = np.random.default_rng(seed + i)
        conn = httpclient.InferenceServerClient(url, connection_timeout=60, network_timeout=120)
        try:
            for _ in range(counts[i]):
                x = rng.standard_normal((int(rng.integers(1, max_rows + 1)), features), dtype=np.float32)
                inp = httpclient.InferInput("INPUT__0", list(x.shape), "FP32")
                inp.set_data_from_numpy(x, binary_data=True)
                start = time.perf_counter()
                try:
                    y = conn.infer("model", [inp]).as_numpy("OUTPUT__0")
                except Exception as e:  # noqa: BLE001 - every failure is counted, by its message
                    with lock:
                        errors.append(f"{type(e).__name__}: {e}")
                    continue
                elapsed = time.perf_counter() - start
                with torch.no_grad():
                    ref = model(torch.from_numpy(x)).numpy()
                ok = y is not None and y.shape == ref.shape and np.allclose(y, ref, rtol=1e-4, atol=1e-5)
                with lock:
                    latencies.append(elapsed)
                    rows[0] += x.shape[0]
                    if not ok:
                        errors.append(f"wrong output for a batch of {x.shape[0]} rows")
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
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


def run_level(exported: str, model: nn.Module, clients: int, args) -> Dict:
    extra = ["--max-batch", str(args.max_batch), "--max-queue-delay-us", str(args.max_queue_delay_us)]
    server = Server(exported, *extra, "--device", args.device)
    try:
        before = server.metrics_text()
        result = run_clients(server.url, model, clients, args.requests, args.max_rows, args.seed)
        after = server.metrics_text()
    except BaseException:
        server.kill()
        raise
    code, summary = server.stop()
    lat = [s * 1e3 for s in result["latencies"]]
    executions = metric(after, "nv_inference_exec_count") - metric(before, "nv_inference_exec_count")
    served = metric(after, "nv_inference_request_success") - metric(before, "nv_inference_request_success")
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
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--requests", type=int, default=400, help="requests per client count, over all clients")
    parser.add_argument("--max-rows", type=int, default=64, help="rows per request: uniform in 1..max-rows")
    parser.add_argument("--max-batch", type=int, default=256)
    parser.add_argument("--max-queue-delay-us", type=int, default=2000)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="also write the results as markdown here")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.requests > 100_000 or min(args.clients) < 1 or max(args.clients) > 256:
        parser.error("--requests must be 1..100000 and --clients 1..256 each (the test is bounded)")
    if not 1 <= args.max_rows <= args.max_batch:
        parser.error(f"--max-rows must be 1..--max-batch ({args.max_batch})")

    import customops
    from customops.export import export_model

    model = make_model()
    results = []
    with tempfile.TemporaryDirectory(prefix="customops-loadtest-") as exported:
        export_model(
            model, torch.randn(8, IN_FEATURES), exported, formats=("pt",), triton_max_batch_size=args.max_batch
        )
        for k in args.clients:
            r = run_level(exported, model, k, args)
            results.append(r)
            print(
                f"clients {k}: {r['ok']}/{r['requests']} ok, {r['ok'] / r['seconds']:.1f} req/s, "
                f"{r['rows'] / r['seconds']:.0f} rows/s, p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, "
                f"errors {r['errors']}; Triton: {r['triton_requests']:.0f} requests in "
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
        f"at the end {load} (the clients and their eager checks share the cores with the server)\n"
        f"- torch {torch.__version__}, customops {customops.__version__}, device {args.device}\n"
        f"- command: `python -m customops.serve.loadtest {' '.join(argv if argv is not None else sys.argv[1:])}`\n"
        f"- model: FusedLinearSigmoid 64->128, FusedLinearSigmoid 128->64, Linear 64->10 (TorchScript), "
        f"max batch {args.max_batch} rows, queue delay {args.max_queue_delay_us} us; requests of 1..{args.max_rows} "
        "rows, every output checked against eager\n\n"
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
            f"{s['requests'] / max(1, s['forward_calls']):.2f} ({max(int(k) for k in s['requests_per_call'])}) | "
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
