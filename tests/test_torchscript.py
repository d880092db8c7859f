"""TorchScript: script a model that uses the ops, save, load in a fresh process, same outputs."""

import subprocess
import sys
import textwrap

import torch
from torch import nn

import customops
from customops.nn import FusedLinearSigmoid


class ThreeOpModel(nn.Module):
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
    model = ThreeOpModel().to(device).eval()
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


def test_loading_without_the_library_names_the_op(tmp_path):
    # Python cannot run our code inside a bare torch.jit.load, so torch's own message is what
    # the user sees: it names the op. customops.export.load_torchscript loads the library first.
    path = tmp_path / "model.pt"
    torch.jit.script(ThreeOpModel().eval()).save(str(path))
    bare = subprocess.run(
        [sys.executable, "-c", f"import torch; torch.jit.load({str(path)!r})"], capture_output=True, text=True
    )
    assert bare.returncode != 0
    assert "customops::" in bare.stderr, bare.stderr[-2000:]
    ours = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import torch, customops.export as e; print(e.load_torchscript({str(path)!r})(torch.randn(2, 12)).shape)",
        ],
        capture_output=True,
        text=True,
    )
    assert ours.returncode == 0 and "torch.Size([2, 4])" in ours.stdout, ours.stderr[-2000:]
