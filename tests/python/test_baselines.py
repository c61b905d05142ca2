"""The evaluation's outside baselines (flashtq.eval.baselines): the quantizers' error bounds and grids, the
trailing exact key group, and the bytes they are charged, on fresh random tensors."""
import pytest
import torch

from flashtq.eval import baselines


@pytest.mark.parametrize("bits", [2, 4])
def test_rtn_is_within_half_a_step_and_on_its_grid(bits, seed):
    x = torch.randn(2, 3, 17, 64) * 3
    y = baselines.quantize(x, bits, dim=-1)
    lo = x.amin(-1, keepdim=True).half().float()
    step = ((x.amax(-1, keepdim=True) - lo) / (2 ** bits - 1)).half().float()
    assert torch.all((y - x).abs() <= step / 2 + 1e-5 * x.abs().amax())
    levels = torch.round((y - lo) / step)
    assert torch.allclose(levels * step + lo, y, atol=1e-5)
    assert levels.min() >= 0 and levels.max() <= 2 ** bits - 1
    assert (levels.unique(dim=None).numel() > 1)


def test_constant_vectors_are_exact(seed):
    x = torch.full((1, 1, 5, 32), 0.25)
    assert torch.equal(baselines.quantize(x, 2, dim=-1), x)


def test_kivi_keys_per_channel_keep_the_partial_group_exact(seed):
    k = torch.randn(1, 2, 70, 64)
    q = baselines.keys_per_channel(k, 2)
    assert torch.equal(q[:, :, 64:], k[:, :, 64:])  # 6 trailing tokens: not a full group of 32
    assert not torch.equal(q[:, :, :64], k[:, :, :64])
    # each channel of each 32-token group has at most 4 distinct values
    g = q[0, 0, :32, 5]
    assert g.unique().numel() <= 4


def test_kivi_values_per_token_groups(seed):
    v = torch.randn(1, 1, 3, 64)
    q = baselines.values_per_token(v, 2)
    assert q[0, 0, 0, :32].unique().numel() <= 4 and q[0, 0, 0, 32:].unique().numel() <= 4


def test_bytes_and_bad_names():
    assert baselines.bytes_per_token_per_head("rtn4", 64) == 2 * (32 + 4)
    assert baselines.bytes_per_token_per_head("kivi2", 128) == 2 * (32 + 16)
    assert baselines.is_baseline("kivi4") and not baselines.is_baseline("seed")
    with pytest.raises(ValueError, match="config"):
        baselines.bytes_per_token_per_head("rtn9", 64)
