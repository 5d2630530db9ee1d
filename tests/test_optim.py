"""LazyAdamW, the sparse-aware gradient clipping and the squared hinge loss (unit tier)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from xdpx.config import TrainConfig
from xdpx.models import with_model_defaults
from xdpx.train.losses import squared_hinge
from xdpx.train.optim import LazyAdamW, clip_grad_norm

pytestmark = pytest.mark.unit


def _bag_loss(weight: torch.Tensor, bias: torch.Tensor, sparse: bool, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, 6, (12,), generator=g)  # rows 6..9 are never touched
    values = torch.rand(12, generator=g)
    offsets = torch.tensor([0, 5, 9])
    out = F.embedding_bag(
        rows, weight, offsets, mode="sum", per_sample_weights=values, sparse=sparse
    )
    return ((out + bias) ** 2).sum()


def test_lazy_adamw_dense_grads_are_adamw() -> None:
    """Dense gradients: the same weights as torch.optim.AdamW after several steps."""
    torch.manual_seed(0)
    a, b = torch.nn.Parameter(torch.randn(10, 3)), torch.nn.Parameter(torch.randn(3))
    a2, b2 = (torch.nn.Parameter(t.detach().clone()) for t in (a, b))
    ours = LazyAdamW([a, b], lr=0.05, weight_decay=0.1)
    ref = torch.optim.AdamW([a2, b2], lr=0.05, weight_decay=0.1, foreach=False)
    for step in range(5):
        for p, q, opt in ((a, b, ours), (a2, b2, ref)):
            opt.zero_grad()
            _bag_loss(p, q, sparse=False, seed=step).backward()
            opt.step()
    torch.testing.assert_close(a, a2)
    torch.testing.assert_close(b, b2)


def test_lazy_adamw_sparse_grads_touch_only_their_rows() -> None:
    """Sparse gradients: rows no batch touched keep their values; touched rows follow
    torch.optim.SparseAdam (no weight decay)."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(10, 3))
    w_ref = torch.nn.Parameter(w.detach().clone())
    bias = torch.zeros(3)
    ours, ref = LazyAdamW([w], lr=0.05), torch.optim.SparseAdam([w_ref], lr=0.05)
    start = w.detach().clone()
    for step in range(4):
        for p, opt in ((w, ours), (w_ref, ref)):
            opt.zero_grad()
            _bag_loss(p, bias, sparse=True, seed=step).backward()
            assert p.grad.is_sparse
            opt.step()
    torch.testing.assert_close(w, w_ref)
    torch.testing.assert_close(w[6:], start[6:], atol=0, rtol=0)
    assert (w[:6] - start[:6]).abs().max() > 0.01


def test_clip_grad_norm_sparse_equals_dense() -> None:
    """The same norm and the same clipped gradient, sparse or dense."""
    results = []
    for sparse in (False, True):
        torch.manual_seed(0)
        w, b = torch.nn.Parameter(torch.randn(10, 3)), torch.nn.Parameter(torch.randn(3))
        _bag_loss(w, b, sparse=sparse, seed=1).backward()
        norm = clip_grad_norm([w, b], 1.0)
        grad = w.grad.to_dense() if sparse else w.grad
        results.append((float(norm), grad.clone(), b.grad.clone()))
    (n1, g1, c1), (n2, g2, c2) = results
    assert n1 == pytest.approx(n2, rel=1e-5) and n1 > 1.0  # clipping happened
    torch.testing.assert_close(g1, g2)
    torch.testing.assert_close(c1, c2)
    total = torch.sqrt((g2**2).sum() + (c2**2).sum())
    assert float(total) == pytest.approx(1.0, rel=1e-4)


def test_squared_hinge_matches_its_definition() -> None:
    """One-vs-rest squared hinge by hand, with and without class weights."""
    logits = torch.tensor([[2.0, -0.5, 0.3], [0.2, 0.1, -3.0]])
    y = torch.tensor([0, 2])
    # sample 0: class 0 t=+1: max(0,1-2)=0; class 1 t=-1: max(0,1-0.5)=0.5; class 2: 1.3
    # sample 1: class 0 t=-1: 1.2; class 1: 1.1; class 2 t=+1: max(0, 1+3)=4
    want0, want1 = 0.5**2 + 1.3**2, 1.2**2 + 1.1**2 + 4.0**2
    assert float(squared_hinge(logits, y)) == pytest.approx(want0 + want1)
    w = torch.tensor([2.0, 1.0, 0.5])
    assert float(squared_hinge(logits, y, w)) == pytest.approx(2 * want0 + 0.5 * want1)


def test_squared_hinge_matches_linear_svc_loss_on_its_solution() -> None:
    """At LinearSVC's solution our loss (plus its L2 term) is at a minimum: a small step
    of the weights in any of a few random directions does not lower it."""
    from sklearn.datasets import make_classification
    from sklearn.svm import LinearSVC

    x, y = make_classification(200, 5, n_informative=3, n_classes=3, random_state=0)
    svc = LinearSVC(C=1.0, intercept_scaling=100.0, tol=1e-8, max_iter=100_000).fit(x, y)
    xt, yt = torch.tensor(x, dtype=torch.float64), torch.tensor(y)

    def objective(coef: torch.Tensor, intercept: torch.Tensor) -> float:
        loss = squared_hinge(xt @ coef.T + intercept, yt).double()  # C = 1
        return float(0.5 * (coef**2).sum() + loss)

    coef = torch.tensor(svc.coef_, dtype=torch.float64)
    intercept = torch.tensor(svc.intercept_, dtype=torch.float64)
    best = objective(coef, intercept)
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        step = 1e-3 * torch.randn(coef.shape, generator=g, dtype=torch.float64)
        assert objective(coef + step, intercept) >= best - 1e-9
        assert objective(coef - step, intercept) >= best - 1e-9


@pytest.mark.parametrize(
    ("model", "loss", "optimizer"),
    [
        ("ngram_lr", "squared_hinge", "lazy_adamw"),
        ("match_ngram", "cross_entropy", "lazy_adamw"),
        ("textcnn", "cross_entropy", "adamw"),
        ("bilstm", "cross_entropy", "adamw"),
    ],
)
def test_auto_resolves_by_model(model, loss, optimizer) -> None:
    cfg = with_model_defaults(TrainConfig(model=model, loss="auto", optimizer="auto"))
    assert (cfg.loss, cfg.optimizer) == (loss, optimizer)
    assert cfg.learning_rate is not None


def test_auto_loss_is_cross_entropy_with_distillation() -> None:
    cfg = TrainConfig(loss="auto", distill_from="teacher.tsv")
    assert with_model_defaults(cfg).loss == "cross_entropy"
    with pytest.raises(ValueError, match="distill_from"):
        TrainConfig(loss="squared_hinge", distill_from="teacher.tsv")


def test_explicit_settings_are_kept() -> None:
    cfg = TrainConfig(loss="cross_entropy", optimizer="adamw", learning_rate=0.5)
    assert with_model_defaults(cfg) is cfg
    assert np.isclose(cfg.learning_rate, 0.5)


def test_class_weight_auto_weighs_only_imbalanced_classes() -> None:
    """auto: balanced at a 3:1 imbalance or more (20newsgroups-lt's 60:1), none below it
    (STS-B's 1.8:1); classes without samples are ignored in the ratio."""
    from xdpx.train.losses import balanced_class_weight, resolve_class_weight

    skewed = np.array([600, 100, 10, 0])
    torch.testing.assert_close(
        resolve_class_weight("auto", skewed), balanced_class_weight(skewed), atol=0, rtol=0
    )
    assert resolve_class_weight("auto", np.array([3686, 2063])) is None
    assert resolve_class_weight("auto", np.array([30, 10])) is not None
    assert resolve_class_weight(None, skewed) is None
    assert resolve_class_weight("balanced", np.array([5, 5])) is not None


def test_sparse_grad_ddp_exchange_in_a_one_process_group():
    """SparseGradDDP in a real (gloo, world size 1) group: a sparse table gradient comes back
    coalesced with its values unchanged (the mean over one rank), the dense one too, a
    parameter without a gradient keeps none, and the bytes are those of the touched rows."""
    import socket

    import torch.distributed as dist

    from xdpx.train.ddp import SparseGradDDP

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = torch.nn.Module()
        model.table = torch.nn.Embedding(1000, 3, sparse=True)
        model.bias = torch.nn.Parameter(torch.zeros(3))
        model.unused = torch.nn.Parameter(torch.zeros(2))
        wrapped = SparseGradDDP(model)
        rows = torch.tensor([5, 7, 5, 999])  # row 5 twice: coalesced into one row
        (model.table(rows).sum(0) * torch.tensor([1.0, 2.0, 3.0]) + model.bias).sum().backward()
        expected = model.table.weight.grad.to_dense().clone()
        stats = wrapped.sync_gradients()
        grad = model.table.weight.grad
        assert grad.is_sparse and grad.is_coalesced()
        assert grad.indices()[0].tolist() == [5, 7, 999]
        torch.testing.assert_close(grad.to_dense(), expected)
        torch.testing.assert_close(model.bias.grad, torch.ones(3))
        assert model.unused.grad is None
        assert stats.touched_rows == 3
        assert stats.sparse_bytes == 3 * (8 + 3 * 4) + 8  # (index, 3 floats) per row + the count
        assert stats.dense_table_bytes == 1000 * 3 * 4 and stats.dense_bytes == 3 * 4
    finally:
        dist.destroy_process_group()
