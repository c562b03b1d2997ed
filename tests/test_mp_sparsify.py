"""DCT-MP (Gupta et al., Alg. 2) without MPI: masks, Laplace estimate, wire format, the link protocol."""

import math
from collections import defaultdict

import numpy as np
import pytest

from mpisparse.mp.sparsify import (HEADER_BYTES, ActivationSparsifier, backward_bytes, choose_encoding, decode,
                                   densify, encode, forward_bytes, laplace_mask, mask_index_dtype, row_keep_count,
                                   topk_row_mask)

torch = pytest.importorskip("torch")


def rng(seed=0):
    return np.random.default_rng(seed)


# --------------------------------------------------------------------------- per-row top-k (Alg. 2 l.3-9)

@pytest.mark.parametrize("rows, d, density", [(32, 128, 0.1), (7, 50, 0.29), (5, 10, 0.01), (4, 9, 1.0),
                                               (64, 1024, 0.05), (3, 1, 0.5)])
def test_topk_row_mask_keeps_exactly_floor_d_eta_largest_per_row(rows, d, density):
    x = rng(1).standard_normal((rows, d)).astype(np.float32)
    mask = topk_row_mask(x, density)
    k = max(1, min(d, math.floor(d * density * (1 + 1e-9))))
    assert row_keep_count(d, density) == k
    assert mask.dtype == np.bool_ and mask.shape == (rows, d)
    assert (mask.sum(axis=1) == k).all()  # exactly k per row: density * d rounded down, at least 1
    a = np.abs(x)
    for i in range(rows):  # Alg. 2 l.5-7: the kept ones are the k largest |x| of the row
        kept, dropped = a[i, mask[i]], a[i, ~mask[i]]
        if dropped.size:
            assert kept.min() >= dropped.max()
        assert np.isclose(kept.min(), np.sort(a[i])[::-1][k - 1])  # tau_i = x_(floor(d eta))


def test_topk_row_mask_with_ties_after_relu_still_keeps_k():
    """A ReLU output row with fewer than k non-zeros: exactly k kept (not the whole row at tau = 0)."""
    x = np.zeros((3, 20), np.float32)
    x[0, :2] = [3.0, 1.0]
    x[1, :] = 1.0
    mask = topk_row_mask(x, 0.25)
    assert (mask.sum(axis=1) == 5).all()
    assert mask[0, 0] and mask[0, 1]


def test_topk_row_mask_rejects_bad_input():
    with pytest.raises(ValueError, match="2-D"):
        topk_row_mask(np.zeros(5, np.float32), 0.5)
    with pytest.raises(ValueError, match=r"density is 0; allowed range is \(0, 1\]"):
        topk_row_mask(np.zeros((2, 5), np.float32), 0)
    with pytest.raises(ValueError, match=r"--density is 1.5; allowed range is \(0, 1\]"):
        ActivationSparsifier(1.5)
    with pytest.raises(ValueError, match="--mp-threshold is 'sort'; allowed values are topk, laplace"):
        ActivationSparsifier(0.1, "sort")


# --------------------------------------------------------------------------- Laplace estimate (Sec. 2.2, App. B)

@pytest.mark.parametrize("density", [0.02, 0.05, 0.1, 0.25, 0.5])
@pytest.mark.parametrize("mu, b", [(0.0, 1.0), (0.3, 0.5)])
def test_laplace_threshold_occupancy_near_target_on_laplace_data(density, mu, b):
    x = rng(2).laplace(mu, b, size=(512, 256)).astype(np.float32)
    mask, tau = laplace_mask(x, density)
    occ = mask.mean()
    assert abs(occ - density) <= 0.1 * density + 0.002, (occ, density)
    assert tau > 0
    # the estimate is a single threshold for the whole batch
    assert np.array_equal(mask, np.abs(x) >= np.float32(tau))


def test_laplace_occupancy_drifts_on_relu_activations_and_is_reported():
    """Post-ReLU activations are not Laplace: the achieved occupancy differs from the target (Fig. 6b)."""
    x = np.maximum(rng(3).standard_normal((256, 128)), 0).astype(np.float32)
    sp = ActivationSparsifier(0.1, "laplace")
    mask = sp.select(x)
    assert sp.occupancy == pytest.approx(mask.mean())
    assert abs(sp.occupancy - 0.1) > 0.01
    # evaluation reuses the last training tau
    tau = sp.tau
    mask_eval = sp.select(x * 2, training=False)
    assert sp.tau == tau and np.array_equal(mask_eval, np.abs(2 * x) >= np.float32(tau))
    state = sp.state_dict()
    other = ActivationSparsifier(0.1, "laplace")
    other.load_state_dict(state)
    assert other.state_dict() == state


# --------------------------------------------------------------------------- wire format

def test_mask_index_dtype_is_the_smallest_that_holds_every_position():
    assert mask_index_dtype(256) == np.uint8 and mask_index_dtype(257) == np.uint16
    assert mask_index_dtype(65536) == np.uint16 and mask_index_dtype(65537) == np.uint32
    assert mask_index_dtype(2**32 + 1) == np.uint64


@pytest.mark.parametrize("rows, d, density", [
    (32, 128, 0.1),     # bitmap (512 B) beats 2-byte indices (768 B)
    (32, 128, 0.02),    # 2-byte indices (128 B) beat the bitmap (512 B)
    (4, 16, 0.05),      # 1-byte indices
    (600, 128, 0.01),   # 4-byte indices (rows d > 65536): 3,600 B vs bitmap 9,600 B
    (600, 128, 0.05),   # bitmap (9,600 B) vs 4-byte indices (14,400 B)
    (3, 8, 0.5),
])
def test_encoding_picks_the_smaller_mask_and_round_trips(rows, d, density):
    x = rng(4).standard_normal((rows, d)).astype(np.float32)
    mask = topk_row_mask(x, density)
    nnz = int(mask.sum())
    bitmap = math.ceil(rows * d / 8)
    indices = nnz * mask_index_dtype(rows * d).itemsize
    enc, buf = encode(x, mask)
    assert enc == ("bitmap" if bitmap <= indices else "indices")
    assert choose_encoding(rows, d, nnz) == (enc, min(bitmap, indices))
    # the exact byte count of the message: header, float32 values, the smaller mask
    assert buf.nbytes == HEADER_BYTES + 4 * nnz + min(bitmap, indices) == forward_bytes(rows, d, nnz)
    got_mask, vals, got_enc = decode(buf, d, dense=False)
    assert got_enc == enc and np.array_equal(got_mask, mask)
    assert np.array_equal(vals, x[mask])
    assert np.array_equal(densify(got_mask, vals), np.where(mask, x, 0))


def test_full_mask_and_no_mask_send_the_dense_matrix():
    x = rng(5).standard_normal((6, 10)).astype(np.float32)
    for mask in (None, np.ones(x.shape, bool)):
        enc, buf = encode(x, mask)
        assert enc == "dense" and buf.dtype == np.float32 and buf.nbytes == 4 * x.size
        m, vals, _ = decode(buf, 10, dense=True)
        assert m is None and np.array_equal(vals, x)
    assert forward_bytes(6, 10, 60) == 240 and choose_encoding(6, 10, 60) == ("dense", 0)


def test_decode_rejects_corrupt_messages():
    x = rng(6).standard_normal((4, 32)).astype(np.float32)
    _, buf = encode(x, topk_row_mask(x, 0.1))
    with pytest.raises(ValueError, match="does not match its header"):
        decode(buf[:-1], 32, dense=False)
    with pytest.raises(ValueError, match="whole number of rows"):
        decode(np.zeros(5, np.float32), 4, dense=True)


# --------------------------------------------------------------------------- the link, over an in-process fake network

class FakeNet:
    """Point-to-point messages between in-process 'ranks', in send order per (source, dest, tag)."""

    def __init__(self):
        self.queues = defaultdict(list)


class FakeComm:
    def __init__(self, net, rank):
        self.net, self.rank = net, rank
        self.bytes_sent = 0
        self.sent = []  # (dest, tag, copy of the payload)

    def send(self, x, dest, tag=0):
        self.net.queues[(self.rank, dest)].append((tag, np.array(x, copy=True)))
        self.sent.append((dest, tag, np.array(x, copy=True)))
        self.bytes_sent += x.nbytes

    def _find(self, source, tag):
        q = self.net.queues[(source, self.rank)]
        for i, (t, x) in enumerate(q):
            if tag is None or t == tag:
                return i, t, x
        raise AssertionError(f"no message from {source} with tag {tag}")

    def probe(self, source=None, tag=None):
        _, t, x = self._find(source, tag)
        return source, t, x.nbytes

    def recv(self, buf, source=None, tag=None):
        i, t, x = self._find(source, tag)
        del self.net.queues[(source, self.rank)][i]
        buf.reshape(-1).view(np.uint8)[:] = x.reshape(-1).view(np.uint8)
        return source, t, buf.size


def make_pair(sparsifier, shape):
    from mpisparse.mp.link import ActivationLink

    net = FakeNet()
    c0, c1 = FakeComm(net, 0), FakeComm(net, 1)
    return c0, c1, ActivationLink(c0, 1, shape, sparsifier), ActivationLink(c1, 0, shape, None)


@pytest.mark.parametrize("threshold", ["topk", "laplace"])
def test_backward_sends_exactly_the_masked_gradient_entries(threshold):
    from mpisparse.mp.link import TAG_GRAD, TAG_SPARSE

    rows, shape = 16, (8, 4)  # d = 32 per sample, like a (C, W) activation
    c0, c1, sender, receiver = make_pair(ActivationSparsifier(0.25, threshold), shape)
    out = torch.randn(rows, *shape, generator=torch.Generator().manual_seed(0))
    sender.send_activations(out, mb=0)
    xhat = receiver.recv_activations(mb=0)
    (dest, tag, payload), = c0.sent
    assert dest == 1 and tag == TAG_SPARSE
    mask, vals, _ = decode(payload, 32, dense=False)
    flat = out.reshape(rows, 32).numpy()
    assert np.array_equal(xhat.reshape(rows, 32).detach().numpy(), np.where(mask, flat, 0))
    assert xhat.requires_grad and xhat.shape == (rows, *shape)
    # the next stage's loss; its gradient w.r.t. the received activation is dense
    w = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    (xhat * w).pow(2).sum().backward()
    g = xhat.grad.reshape(rows, 32).numpy()
    receiver.send_gradients(xhat.grad, mb=0)
    (dest, tag, gvals), = c1.sent
    assert dest == 0 and tag == TAG_GRAD
    # Alg. 2 l.13-14: exactly the entries under the forward mask, in row-major order, nothing else
    assert gvals.dtype == np.float32 and np.array_equal(gvals, g[mask])
    assert gvals.nbytes == backward_bytes(mask.sum())
    back = sender.recv_gradients(rows, mb=0)
    assert np.array_equal(back.reshape(rows, 32).numpy(), np.where(mask, g, 0))
    assert sender.pending() == 0 and receiver.pending() == 0
    # byte statistics: forward counted by the sender, backward by the receiver
    assert sender.stats.bytes_forward == payload.nbytes == forward_bytes(rows, 32, int(mask.sum()))
    assert receiver.stats.bytes_backward == gvals.nbytes
    assert sender.stats.dense_bytes_forward == receiver.stats.dense_bytes_backward == 4 * rows * 32
    assert sender.stats.kept == mask.sum() and sender.stats.entries == rows * 32


def test_masked_link_gradient_equals_autograd_through_the_mask_layer():
    """The pipeline's parameter gradient = autograd of the network with the layer X * M(X) inserted."""
    torch.manual_seed(0)
    f1, f2 = torch.nn.Linear(10, 24), torch.nn.Linear(24, 3)
    x, y = torch.randn(12, 10), torch.randint(0, 3, (12,))
    sp = ActivationSparsifier(0.2)
    _, _, sender, receiver = make_pair(sp, (24,))
    h = torch.relu(f1(x))
    sender.send_activations(h)
    hh = receiver.recv_activations()
    torch.nn.functional.cross_entropy(f2(hh), y).backward()
    receiver.send_gradients(hh.grad)
    h.backward(sender.recv_gradients(12))
    got = [p.grad.clone() for p in (*f1.parameters(), *f2.parameters())]
    for p in (*f1.parameters(), *f2.parameters()):
        p.grad = None
    h = torch.relu(f1(x))
    m = torch.from_numpy(topk_row_mask(h.detach().numpy(), 0.2))
    torch.nn.functional.cross_entropy(f2(h * m), y).backward()
    want = [p.grad for p in (*f1.parameters(), *f2.parameters())]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_dense_link_and_micro_batch_order():
    rows = 5
    c0, c1, sender, receiver = make_pair(None, (6,))
    outs = [torch.randn(rows, 6) for _ in range(3)]
    for m, o in enumerate(outs):
        sender.send_activations(o, m)
    got = [receiver.recv_activations(m) for m in range(3)]
    for o, g in zip(outs, got):
        assert torch.equal(o, g.detach())
    for m in reversed(range(3)):
        receiver.send_gradients(torch.full((rows, 6), float(m)), m)
    for m in reversed(range(3)):
        assert torch.equal(sender.recv_gradients(rows, m), torch.full((rows, 6), float(m)))
    assert sender.stats.bytes_forward == 3 * 4 * rows * 6 == sender.stats.dense_bytes_forward
    assert sender.stats.encodings == {"dense": 3}


def test_dct_mp_is_registered_as_a_model_parallel_scheme():
    from mpisparse.mp.scheme import MPScheme
    from mpisparse.registry import SCHEMES, all_options
    from mpisparse.runtimes import runtime_of

    cls = SCHEMES["dct-mp"]
    assert issubclass(cls, MPScheme) and runtime_of("dct-mp").name == "mp"
    assert all_options()["mp_threshold"][1] == ["dct-mp"]
    assert cls.sparsifier(0.1).threshold == "topk"
    assert cls.sparsifier(0.1, mp_threshold="laplace").threshold == "laplace"
    with pytest.raises(ValueError, match="--mp-threshold is 'x'; allowed values are topk, laplace"):
        cls.validate_options({"mp_threshold": "x"})
