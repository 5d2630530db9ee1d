"""Checks of what reaches the gradients: padding invariance, gradient flow to every
parameter, the epoch order, and the loss reduction under accumulation and DDP."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from xdpx.data.lazy import open_train_split
from xdpx.doctor.checks import Check, Probe
from xdpx.inference import call_model
from xdpx.train.sampling import rank_share

#: Relative gradient difference under which accumulation equals one big batch (float32 sums
#: in another order differ by ~1e-6).
GRAD_RTOL = 1e-4


#: Padding invariance: logits may differ by this much (absolute) when only padding changes.
PAD_ATOL = 1e-5


def check_padding(p: Probe) -> Check:
    """Padding invariance: in eval mode, the logits of the first batch (padded to its longest
    sample) must equal each sample's logits alone (padded only to the model's ``min_len``)
    and the batch's logits with 7 more padding columns, within :data:`PAD_ATOL`."""
    ids = p.first_ids(16)
    model = p.model()
    with torch.no_grad():
        x, _ = p.batch(ids)
        batch = call_model(model, x)
        wider = call_model(model, p.batch(ids, extra_pad=7)[0])
        alone = torch.cat([call_model(model, p.batch(ids[i : i + 1])[0]) for i in range(len(ids))])  # fmt: skip
    d_alone = float((batch - alone).abs().max())
    d_wider = float((batch - wider).abs().max())
    worst = max(d_alone, d_wider)
    what = f"max |logit change| {worst:.1e} between a sample alone, in its batch and with 7 more pad columns"  # fmt: skip
    if worst > PAD_ATOL:
        return Check("fail", "padding", f"{what} (> {PAD_ATOL:g}): padding is not masked: pad positions reach the pooling/attention (mask them with input_ids != pad_id), so predictions depend on the batch")  # fmt: skip
    return Check("ok", "padding", what)


def check_grad_flow(p: Probe) -> Check:
    """One backward pass on the first batch (train mode): every trainable parameter must get
    a gradient, and not all zeros; frozen parameters are listed."""
    model = p.model(dropout=True)
    x, y = p.batch(p.first_ids())
    torch.manual_seed(p.cfg.seed)
    loss = F.cross_entropy(call_model(model, x).float(), y)
    if not loss.requires_grad:
        return Check("fail", "grad_flow", "the loss does not require a gradient: it is detached from the model (a .detach()/.item()/torch.no_grad() in forward, or every parameter frozen)")  # fmt: skip
    loss.backward()
    frozen, none, zero = [], [], []
    for name, t in model.named_parameters():
        if not t.requires_grad:
            frozen.append(name)
        elif t.grad is None:
            none.append(name)
        elif not bool((t.grad.coalesce().values() if t.grad.is_sparse else t.grad).any()):
            zero.append(name)
    trainable = sum(1 for t in model.parameters() if t.requires_grad)
    note = f"; frozen: {_names(frozen)}" if frozen else ""
    if len(none) == trainable:
        return Check("fail", "grad_flow", "no parameter gets a gradient: the loss is detached from the model (a .detach()/.item()/torch.no_grad() in forward)")  # fmt: skip
    if none or zero:
        parts = []
        if none:
            parts.append(f"no gradient for {_names(none)} (never used in forward: a dead branch, or unused weights; DDP then needs find_unused_parameters)")  # fmt: skip
        if zero:
            parts.append(f"all-zero gradient for {_names(zero)} (dead ReLUs, a zero multiplier or a mask that removes everything)")  # fmt: skip
        return Check("warn", "grad_flow", "; ".join(parts) + note)
    return Check("ok", "grad_flow", f"all {trainable} trainable parameter tensors get non-zero gradients{note}")  # fmt: skip


def _names(names: list[str], k: int = 4) -> str:
    return ", ".join(names[:k]) + (f" and {len(names) - k} more" if len(names) > k else "")


def check_data_order(p: Probe) -> Check:
    """The training order the trainer draws: shuffled within an epoch (no correlation with
    the file order, labels not clustered in batches), different across epochs, and under
    DDP (2 simulated ranks, each with its own data object, as under torchrun) disjoint rank
    shares that cover each window and change with the epoch (``DistributedSampler`` needs
    ``set_epoch``; xdpx draws each epoch's order from ``(seed, epoch)``)."""
    data, n = p.data, len(p.data)
    if n < 8:
        return Check("skip", "data_order", f"{n} training samples: too few to judge an order")
    limit = min(n, 20_000)  # positions looked at (whole windows; LazyData reads no rows here)
    data.set_epoch(1)
    o1 = data.window(0, limit)
    data.set_epoch(2)
    o2 = data.window(0, limit)
    fails, warns = [], []
    rho = float(np.corrcoef(np.arange(len(o1)), o1)[0, 1]) if len(o1) > 2 else 0.0
    if abs(rho) > 0.3:
        fails.append(f"shuffling is off: the epoch order follows the file order (correlation {rho:.2f} between position and sample id), so batches hold neighbouring lines (often one label or one source); draw a new permutation each epoch")  # fmt: skip
    labels = data.labels(o1)
    b = p.cfg.batch_size
    cut = len(labels) - len(labels) % b if len(labels) >= 2 * b else len(labels)
    same = labels[1:cut] == labels[: cut - 1]
    same = same[(np.arange(1, cut) % b) != 0] if b > 1 else same  # pairs inside a batch
    freq = np.bincount(labels[labels >= 0]) / max(1, (labels >= 0).sum())
    expected = float((freq**2).sum())
    observed = float(same.mean()) if len(same) else expected
    if observed > expected + 0.15 and not fails:
        warns.append(f"batches cluster by label: {observed:.2f} of neighbouring samples share a label vs {expected:.2f} under shuffling (label-sorted shards with lazy_load? one file per class?)")  # fmt: skip
    if np.array_equal(o1, o2):
        fails.append("every epoch sees the same order: the sampler ignores the epoch (DistributedSampler.set_epoch(epoch) not called, or a sampler seeded once); draw each epoch's order from (seed, epoch)")  # fmt: skip
    ddp = _ddp_shares(p)
    fails += ddp
    what = f"epoch order uncorrelated with the file (r={rho:.2f}), {observed:.2f} same-label neighbours vs {expected:.2f} expected, epochs 1 and 2 differ, 2 simulated DDP ranks disjoint and covering"  # fmt: skip
    if fails:
        return Check("fail", "data_order", "; ".join(fails))
    if warns:
        return Check("warn", "data_order", "; ".join(warns))
    return Check("ok", "data_order", what)


def _ddp_shares(p: Probe, world_size: int = 2) -> list[str]:
    """Problems of the rank shares under ``world_size`` simulated ranks (first 4 windows of
    epochs 1 and 2): each rank has its own data object, as under torchrun."""
    window = p.cfg.batch_size * p.cfg.update_freq * world_size
    ranks = [
        open_train_split(p.cfg.data_dir, p.cfg.train_subset, p.cfg.seed, p.cfg.lazy_load)[0]
        for _ in range(world_size)
    ]
    shares: dict[tuple[int, int], np.ndarray] = {}
    problems = []
    for epoch in (1, 2):
        for r, d in enumerate(ranks):
            d.set_epoch(epoch)
            own = [rank_share(d.window(pos, window), r, world_size) for pos in range(0, 4 * window, window)]  # fmt: skip
            shares[epoch, r] = np.concatenate(own)
        windows = [ranks[0].window(pos, window) for pos in range(0, 4 * window, window)]
        union = np.sort(np.concatenate([shares[epoch, r] for r in range(world_size)]))
        if len(np.unique(union)) < len(union):
            problems.append(f"DDP ranks overlap in epoch {epoch}: {len(union) - len(np.unique(union))} samples are trained twice per window (each rank must take a disjoint share, e.g. DistributedSampler(rank=...))")  # fmt: skip
        elif not np.array_equal(union, np.sort(np.concatenate(windows))):
            problems.append(f"DDP ranks miss samples in epoch {epoch} (their shares do not cover the window: ranks draw different orders; seed every rank alike)")  # fmt: skip
    if all(np.array_equal(shares[1, r], shares[2, r]) for r in range(world_size)):
        problems.append("under DDP each rank sees the same samples in the same order every epoch: the distributed sampler's order does not change with the epoch (call sampler.set_epoch(epoch) before each epoch)")  # fmt: skip
    for d in ranks:
        close = getattr(getattr(d, "split", None), "close", None)
        if close is not None:
            close()
    return problems


def check_reduction(p: Probe) -> Check:
    """Loss reduction under gradient accumulation: the gradient of one update window of
    ``update_freq`` micro-batches (the Trainer's own accumulation, ``update_freq`` 2 when
    the config has 1) must equal the gradient of the mean loss over the same samples as
    one concatenated batch (relative difference <= :data:`GRAD_RTOL`). Eval mode, so that
    dropout does not differ; checked on plain cross-entropy (no FreeLB, no distillation)."""
    k = max(2, p.cfg.update_freq)
    b = min(p.cfg.batch_size, 16)
    ids = p.first_ids(b * k)
    if len(ids) < k:
        return Check("skip", "reduction", f"needs {k} samples")
    model = p.model()
    trainer = p.trainer(model, batch_size=b, update_freq=k, adv=None, distill_from=None)
    trainer.optimizer.zero_grad(set_to_none=True)
    trainer._forward_backward(ids, ids, trainer._loss_units(ids))
    g_acc = _grads(model)
    ref = p.model()
    x, y = p.batch(ids)
    logits = call_model(ref, x)
    loss = trainer.objective.loss(logits, y, ids) / len(ids)
    loss.backward()
    g_ref = _grads(ref)
    diff = float((g_acc - g_ref).norm() / g_ref.norm().clamp(min=1e-30))
    ratio = float(g_acc.norm() / g_ref.norm().clamp(min=1e-30))
    what = f"{k} micro-batches of {b} vs one batch of {len(ids)}: gradient ratio {ratio:.3f}, relative difference {diff:.1e}"  # fmt: skip
    if diff <= GRAD_RTOL:
        return Check("ok", "reduction", what)
    if abs(ratio - k) < 0.05 * k:
        cause = f"the loss is summed over the {k} micro-batches instead of averaged: divide each micro-batch's loss by update_freq (or the summed per-sample loss by the window's samples)"  # fmt: skip
    elif abs(ratio - 1 / k) < 0.05 / k:
        cause = f"the accumulated gradient is {k}x too small: the loss is divided by update_freq twice"  # fmt: skip
    elif abs(ratio - 1) < 0.05:
        cause = "same size, other direction: the loss depends on how samples are batched (padding not masked? see padding)"  # fmt: skip
    else:
        cause = "the loss is not normalised by the window's samples (a per-micro-batch mean, or a sum over samples)"  # fmt: skip
    return Check("fail", "reduction", f"{what}: {cause}")


def _grads(model: nn.Module) -> torch.Tensor:
    parts = [
        (t.grad.to_dense() if t.grad.is_sparse else t.grad).flatten()
        for t in model.parameters()
        if t.requires_grad and t.grad is not None
    ]
    return torch.cat(parts).double() if parts else torch.zeros(1, dtype=torch.float64)
