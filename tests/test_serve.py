"""Serving through Triton Inference Server: python -m customops.serve (PyTriton's tritonserver) on
loopback, a short load test checked against eager, bad requests answered with errors while the
server keeps serving, SIGTERM finishing accepted requests, startup failures as one line; the
exporter's Python-backend repository served by the same tritonserver binary."""

import concurrent.futures
import dataclasses
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import customops

pytest.importorskip("pytriton", reason="nvidia-pytriton is not installed (pip install 'customops[serve]')")
httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient is not installed")

from customops.export import export_model  # noqa: E402
from customops.serve import loadtest  # noqa: E402
from customops.serve.loadtest import Server, free_ports, metric, module_workload, run_clients  # noqa: E402
from test_export import ThreeOpModel  # noqa: E402

FEATURES = 12
MAX_BATCH = 64


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return ThreeOpModel().eval()


@pytest.fixture(scope="module")
def exported(model, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("served"))
    export_model(model, torch.randn(8, FEATURES), out, formats=("pt",), triton_max_batch_size=MAX_BATCH)
    return out


@pytest.fixture(scope="module")
def server(exported):
    s = Server(exported, "--max-queue-delay-us", "2000")
    yield s
    code, summary = s.stop()
    s.kill()
    # After every test on it, bad requests included, it still exits cleanly.
    assert code == 0 and summary["requests"] > 0, "".join(s.lines[-20:])


def infer(url, x, datatype="FP32", shape=None, name="model"):
    with httpclient.InferenceServerClient(url, network_timeout=60) as client:
        inp = httpclient.InferInput("INPUT__0", list(x.shape) if shape is None else shape, datatype)
        inp.set_data_from_numpy(x, binary_data=True)
        return client.infer(name, [inp]).as_numpy("OUTPUT__0")


def error_of(call) -> str:
    with pytest.raises(Exception) as info:  # noqa: B017 - tritonclient's InferenceServerException
        call()
    return str(info.value)


def test_load_test_matches_eager_and_batches(server, model):
    result = run_clients(
        server.url, module_workload(model, FEATURES), clients=4, requests=200, max_rows=MAX_BATCH, seed=0
    )
    assert result["errors"] == [] and len(result["latencies"]) == 200


BAD_REQUESTS = {
    "wrong feature count": (np.zeros((8, 15), np.float32), "FP32", None, "unexpected shape for input 'INPUT__0'"),
    "wrong rank": (np.zeros((FEATURES,), np.float32), "FP32", None, "unexpected shape for input 'INPUT__0'"),
    "wrong dtype": (np.zeros((8, FEATURES), np.float64), "FP64", None, "expects 'FP32'"),
    "batch above the maximum": (
        np.zeros((MAX_BATCH + 1, FEATURES), np.float32),
        "FP32",
        None,
        f"batch-size must be <= {MAX_BATCH}",
    ),
    # Triton reads a batch of 0 rows as a one-row request without its data.
    "empty batch": (np.zeros((0, FEATURES), np.float32), "FP32", None, "input byte size mismatch for input 'INPUT__0'"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_request_is_an_error_and_the_server_keeps_serving(server, model, case):
    x, datatype, shape, message = BAD_REQUESTS[case]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        # Another client's requests in flight meanwhile.
        others = pool.submit(run_clients, server.url, module_workload(model, FEATURES), 1, 20, MAX_BATCH, 1)
        assert message in error_of(lambda: infer(server.url, x, datatype, shape))
        assert others.result()["errors"] == []
    good = np.random.default_rng(0).standard_normal((5, FEATURES), dtype=np.float32)
    np.testing.assert_allclose(infer(server.url, good), model(torch.from_numpy(good)).detach().numpy(), rtol=1e-5)


def test_nan_inputs_are_served_as_the_model_computes(server, model):
    x = np.full((3, FEATURES), np.nan, np.float32)
    y = infer(server.url, x)
    assert y.shape == (3, 4) and np.isnan(y).all() and torch.isnan(model(torch.from_numpy(x))).all()


def _post(server, body: bytes):
    conn = http.client.HTTPConnection("127.0.0.1", server.http, timeout=30)
    try:
        conn.request("POST", "/v2/models/model/infer", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def test_malformed_request_bodies_are_errors(server, model):
    status, text = _post(server, b"{this is not json")
    # Triton answers a body it cannot parse with 500, and names the problem.
    assert status in (400, 500) and "failed to parse the request JSON" in json.loads(text)["error"], text
    # Valid JSON, but 24 values for a [2, 12] tensor declared as 3 rows.
    body = {"inputs": [{"name": "INPUT__0", "shape": [3, FEATURES], "datatype": "FP32", "data": [0.0] * 24}]}
    status, text = _post(server, json.dumps(body).encode())
    assert status in (400, 500) and "Shape does not match true shape of 'data'" in json.loads(text)["error"], text
    good = np.ones((2, FEATURES), np.float32)
    np.testing.assert_allclose(infer(server.url, good), model(torch.from_numpy(good)).detach().numpy(), rtol=1e-5)


def test_clients_that_disconnect_mid_request(server, model):
    head = b"POST /v2/models/model/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    # Half a body, then gone.
    with socket.create_connection(("127.0.0.1", server.http), timeout=10) as s:
        s.sendall(
            head + b"Content-Length: 100000\r\n\r\n" + b'{"inputs": [{"name": "INPUT__0", "shape": [4, 12], "data": [0.'
        )
    # A whole request, gone before the response: the server computes it and drops the answer.
    body = json.dumps(
        {"inputs": [{"name": "INPUT__0", "shape": [64, FEATURES], "datatype": "FP32", "data": [0.5] * 64 * FEATURES}]}
    ).encode()
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", server.http), timeout=10) as s:
            s.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    good = np.ones((4, FEATURES), np.float32)
    np.testing.assert_allclose(infer(server.url, good), model(torch.from_numpy(good)).detach().numpy(), rtol=1e-5)


class SkipNet(torch.nn.Module):
    """A strided deformable layer whose output, upsampled, is added to the input: H and W must be
    even, so neither size 1 nor one more row runs, and a request of odd sizes fails in the model."""

    def __init__(self):
        super().__init__()
        self.down = customops.nn.ModulatedDeformConv2d(3, 3, 3, stride=2, padding=1)

    def forward(self, x):
        return x + F.interpolate(self.down(x), scale_factor=2.0)


@pytest.fixture(scope="module")
def skipnet():
    torch.manual_seed(0)
    net = SkipNet().eval()
    torch.nn.init.normal_(net.down.conv_offset.weight, std=0.3)  # offsets and mask away from zero
    return net


@pytest.fixture(scope="module")
def skipnet_exported(skipnet, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("skipnet"))
    export_model(skipnet, torch.randn(2, 3, 8, 12), out, "skipnet", formats=("pt",), dynamic_dims=(0, 2, 3))
    return out


def check_deform_model_served(url, name, net):
    """Requests of other image sizes match eager; a batch of concurrent requests that the model
    refuses (odd sizes) each get the model's error in one line, and the server serves on."""
    rng = np.random.default_rng(1)
    for shape in ((1, 3, 8, 12), (3, 3, 16, 6)):
        x = rng.standard_normal(shape, dtype=np.float32)
        np.testing.assert_allclose(
            infer(url, x, name=name), net(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-5
        )
    bad = np.zeros((1, 3, 7, 7), np.float32)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        errors = list(pool.map(lambda _: error_of(lambda: infer(url, bad, name=name)), range(4)))
    for e in errors:
        assert "The size of tensor a (7) must match the size of tensor b (8)" in e, e
        assert "TorchScript interpreter" not in e, e
    x = rng.standard_normal((2, 3, 4, 4), dtype=np.float32)
    np.testing.assert_allclose(
        infer(url, x, name=name), net(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-5
    )


def test_deform_network_of_dynamic_image_sizes(skipnet_exported, skipnet):
    # The start-up run takes the export's example sizes: size 1 (an odd size) fails in this model.
    server = Server(skipnet_exported, "--max-queue-delay-us", "20000", name="skipnet")
    try:
        check_deform_model_served(server.url, "skipnet", skipnet)
    finally:
        code, summary = server.stop()
        server.kill()
    assert code == 0, "".join(server.lines[-20:])


def test_load_test_of_an_exported_deform_network(skipnet_exported, tmp_path, capsys):
    # Requests at the export's example sizes (8x12), each response checked against the same
    # TorchScript file run in the client's process.
    out = tmp_path / "loadtest.md"
    args = [skipnet_exported, "--name", "skipnet", "--clients", "3", "--requests", "24", "--max-rows", "4"]
    assert loadtest.main(args + ["--max-queue-delay-us", "20000", "--out", str(out)]) == 0, capsys.readouterr().out
    report = out.read_text()
    assert "skipnet.pt: INPUT__0 float32 (rows, 3, 8, 12)" in report, report
    row = next(line for line in report.splitlines() if line.startswith("| 3 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:3] == ["24", "0"], row  # requests, errors
    assert int(cells[7]) >= 1 and int(cells[8]) >= 1, row  # Triton executions, forward calls


def test_load_test_counts_wrong_outputs(server, model):
    # The same requests against a reference that differs by 1e-3: every response is counted wrong.
    good = module_workload(model, FEATURES)
    off = dataclasses.replace(good, reference=lambda xs: [y + 1e-3 for y in good.reference(xs)])
    result = run_clients(server.url, off, clients=2, requests=6, max_rows=MAX_BATCH, seed=0)
    assert len(result["errors"]) == 6 and all(e.startswith("wrong output") for e in result["errors"]), result
    assert result["latencies"] == [] and result["rows"] == 0, result  # only correct responses are timed


class OneRowEmbedding(torch.nn.Module):
    """Takes index 0 only: the start-up run (zeros) passes, the load test's indices 0..7 fail."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(1, 4)

    def forward(self, idx):
        return self.emb(idx).sum(1)


def test_load_test_of_a_model_that_refuses_every_request(tmp_path, capsys):
    out = str(tmp_path / "emb")
    export_model(OneRowEmbedding().eval(), torch.zeros(4, 5, dtype=torch.long), out, formats=("pt",))
    assert loadtest.main([out, "--clients", "2", "--requests", "6", "--max-rows", "4"]) == 1
    printed = capsys.readouterr().out
    assert "0/6 ok" in printed and "errors 6" in printed and "no forward call succeeded" in printed, printed
    assert "index out of range" in printed, printed


def test_load_test_refuses_a_missing_export_or_model(skipnet_exported, tmp_path, capsys):
    assert loadtest.main([str(tmp_path / "nowhere"), "--requests", "1"]) == 1
    assert "is not a folder of exported files" in capsys.readouterr().err
    assert loadtest.main([skipnet_exported, "--requests", "1"]) == 1  # exported as skipnet
    assert "has no model named 'model'; it has skipnet (--name)" in capsys.readouterr().err


def test_sigterm_finishes_accepted_requests_and_reports_batches(exported, model):
    # A long queue delay keeps the requests waiting in Triton's batcher when SIGTERM comes.
    server = Server(exported, "--max-queue-delay-us", "5000000")
    try:
        rng = np.random.default_rng(0)
        xs = [rng.standard_normal((n, FEATURES), dtype=np.float32) for n in (3, 5, 7, 9)]
        with concurrent.futures.ThreadPoolExecutor(len(xs)) as pool:
            futures = [pool.submit(infer, server.url, x) for x in xs]
            deadline = time.monotonic() + 20
            while metric(server.metrics_text(), "nv_inference_pending_request_count") < len(xs):
                assert time.monotonic() < deadline, "the requests did not reach the server's queue"
                time.sleep(0.05)
            code, summary = server.stop()
            outs = [f.result(timeout=60) for f in futures]
    finally:
        server.kill()
    assert code == 0, "".join(server.lines[-20:])
    for x, y in zip(xs, outs):
        np.testing.assert_allclose(y, model(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6)
    # The four requests came in one batch of 24 rows: Triton's dynamic batcher formed it.
    assert summary["requests"] == 4 and summary["rows_per_call"] == {"24": 1}, summary


def _serve_cli(*args):
    return subprocess.run([sys.executable, "-m", "customops.serve", *args], capture_output=True, text=True, timeout=300)


def _op_missing_export(model, tmp_path):
    """A TorchScript file that calls customops::sigmoid_v0, an op this library lacks (as a
    model exported with another build of customops would)."""
    import zipfile

    out = tmp_path / "lacking"
    export_model(model, torch.randn(8, FEATURES), str(out), formats=("pt",))
    src, dst = out / "model.pt", out / "patched.pt"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename.endswith(".py"):
                data = data.replace(b"ops.customops.sigmoid(", b"ops.customops.sigmoid_v0(")
            zout.writestr(item, data)
    os.replace(dst, src)
    return str(out)


@pytest.mark.parametrize("case", ["no folder", "no config", "missing model", "corrupt model", "op missing"])
def test_startup_failure_is_one_line_and_exit_1(exported, model, tmp_path, case):
    if case == "no folder":
        target, expect = str(tmp_path / "nowhere"), "is not a folder of exported files"
    elif case == "no config":
        target, expect = str(tmp_path), "config.pbtxt is missing"
        (tmp_path / "model.pt").write_bytes(b"")
    else:
        target = str(tmp_path / "copy")
        shutil.copytree(exported, target)
        if case == "missing model":
            os.remove(os.path.join(target, "model.pt"))
            expect = "neither model.pt nor model.pt2 is in"
        elif case == "corrupt model":
            with open(os.path.join(target, "model.pt"), "wb") as f:
                f.write(b"not a TorchScript archive")
            expect = "could not load TorchScript model"
        else:
            target, expect = _op_missing_export(model, tmp_path), "sigmoid_v0"
    out = _serve_cli(target, "--port", str(free_ports(1)[0]))
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(lines) == 1 and lines[0].startswith("customops.serve: error: "), out.stderr
    assert expect in lines[0] and "Traceback" not in out.stderr, out.stderr


def test_python_backend_repository_in_tritonserver(exported, model, skipnet_exported, skipnet, tmp_path):
    """The exporter's triton/python repositories, served by tritonserver itself (PyTriton's binary,
    with its Python backend) and their model.py running customops' loader inside the stub: a
    batched model of fixed sizes, and a deform network of dynamic image sizes whose errors, a
    batch of them at once too, come back as error responses."""
    from pytriton.utils.distribution import get_libs_path, get_root_module_path, get_stub_path

    dist = get_root_module_path() / "tritonserver"
    backends = tmp_path / "backends" / "python"
    backends.mkdir(parents=True)
    for f in (dist / "backends" / "python").iterdir():
        if f.is_file():
            os.symlink(f, backends / f.name)
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    shutil.copy(get_stub_path(version), backends / "triton_python_backend_stub")
    repository = tmp_path / "repository"
    for folder, name in ((exported, "model"), (skipnet_exported, "skipnet")):
        shutil.copytree(os.path.join(folder, "triton", "python", name), repository / name)
    http_port, grpc_port, metrics_port = free_ports(3)
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join([sysconfig.get_config_var("LIBDIR"), str(get_libs_path())])
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]  # the stub's Python finds this venv
    cmd = [
        str(dist / "bin" / "tritonserver"),
        f"--model-repository={repository}",
        f"--backend-directory={tmp_path / 'backends'}",
        "--http-address=127.0.0.1",
        f"--http-port={http_port}",
        "--grpc-address=127.0.0.1",
        f"--grpc-port={grpc_port}",
        "--metrics-address=127.0.0.1",
        f"--metrics-port={metrics_port}",
        "--exit-on-error=true",
    ]
    log = open(tmp_path / "tritonserver.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"127.0.0.1:{http_port}"
    try:
        deadline = time.monotonic() + 120
        with httpclient.InferenceServerClient(url) as client:
            while True:
                assert proc.poll() is None, (tmp_path / "tritonserver.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "tritonserver did not load the model in 120 s"
                try:
                    if client.is_model_ready("model") and client.is_model_ready("skipnet"):
                        break
                except Exception:  # noqa: BLE001 - not listening yet
                    pass
                time.sleep(0.5)
        x = np.random.default_rng(0).standard_normal((6, FEATURES), dtype=np.float32)
        np.testing.assert_allclose(infer(url, x), model(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6)
        assert "unexpected shape" in error_of(lambda: infer(url, np.zeros((2, 5), np.float32)))
        result = run_clients(url, module_workload(model, FEATURES), clients=4, requests=40, max_rows=MAX_BATCH, seed=3)
        assert result["errors"] == []
        check_deform_model_served(url, "skipnet", skipnet)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    assert proc.returncode == 0, (tmp_path / "tritonserver.log").read_text()[-3000:]


def test_libpython_path_comes_first():
    from customops.serve import use_this_interpreters_libpython

    env = {"LD_LIBRARY_PATH": "/a:" + sysconfig.get_config_var("LIBDIR") + ":/b"}
    use_this_interpreters_libpython(env)
    assert env["LD_LIBRARY_PATH"].split(":") == [sysconfig.get_config_var("LIBDIR"), "/a", "/b"]


def test_numpy_2_is_refused_with_one_line(monkeypatch, capsys, exported):
    import numpy

    from customops.serve.__main__ import main

    monkeypatch.setattr(numpy, "__version__", "2.4.6")
    assert main([exported]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "numpy 2.4.6 is installed" in err[0] and "numpy<2" in err[0], err
