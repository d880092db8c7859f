"""TorchScript: script a model that uses the ops, save, load in a fresh process, same outputs."""

import subprocess
import sys
import textwrap

import torch
from torch import nn

import customops
from customops.nn import FusedLinearSigmoid


class UsesAllOps(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = FusedLinearSigmoid(12, 16)
        self.out = nn.Linear(16, 4)

    def forward(self, x):
        h = self.hidden(x)
        h = customops.add(h, customops.sigmoid(h))
        return torch.ops.customops.fused_linear_sigmoid(h, self.out.weight, self.out.bias)


def test_script_save_load_in_fresh_process(tmp_path, device):
    torch.manual_seed(0)
    model = UsesAllOps().to(device).eval()
    scripted = torch.jit.script(model)
    x = torch.randn(37, 12, device=device)
    torch.testing.assert_close(scripted(x), model(x))
    path, inp, outp = tmp_path / "model.pt", tmp_path / "x.pt", tmp_path / "y.pt"
    scripted.save(str(path))
    torch.save(x, inp)
    script = textwrap.dedent(
        f"""
        import torch, customops
        m = torch.jit.load({str(path)!r})
        torch.save(m(torch.load({str(inp)!r})), {str(outp)!r})
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True)
    torch.testing.assert_close(torch.load(outp), model(x), rtol=0, atol=0)
    assert "customops::fused_linear_sigmoid" in scripted.graph.str() or "customops::fused_linear_sigmoid" in str(
        scripted.inlined_graph
    )
