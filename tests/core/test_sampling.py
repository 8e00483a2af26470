"""The processed law: normalization, truncation, greedy point mass, inverse CDF."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specpair.sampling import (
    SamplingParams,
    process_logits,
    sample_from_weights,
    truncated_law,
)


def _logits(seed, b, v, scale=3.0):
    return torch.randn(b, v, generator=torch.Generator().manual_seed(seed)) * scale


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    v=st.integers(2, 300),
    temp=st.sampled_from([0.0, 0.3, 0.6, 1.0, 1.7]),
    top_k=st.integers(0, 40),
    top_p=st.sampled_from([1.0, 0.95, 0.5, 0.1]),
)
def test_law_is_normalized_on_its_support(seed, v, temp, top_k, top_p):
    x = _logits(seed, 3, v)
    params = SamplingParams.make(3, temp, top_k, top_p)
    logp = process_logits(x, params)
    p = logp.double().exp()
    assert torch.allclose(p.sum(-1), torch.ones(3, dtype=torch.float64), atol=1e-5)
    support = torch.isfinite(logp).sum(-1)
    assert bool((support >= 1).all())
    if temp == 0:
        assert bool((support == 1).all())
        assert torch.equal(logp.argmax(-1), x.argmax(-1))
    elif top_k:
        assert bool((support <= top_k).all())
    # the most likely token always survives truncation
    assert bool(torch.isfinite(logp.gather(1, x.argmax(-1, keepdim=True))).all())


def test_top_k_keeps_exactly_the_k_largest():
    x = torch.tensor([[0.0, 5.0, 1.0, 4.0, 3.0]])
    logp = process_logits(x, SamplingParams.make(1, 1.0, top_k=2))
    assert torch.isfinite(logp).tolist() == [[False, True, False, True, False]]
    expect = torch.log_softmax(torch.tensor([5.0, 4.0]), -1)
    assert torch.allclose(logp[0, [1, 3]], expect)


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logp = process_logits(probs.log(), SamplingParams.make(1, 1.0, top_p=0.75))
    assert torch.isfinite(logp).tolist() == [[True, True, False, False]]


def test_top_p_keeps_a_tie_at_the_prefix_end_whole():
    """The prefix reaching 0.5 ends at one of two tokens of 0.3: both are kept, whichever a
    sort would rank first (ranking the tokens kept one of the two)."""
    probs = torch.tensor([[0.3, 0.4, 0.3], [0.3, 0.3, 0.4]])
    logp = process_logits(probs.log(), SamplingParams.make(2, 1.0, top_p=0.5))
    assert torch.isfinite(logp).all()
    vals, ids = truncated_law(probs.log(), SamplingParams.make(2, 1.0, top_p=0.5))
    assert ids.tolist() == [[0, 1, 2], [0, 1, 2]]
    assert torch.allclose(vals.exp(), probs)


def test_temperature_scales_before_softmax():
    x = _logits(1, 2, 50)
    logp = process_logits(x, SamplingParams.make(2, 0.6))
    assert torch.allclose(logp, torch.log_softmax(x / 0.6, -1), atol=1e-6)


def test_temperature_only_law_is_bit_identical_and_leaves_the_logits_alone():
    """The temperature-only path normalizes its scaled copy in place: the same bits as
    log_softmax(x / T), and the caller's logits (fp32 or bf16, T = 1 or not) unchanged."""
    for shape in ((3, 129_280), (2, 6, 129_280), (4, 7)):
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(len(shape))) * 4
        for dtype in (torch.float32, torch.bfloat16):
            xd = x.to(dtype)
            for temps in ([0.6] * shape[0], [1.0] * shape[0], [1.0, 0.3] + [2.0] * (shape[0] - 2)):
                before = xd.clone()
                t = torch.tensor(temps).view(-1, *[1] * (len(shape) - 1))
                b = shape[0]
                params = SamplingParams(torch.tensor(temps), torch.zeros(b, dtype=torch.int64),
                                        torch.ones(b), torch.zeros(b, dtype=torch.int64))
                logp = process_logits(xd, params)
                assert torch.equal(logp, torch.log_softmax(xd.float() / t, dim=-1))
                assert torch.equal(xd, before)


def test_sparse_form_matches_the_dense_law():
    x = _logits(2, 4, 1000)
    params = SamplingParams(
        temperature=torch.tensor([1.0, 0.6, 0.0, 1.3]),
        top_k=torch.tensor([64, 7, 0, 64]),
        top_p=torch.tensor([1.0, 1.0, 1.0, 0.9]),
        seed=torch.zeros(4, dtype=torch.int64),
    )
    vals, ids = truncated_law(x, params)
    dense = process_logits(x, params)
    for b in range(4):
        valid = ids[b] >= 0
        assert int(valid.sum()) == int(torch.isfinite(dense[b]).sum())
        assert torch.equal(dense[b, ids[b][valid]], vals[b][valid])


def test_inverse_cdf_never_returns_zero_weight_and_flags_empty_rows():
    w = torch.tensor([[0.0, 1.0, 0.0, 2.0, 0.0], [0.0] * 5], dtype=torch.float64)
    u = torch.tensor([1e-300, 0.5], dtype=torch.float64)
    assert sample_from_weights(w, u).tolist() == [1, -1]
    edge = sample_from_weights(w[:1].expand(3, 5), torch.tensor([0.3333, 0.34, 1 - 2**-53]))
    assert edge.tolist() == [1, 3, 3]


def test_inverse_cdf_follows_the_weights():
    w = torch.tensor([[1.0, 0.0, 3.0, 6.0]], dtype=torch.float64).expand(100_000, 4)
    u = torch.rand(100_000, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(sample_from_weights(w, u), minlength=4).double() / 100_000
    assert torch.allclose(freq, torch.tensor([0.1, 0.0, 0.3, 0.6], dtype=torch.float64), atol=0.01)
