"""Multi-GPU correctness (needs 2 CUDA devices; skips otherwise): device guards, per-device
streams, mixed-device errors, threads on two GPUs, and DistributedDataParallel.

NVLink multicast stays off (NCCL_NVLS_ENABLE=0 and friends) on shared machines."""

import os
import threading

import pytest
import torch
import torch.nn.functional as F

import customops
from customops.nn import FusedLinearSigmoid

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA devices"
)

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _inputs(device, requires_grad=True):
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(33, 40, generator=g).to(device).requires_grad_(requires_grad)
    w = torch.randn(24, 40, generator=g).to(device).requires_grad_(requires_grad)
    b = torch.randn(24, generator=g).to(device).requires_grad_(requires_grad)
    return x, w, b


def _all_ops(x, w, b):
    y = customops.fused_linear_sigmoid(x, w, b)
    return customops.add(customops.sigmoid(y), y)


def _reference(x, w, b):
    y = torch.sigmoid(F.linear(x, w, b))
    return torch.sigmoid(y) + y


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("data_device,current_device", [("cuda:1", 0), ("cuda:0", 1)])
def test_output_lands_on_the_inputs_device(data_device, current_device, compiled):
    fn = torch.compile(_all_ops, fullgraph=True) if compiled else _all_ops
    x, w, b = _inputs(data_device)
    with torch.cuda.device(current_device):
        out = fn(x, w, b)
        grads = torch.autograd.grad(out.sum(), (x, w, b))
    assert out.device == torch.device(data_device)
    ref = _reference(x, w, b)
    ref_grads = torch.autograd.grad(ref.sum(), (x, w, b))
    torch.testing.assert_close(out, ref)
    for g, rg in zip(grads, ref_grads):
        assert g.device == torch.device(data_device)
        torch.testing.assert_close(g, rg)


def test_inputs_split_across_devices_raise_naming_both():
    x, w, b = _inputs("cuda:0", requires_grad=False)
    with pytest.raises(RuntimeError, match=r"weight to be on the device of x \(cuda:0\), but got cuda:1"):
        customops.fused_linear_sigmoid(x, w.to("cuda:1"), b)
    with pytest.raises(RuntimeError, match=r"b to be on the device of a \(cuda:0\), but got cuda:1"):
        customops.add(x, x.to("cuda:1"))


def test_two_threads_one_gpu_each_on_their_own_streams():
    errors = []

    def worker(device):
        try:
            stream = torch.cuda.Stream(device=device)
            with torch.cuda.device(device), torch.cuda.stream(stream):
                for i in range(200):
                    x, w, b = (t.detach() * (1 + i % 5) for t in _inputs(device, requires_grad=False))
                    out = _all_ops(x, w, b)
                    ref = _reference(x, w, b)
                    stream.synchronize()
                    torch.testing.assert_close(out, ref)
        except Exception as e:  # surfaced in the main thread
            errors.append((device, e))

    threads = [threading.Thread(target=worker, args=(f"cuda:{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def _ddp_worker(rank, world_size, port, result_dir):
    os.environ.update(MULTICAST_OFF, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("nccl", rank=rank, world_size=world_size)
    torch.cuda.set_device(rank)
    torch.manual_seed(0)
    model = torch.nn.Sequential(FusedLinearSigmoid(16, 32), FusedLinearSigmoid(32, 4)).cuda(rank)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    data = torch.randn(3, 8 * world_size, 16, generator=torch.Generator().manual_seed(1))
    target = torch.randn(3, 8 * world_size, 4, generator=torch.Generator().manual_seed(2))
    for step in range(3):
        shard = slice(rank * 8, (rank + 1) * 8)
        loss = F.mse_loss(ddp(data[step, shard].cuda(rank)), target[step, shard].cuda(rank))
        opt.zero_grad()
        loss.backward()
        opt.step()
    if rank == 0:
        torch.save({k: v.cpu() for k, v in model.state_dict().items()}, os.path.join(result_dir, "ddp.pt"))
    torch.distributed.destroy_process_group()


def test_ddp_matches_single_gpu_training(tmp_path):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in MULTICAST_OFF.items():
        os.environ.setdefault(key, value)
    mp.spawn(_ddp_worker, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    ddp_state = torch.load(tmp_path / "ddp.pt")

    # The same three steps on one GPU over the whole batch (DDP averages the two shards' grads,
    # which equals the full-batch mean-squared-error gradient).
    torch.manual_seed(0)
    model = torch.nn.Sequential(FusedLinearSigmoid(16, 32), FusedLinearSigmoid(32, 4)).cuda(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.randn(3, 16, 16, generator=torch.Generator().manual_seed(1))
    target = torch.randn(3, 16, 4, generator=torch.Generator().manual_seed(2))
    for step in range(3):
        loss = F.mse_loss(model(data[step].cuda(0)), target[step].cuda(0))
        opt.zero_grad()
        loss.backward()
        opt.step()
    for key, value in model.state_dict().items():
        torch.testing.assert_close(ddp_state[key], value.cpu(), rtol=1e-5, atol=1e-6)
