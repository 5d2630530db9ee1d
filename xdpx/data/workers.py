"""The worker pool of prepro's passes (:mod:`xdpx.data.stream`): processes mapped over files in
order, and the encoder each worker builds once from a picklable spec."""

from __future__ import annotations

import hashlib
import json
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from multiprocessing import get_context
from typing import Any, TypeVar

from xdpx.config import PreproConfig
from xdpx.data.encoder import Encoder
from xdpx.data.tokenizers import HFTokenizer, make_tokenizer
from xdpx.data.vocab import TargetMap, Vocab, spells_oov

T = TypeVar("T")
R = TypeVar("R")
_CACHE: dict[Any, Any] = {}  # per process: the tokenizer of the counting pass, the encoder


# ------------------------------------------------------------------------ workers
def worker_pool(workers: int) -> Executor | None:
    """A pool of ``workers`` processes (``spawn``: no inherited threads or locks; started
    at the first job), or None for ``workers == 1`` (everything runs in this process).
    One pool serves both passes: each worker builds a tokenizer / encoder once per spec."""
    if workers <= 1:
        return None
    return ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"))


def ordered_map(
    fn: Callable[[T], R], items: Iterable[T], executor: Executor | None, ahead: int = 0
) -> Iterator[R]:
    """``map(fn, items)`` on ``executor``: results in the order of ``items``, at most
    ``ahead`` (default: twice the pool's workers) submitted and not yet taken, so memory
    stays bounded however long ``items`` is. Without an executor, a plain ``map``."""
    if executor is None:
        yield from map(fn, items)
        return
    ahead = ahead or 2 * getattr(executor, "_max_workers", 2)
    pending: deque[Any] = deque()
    for item in items:
        pending.append(executor.submit(fn, item))
        if len(pending) >= ahead:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


@dataclass(frozen=True, eq=False)
class EncoderSpec:
    """What a worker process needs to rebuild prepro's :class:`Encoder` (picklable).

    Attributes:
        prepro: the prepro section as a dict (tokenizer options, max_len, transliterate).
        tokenizer: the resolved tokenizer name (not ``auto``).
        vocab: token strings in id order (None for ``hf``).
        labels: the target map's labels in class order.
    """

    prepro: dict[str, Any]
    tokenizer: str
    vocab: list[str] | None
    labels: list[str]

    @property
    def pair_columns(self) -> bool:
        """The shards have ``input_ids2`` (pairs encoded separately, not ``hf``)."""
        return self.prepro.get("text2_column") is not None and self.tokenizer != "hf"

    @cached_property
    def key(self) -> str:
        """A digest of the spec: a worker builds the encoder once per key."""
        text = json.dumps([self.prepro, self.tokenizer, self.vocab, self.labels])
        return hashlib.sha1(text.encode("utf-8")).hexdigest()

    def build(self) -> Encoder:
        """The :class:`Encoder` this spec describes.

        Raises:
            ValueError: the hf tokenizer cannot be loaded from ``tokenizer_path``.
        """
        cfg = PreproConfig.model_validate(self.prepro)
        tok = make_tokenizer(self.tokenizer, cfg.lower, cfg.tokenizer_path)
        vocab = None if isinstance(tok, HFTokenizer) else Vocab(self.vocab or [])
        return Encoder(
            tok,
            TargetMap(self.labels),
            cfg.max_len,
            vocab,
            pair=cfg.text2_column is not None,
            transliterate=cfg.transliterate,
            label_type=cfg.label_type,
            spell_oov=spells_oov(cfg.oov, self.tokenizer),
            truncation=cfg.truncation,
        )


def _cached(key: Any, build: Callable[[], T]) -> T:
    if key not in _CACHE:
        _CACHE[key] = build()
    return _CACHE[key]
