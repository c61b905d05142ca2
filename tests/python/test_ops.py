"""flashtq.attention against PyTorch's SDPA, a float64 oracle and the library's reference backend."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import flashtq
from flashtq import _flashtq as ext
from flashtq._tensors import view
from conftest import DEVICES
from reference import attention as oracle
from reference import grad_rel_err, rel_err, sinks_grad_rel_err

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}  # SPEC §3, against float64


def draw_shape(gen):
    hkv = gen.choice([1, 2, 3])
    return dict(B=gen.choice([1, 2]), Sq=gen.randint(1, 40), Sk=gen.randint(1, 48), Hkv=hkv,
                H=hkv * gen.choice([1, 2, 3]), D=gen.choice([32, 64, 96, 128]))


def draw(gen, device, dtype=torch.float32, layout="bshd"):
    s = draw_shape(gen)
    shape_q = (s["B"], s["Sq"], s["H"], s["D"]) if layout == "bshd" else (s["B"], s["H"], s["Sq"], s["D"])
    shape_k = (s["B"], s["Sk"], s["Hkv"], s["D"]) if layout == "bshd" else (s["B"], s["Hkv"], s["Sk"], s["D"])
    q = torch.randn(shape_q, device=device).to(dtype)
    k = torch.randn(shape_k, device=device).to(dtype)
    v = torch.randn(shape_k, device=device).to(dtype)
    return s, q, k, v


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_forward_matches_oracle_on_random_shapes(device, dtype, gen):
    for _ in range(6):
        s, q, k, v = draw(gen, device, dtype)
        causal = gen.random() < 0.7
        offset = gen.choice([None, 0, gen.randint(-5, 10)])
        window = gen.choice([0, 0, gen.randint(1, 20)])
        mask = torch.randn(1, s["H"], s["Sq"], s["Sk"], device=device) if gen.random() < 0.3 else None
        out, lse = flashtq.attention(q, k, v, causal=causal, causal_offset=offset, window=window, mask=mask,
                                     return_lse=True)
        ref_out, ref_lse = oracle(q, k, v, causal, offset, window, mask)
        assert out.dtype == dtype and out.shape == q.shape
        assert not out.isnan().any()
        assert rel_err(out, ref_out) <= TOL[dtype], (s, causal, offset, window)
        finite = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse), finite)
        if finite.any():
            assert rel_err(lse[finite], ref_lse[finite]) <= TOL[dtype]


@pytest.mark.parametrize("device", DEVICES)
def test_matches_sdpa_in_pytorch_layout(device, gen):
    for _ in range(6):
        s, q, k, v = draw(gen, device, layout="bhsd")
        # PyTorch's is_causal is top-left: causal_offset=0.
        got = flashtq.attention(q, k, v, causal=True, causal_offset=0, layout="bhsd")
        want = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True) if s["Sq"] <= s["Sk"] else None
        if want is None:  # SDPA's is_causal with more queries than keys: build the mask explicitly
            m = torch.ones(s["Sq"], s["Sk"], dtype=torch.bool, device=device).tril()
            want = F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)
            want = torch.where(m.any(-1)[None, None, :, None], want, torch.zeros_like(want))
        assert got.shape == q.shape and got.is_contiguous()
        assert rel_err(got, want) <= 1e-5
        # bottom-right alignment with a window, as a boolean mask for SDPA
        window = gen.randint(1, 16)
        i = torch.arange(s["Sq"], device=device)[:, None] + s["Sk"] - s["Sq"]
        j = torch.arange(s["Sk"], device=device)[None, :]
        m = (j <= i) & (i - j < window)
        got = flashtq.attention(q, k, v, causal=True, window=window, layout="bhsd")
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)
        want = torch.where(m.any(-1)[None, None, :, None], want, torch.zeros_like(want))
        assert rel_err(got, want) <= 1e-5


@pytest.mark.parametrize("device", DEVICES)
def test_bool_and_broadcast_masks(device, gen):
    s, q, k, v = draw(gen, device)
    keep = torch.rand(s["Sq"], s["Sk"], device=device) < 0.7  # [Sq, Sk] broadcasts over batch and heads
    got = flashtq.attention(q, k, v, mask=keep)
    additive = torch.where(keep, 0.0, float("-inf"))
    assert rel_err(got, oracle(q, k, v, mask=additive)[0]) <= 1e-5


def test_any_strides_with_d_contiguous(gen):
    s, q, k, v = draw(gen, "cpu")
    wide = torch.randn(s["B"], s["Sq"], s["H"] + 2, s["D"])[:, :, 1:-1]  # a strided slice of a larger tensor
    got = flashtq.attention(wide, k, v, causal=True)
    assert rel_err(got, oracle(wide, k, v, causal=True)[0]) <= 1e-5


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_matches_the_reference_backend(device, gen):
    s, q, k, v = draw(gen, device)
    seed = gen.randrange(2**32)
    got = flashtq.attention(q, k, v, causal=True, dropout_p=0.3, seed=seed)
    ref = flashtq.attention(q.cpu(), k.cpu(), v.cpu(), causal=True, dropout_p=0.3, seed=seed, backend="reference")
    assert rel_err(got.cpu(), ref) <= 1e-5
    other = flashtq.attention(q, k, v, causal=True, dropout_p=0.3, seed=(seed + 1) % 2**32)
    assert not torch.equal(got, other) or s["Sk"] == 1
    # gradients with dropout: the backward regenerates the forward's decisions (the reference backend's too)
    grads = []
    for backend, dev in ((None, device), ("reference", "cpu")):
        leaves = [t.detach().to(dev).requires_grad_() for t in (q, k, v)]
        flashtq.attention(*leaves, causal=True, dropout_p=0.3, seed=seed, backend=backend).square().sum().backward()
        grads.append([t.grad.cpu() for t in leaves])
    for a, b in zip(*grads):
        assert rel_err(a, b) <= 1e-5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_gradients_match_float64_autograd(device, layout, gen):
    for _ in range(3):
        s, q, k, v = draw(gen, device, layout=layout)
        causal, window = gen.random() < 0.7, gen.choice([0, gen.randint(1, 20)])
        mask = torch.randn(s["B"], 1, s["Sq"], s["Sk"], device=device) if gen.random() < 0.3 else None
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = flashtq.attention(*leaves, causal=causal, window=window, mask=mask, layout=layout)
        dout = torch.randn_like(out)
        out.backward(dout)
        ref_leaves = [t.double().clone().requires_grad_() for t in (q, k, v)]
        as_bshd = (lambda t: t) if layout == "bshd" else (lambda t: t.transpose(1, 2))
        ref_out, _ = oracle(*(as_bshd(t) for t in ref_leaves), causal, None, window, mask)
        as_bshd(ref_out).backward(dout.double()) if layout == "bshd" else ref_out.transpose(1, 2).backward(dout.double())
        D = q.shape[-1]
        for got, ref in zip(leaves, ref_leaves):
            assert grad_rel_err(got.grad, ref.grad, D ** -0.5, D) <= 1e-5, (s, causal, window)


def test_numpy_through_dlpack(gen):
    s, q, k, v = draw(gen, "cpu")
    got = flashtq.attention(q.numpy(), k.numpy(), v.numpy(), causal=True)
    assert isinstance(got, np.ndarray)
    assert rel_err(torch.from_numpy(got), oracle(q, k, v, causal=True)[0]) <= 1e-5


def test_binding_writes_every_element_of_given_memory(gen):
    """The extension writes into caller memory: poison it first, so that an unwritten element fails."""
    s, q, k, v = draw(gen, "cpu")
    out = torch.full_like(q, float("nan"))
    lse = torch.full((s["B"], s["H"], s["Sq"]), float("nan"))
    ext.forward("cpu", view(q, "q"), view(k, "k"), view(v, "v"), view(out, "out"), lse.data_ptr(), None, True, None,
                0, 0, (0, 0, 0, 0), 0, 0.0, 0, 0.0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    ref_out, ref_lse = oracle(q, k, v, causal=True)
    assert not out.isnan().any() and not lse.isnan().any()
    assert rel_err(out, ref_out) <= 1e-5


class Block(torch.nn.Module):
    def __init__(self, dim=128, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q = torch.nn.Linear(dim, dim)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * self.head_dim)
        self.o = torch.nn.Linear(dim, dim)

    def forward(self, x):
        B, S, _ = x.shape
        q = self.q(x).view(B, S, self.heads, self.head_dim)
        k, v = self.kv(x).view(B, S, 2, self.kv_heads, self.head_dim).unbind(2)
        return self.o(flashtq.attention(q, k, v, causal=True, window=8).reshape(B, S, -1))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph(backend, gen):
    torch._dynamo.reset()
    block = Block()
    x = torch.randn(2, 24, 128)
    compiled = torch.compile(block, fullgraph=True, backend=backend)
    got = compiled(x)
    want = block(x)
    assert rel_err(got, want) <= 1e-5
    got.square().sum().backward()
    grads = [p.grad.clone() for p in block.parameters()]
    block.zero_grad()
    want.square().sum().backward()
    for a, p in zip(grads, block.parameters()):
        assert rel_err(a, p.grad) <= 1e-4


def test_custom_op_passes_opcheck(gen):
    s, q, k, v = draw(gen, "cpu")
    args = (q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), None, None, True, None, 0, 0.0, 0, 0.0, None,
            None, None, 0, 0, False, "")
    torch.library.opcheck(torch.ops.flashtq.attention_forward.default, args)
    sinks = torch.randn(q.shape[2]).requires_grad_()
    args = args[:10] + (2.0, sinks) + args[12:]
    torch.library.opcheck(torch.ops.flashtq.attention_forward.default, args)
    cu = torch.tensor([0, q.shape[1]], dtype=torch.int32)  # batch 0 as a ragged batch of one sequence
    one = tuple(t[:1].detach().requires_grad_() for t in (q, k, v))
    args = one + args[3:12] + (cu, torch.tensor([0, k.shape[1]], dtype=torch.int32), 0, 0) + args[16:]
    torch.library.opcheck(torch.ops.flashtq.attention_forward.default, args)


@pytest.mark.parametrize("call, argument", [
    (lambda q, k, v: flashtq.attention(q, k, v, layout="bsdh"), "layout"),
    (lambda q, k, v: flashtq.attention(q[0], k, v), "q"),
    (lambda q, k, v: flashtq.attention(q, torch.randn(1, 6, 3, 64), torch.randn(1, 6, 3, 64)), "k"),  # H % Hkv
    (lambda q, k, v: flashtq.attention(q, k, v[:, :3]), "v"),
    (lambda q, k, v: flashtq.attention(q, k, v, dropout_p=1.0), "dropout_p"),
    (lambda q, k, v: flashtq.attention(q, k, v, dropout_p=float("nan")), "dropout_p"),
    (lambda q, k, v: flashtq.attention(q, k, v, seed=-1), "seed"),
    (lambda q, k, v: flashtq.attention(q, k, v, window=-3), "window"),
    (lambda q, k, v: flashtq.attention(q, k, v, mask=torch.zeros(5, 7, 9)), "mask"),
    (lambda q, k, v: flashtq.attention(q.double(), k.double(), v.double()), "q"),
    (lambda q, k, v: flashtq.attention(q, k.half(), v), "k"),
    (lambda q, k, v: flashtq.attention(q.transpose(-1, -2), k, v), "q"),
    (lambda q, k, v: flashtq.attention(q, k, v, backend="nope"), "backend"),
    (lambda q, k, v: flashtq.attention(q, k, v, softcap=-1.0), "softcap"),
    (lambda q, k, v: flashtq.attention(q, k, v, softcap="30"), "softcap"),
    (lambda q, k, v: flashtq.attention(q, k, v, sinks=torch.zeros(3)), "sinks"),  # H = 4
    (lambda q, k, v: flashtq.attention(q, k, v, sinks=torch.tensor([0.0, float("nan"), 0.0, 0.0])), "sinks"),
])
def test_bad_arguments_raise_naming_the_argument(call, argument):
    q, k, v = torch.randn(1, 4, 4, 64), torch.randn(1, 6, 2, 64), torch.randn(1, 6, 2, 64)
    with pytest.raises(flashtq.FlashTQError) as e:
        call(q, k, v)
    assert e.value.argument == argument, str(e.value)
    assert f"argument '{argument}'" in str(e.value)
    assert isinstance(e.value, ValueError)


def test_gradients_through_lse(gen):
    s, q, k, v = draw(gen, "cpu")
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = flashtq.attention(*leaves, causal=True, return_lse=True)
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    finite = torch.isfinite(lse)
    ((out * dout).sum() + (lse[finite] * dlse[finite]).sum()).backward()
    ref = [t.double().clone().requires_grad_() for t in (q, k, v)]
    ro, rl = oracle(*ref, causal=True)
    ((ro * dout.double()).sum() + (rl[finite] * dlse[finite].double()).sum()).backward()
    for a, b in zip(leaves, ref):
        assert rel_err(a.grad, b.grad) <= 1e-5


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_softcap_and_sinks_with_gradients_match_float64_autograd(layout, gen):
    """SPEC §1.8-§1.9 on the cpu backend: out, lse and every gradient (the sinks' included) against the float64
    formula differentiated by autograd."""
    for _ in range(4):
        s, q, k, v = draw(gen, "cpu", layout=layout)
        causal, window = gen.random() < 0.7, gen.choice([0, gen.randint(1, 20)])
        softcap = gen.choice([0.0, 0.7, 5.0])
        sinks = torch.randn(s["H"]) + 1.0
        sinks[gen.randrange(s["H"])] = float("-inf")  # a head without a sink
        leaves = [t.clone().requires_grad_() for t in (q, k, v)] + [sinks.clone().requires_grad_()]
        out, lse = flashtq.attention(*leaves[:3], causal=causal, window=window, layout=layout, softcap=softcap,
                                     sinks=leaves[3], return_lse=True)
        dout = torch.randn_like(out)
        out.backward(dout)
        ref_leaves = [t.double().clone().requires_grad_() for t in (q, k, v, sinks)]
        as_bshd = (lambda t: t) if layout == "bshd" else (lambda t: t.transpose(1, 2))
        ref_out, ref_lse = oracle(*(as_bshd(t) for t in ref_leaves[:3]), causal, None, window, softcap=softcap,
                                  sinks=ref_leaves[3])
        as_bshd(ref_out).backward(dout.double())
        assert rel_err(out, as_bshd(ref_out)) <= 1e-5, (s, causal, window, softcap)
        finite = torch.isfinite(ref_lse)  # everywhere but where a sinkless row sees nothing
        assert torch.equal(torch.isfinite(lse), finite)
        assert rel_err(lse[finite], ref_lse[finite]) <= 1e-5
        D = q.shape[-1]
        for got, ref in zip(leaves[:3], ref_leaves[:3]):
            assert grad_rel_err(got.grad, ref.grad, D ** -0.5, D) <= 1e-5, (s, causal, window, softcap)
        assert sinks_grad_rel_err(leaves[3].grad, ref_leaves[3].grad, s["B"] * s["Sq"]) <= 1e-5
        assert leaves[3].grad[sinks == float("-inf")].eq(0).all()


@pytest.mark.parametrize("softcap", [0.0, 3.0])
def test_gradients_through_lse_with_sinks_and_softcap(softcap, gen):
    s, q, k, v = draw(gen, "cpu")
    sinks = torch.randn(s["H"])
    leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    out, lse = flashtq.attention(*leaves[:3], causal=True, sinks=leaves[3], softcap=softcap, return_lse=True)
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    ((out * dout).sum() + (lse * dlse).sum()).backward()
    ref = [t.double().clone().requires_grad_() for t in (q, k, v, sinks)]
    ro, rl = oracle(*ref[:3], causal=True, sinks=ref[3], softcap=softcap)
    ((ro * dout.double()).sum() + (rl * dlse.double()).sum()).backward()
    for a, b in zip(leaves[:3], ref[:3]):
        assert rel_err(a.grad, b.grad) <= 1e-5
    assert sinks_grad_rel_err(leaves[3].grad, ref[3].grad, s["B"] * s["Sq"]) <= 1e-5


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_equals_each_sequence_alone_with_gradients(gen, device):
    """SPEC §1.6: a packed ragged batch against flashtq.attention (itself held to the oracle above) on each
    sequence alone, forward and backward, sinks included; the offsets stay on the CPU for every device."""
    H, Hkv, D = 4, 2, 32
    lens_q, lens_k = [3, 0, 7, 5], [6, 4, 7, 1]
    cu_q = torch.tensor([0] + list(np.cumsum(lens_q)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(np.cumsum(lens_k)), dtype=torch.int32)
    q = torch.randn(sum(lens_q), H, D).to(device).requires_grad_()
    k = torch.randn(sum(lens_k), Hkv, D).to(device).requires_grad_()
    v = torch.randn(sum(lens_k), Hkv, D).to(device).requires_grad_()
    sinks = torch.randn(H).to(device).requires_grad_()
    out, lse = flashtq.attention_varlen(q, k, v, cu_q, cu_k, max_seqlen_q=7, causal=True, sinks=sinks,
                                        return_lse=True)
    assert out.shape == q.shape and lse.shape == (H, q.shape[0])
    dout = torch.randn_like(out)
    (out * dout).sum().backward()
    grads = [t.grad.clone() for t in (q, k, v, sinks)]
    for t in (q, k, v, sinks):
        t.grad = None
    total = 0
    for b in range(len(lens_q)):
        rq, rk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if lens_q[b] == 0:
            continue
        o, l = flashtq.attention(q[rq][None], k[rk][None], v[rk][None], causal=True, sinks=sinks, return_lse=True)
        assert rel_err(out[rq], o[0]) <= 1e-5 and rel_err(lse[:, rq], l[0]) <= 1e-5
        total = total + (o[0] * dout[rq]).sum()
    total.backward()
    for got, want in zip(grads, (q.grad, k.grad, v.grad, sinks.grad)):
        assert rel_err(got, want) <= 1e-5


@pytest.mark.parametrize("device", DEVICES)
def test_paged_forward_and_append_equal_the_contiguous_forward(gen, device):
    """SPEC §1.7: keys appended into shuffled pages (poisoned first), then a paged forward, against the contiguous
    forward; on cuda a decode step in bf16 (the append kernel and the decode kernel through device tables)."""
    B, H, Hkv, D, page_size = 2, 4, 2, 64, 16
    dtype, rows, tol = (torch.bfloat16, 1, 1e-2) if device == "cuda" else (torch.float32, 2, 1e-5)
    lengths = [37, 20]
    max_pages = 3
    table = torch.randperm(B * max_pages + 2, dtype=torch.int32)[: B * max_pages].view(B, max_pages)
    k_pages = torch.full((B * max_pages + 2, page_size, Hkv, D), float("nan"), dtype=dtype, device=device)
    v_pages = torch.full_like(k_pages, float("nan"))
    k = torch.randn(B, max(lengths), Hkv, D).to(device, dtype)
    v = torch.randn_like(k)
    seq_lens = torch.zeros(B, dtype=torch.int32)
    for b in range(B):  # one sequence at a time, its table row and length
        flashtq.paged_kv_append(k_pages, v_pages, table[b:b + 1], seq_lens[b:b + 1], k[b:b + 1, : lengths[b]],
                                v[b:b + 1, : lengths[b]])
        seq_lens[b] = lengths[b]
    q = torch.randn(B, rows, H, D).to(device, dtype)
    out = flashtq.attention_paged(q, k_pages, v_pages, table, seq_lens, causal=True)
    for b in range(B):
        want = flashtq.attention(q[b:b + 1], k[b:b + 1, : lengths[b]], v[b:b + 1, : lengths[b]], causal=True)
        assert rel_err(out[b:b + 1].float(), want.float()) <= tol


@pytest.mark.parametrize("device", DEVICES)
def test_a_decode_step_through_pages_equals_the_oracle(device, seed):
    """A decode step (one query row, a GQA group of 4) over 3000 keys, contiguous and through a shuffled page table
    on the tensors' device (on cuda: the decode kernel, its keys split across the GPU with the workspace the op
    allocates), against the oracle in double."""
    B, H, Hkv, D, page_size, n = 2, 8, 2, 128, 16, 3000
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    tol = 1e-2 if device == "cuda" else 1e-5
    k, v = torch.randn(B, n, Hkv, D), torch.randn(B, n, Hkv, D)
    q = torch.randn(B, 1, H, D)
    rounded = [x.to(dtype).double() for x in (q, k, v)]
    want = oracle(*rounded, causal=True)[0]
    out = flashtq.attention(*(x.to(device, dtype) for x in (q, k, v)), causal=True)
    assert rel_err(out.double().cpu(), want) <= tol
    per_sequence = n // page_size + 1
    table = torch.randperm(B * per_sequence, dtype=torch.int32).view(B, per_sequence)
    k_pages = torch.zeros(B * per_sequence, page_size, Hkv, D)
    v_pages = torch.zeros_like(k_pages)
    for b in range(B):
        for j in range(0, n, page_size):
            rows = slice(j, min(j + page_size, n))
            k_pages[table[b, j // page_size], : rows.stop - j] = k[b, rows]
            v_pages[table[b, j // page_size], : rows.stop - j] = v[b, rows]
    lengths = torch.full((B,), n, dtype=torch.int32)
    paged = flashtq.attention_paged(q.to(device, dtype), k_pages.to(device, dtype), v_pages.to(device, dtype),
                                    table, lengths, causal=True)
    assert rel_err(paged.double().cpu(), want) <= tol


@pytest.mark.parametrize("call, argument", [
    (lambda q, k, v: flashtq.attention_varlen(q[0], k[0], v[0], torch.tensor([0, 4]), torch.tensor([0, 6])),
     "cu_seqlens_q"),  # int64 offsets
    (lambda q, k, v: flashtq.attention_varlen(q[0], k[0], v[0], torch.tensor([0, 3], dtype=torch.int32),
                                              torch.tensor([0, 6], dtype=torch.int32)), "cu_seqlens_q"),  # not Tq
    (lambda q, k, v: flashtq.attention_varlen(q, k, v, torch.tensor([0, 4], dtype=torch.int32),
                                              torch.tensor([0, 6], dtype=torch.int32)), "q"),  # 4-D
    (lambda q, k, v: flashtq.attention_paged(q, torch.zeros(4, 12, 2, 64), torch.zeros(4, 12, 2, 64),
                                             torch.zeros(1, 2, dtype=torch.int32),
                                             torch.ones(1, dtype=torch.int32)), "k"),  # page_size 12
    (lambda q, k, v: flashtq.attention_paged(q, torch.zeros(4, 16, 2, 64), torch.zeros(4, 16, 2, 64),
                                             torch.full((1, 2), 7, dtype=torch.int32),
                                             torch.ones(1, dtype=torch.int32)), "page_table"),
])
def test_bad_ragged_and_paged_arguments_raise_naming_the_argument(call, argument):
    q, k, v = torch.randn(1, 4, 4, 64), torch.randn(1, 6, 2, 64), torch.randn(1, 6, 2, 64)
    with pytest.raises(flashtq.FlashTQError) as e:
        call(q, k, v)
    assert e.value.argument == argument, str(e.value)
