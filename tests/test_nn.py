import pytest
import torch
from torch import nn

from customops.nn import FusedLinearSigmoid, fuse_linear_sigmoid


def test_module_matches_linear_sigmoid_and_shares_state_dict_keys(device):
    linear = nn.Linear(16, 8).to(device)
    fused = FusedLinearSigmoid(16, 8, device=device)
    assert set(fused.state_dict()) == set(linear.state_dict()) == {"weight", "bias"}
    fused.load_state_dict(linear.state_dict())
    x = torch.randn(5, 16, device=device)
    torch.testing.assert_close(fused(x), torch.sigmoid(linear(x)))
    assert fused.weight.shape == (8, 16) and fused.bias.shape == (8,)
    assert "in_features=16, out_features=8, bias=True" in repr(fused)


def test_no_bias(device):
    fused = FusedLinearSigmoid(4, 3, bias=False, device=device)
    assert fused.bias is None and set(fused.state_dict()) == {"weight"}
    x = torch.randn(2, 4, device=device)
    torch.testing.assert_close(fused(x), torch.sigmoid(x @ fused.weight.T))


def test_initialization_follows_linear():
    torch.manual_seed(3)
    linear = nn.Linear(32, 8)
    torch.manual_seed(3)
    fused = FusedLinearSigmoid(32, 8)
    assert torch.equal(linear.weight, fused.weight) and torch.equal(linear.bias, fused.bias)


def test_from_linear_shares_parameters():
    linear = nn.Linear(6, 2, bias=False)
    fused = FusedLinearSigmoid.from_linear(linear)
    assert fused.weight is linear.weight and fused.bias is None
    x = torch.randn(3, 6)
    torch.testing.assert_close(fused(x), torch.sigmoid(linear(x)))


def test_fuse_helper_replaces_linear_sigmoid_pairs_at_any_depth():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(10, 20),
        nn.Sigmoid(),
        nn.Linear(20, 20),
        nn.ReLU(),  # not followed by Sigmoid: kept
        nn.Sequential(nn.Linear(20, 5), nn.Sigmoid()),
    )
    x = torch.randn(7, 10)
    before, keys_before = model(x), set(model.state_dict())
    assert fuse_linear_sigmoid(model) == 2
    assert isinstance(model[0], FusedLinearSigmoid) and isinstance(model[1], nn.Identity)
    assert type(model[2]) is nn.Linear
    assert isinstance(model[4][0], FusedLinearSigmoid)
    assert set(model.state_dict()) == keys_before
    torch.testing.assert_close(model(x), before)
    assert fuse_linear_sigmoid(model) == 0  # idempotent


def test_module_trains(device):
    torch.manual_seed(0)
    model = nn.Sequential(FusedLinearSigmoid(4, 16), nn.Linear(16, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    x = torch.randn(256, 4, device=device)
    y = (x[:, :1] > 0).float()
    losses = []
    for _ in range(100):
        loss = nn.functional.binary_cross_entropy_with_logits(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_from_linear_rejects_parametrized_linear():
    linear = torch.nn.utils.parametrizations.weight_norm(nn.Linear(5, 3))
    with pytest.raises(ValueError, match="parametrized"):
        FusedLinearSigmoid.from_linear(linear)
    model = nn.Sequential(linear, nn.Sigmoid())
    assert fuse_linear_sigmoid(model) == 0


def test_fuse_helper_keeps_pairs_with_hooks():
    model = nn.Sequential(nn.Linear(4, 3), nn.Sigmoid(), nn.Linear(3, 3), nn.Sigmoid())
    model[1].register_forward_hook(lambda m, inp, out: out * 2)
    x = torch.randn(2, 4)
    before = model(x)
    assert fuse_linear_sigmoid(model) == 1  # only the second pair, which has no hooks
    assert type(model[0]) is nn.Linear and isinstance(model[2], FusedLinearSigmoid)
    torch.testing.assert_close(model(x), before)
    model = nn.Sequential(nn.Linear(4, 3), nn.Sigmoid(), nn.Linear(3, 3), nn.Sigmoid())
    model[0].register_full_backward_hook(lambda m, grad_in, grad_out: None)
    model[3].register_full_backward_pre_hook(lambda m, grad_out: None)
    assert fuse_linear_sigmoid(model) == 0
