"""The dynamic batcher of ``xdpx serve --http`` and its settings (:class:`ServeConfig`):
the texts of concurrent requests merged into model calls. The HTTP layer on top of it is
:mod:`xdpx.serving.server`, which re-exports both names.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

log = logging.getLogger("xdpx.serving.server")

__all__ = [
    "DynamicBatcher",
    "Input",
    "Overloaded",
    "ServeConfig",
    "available_cores",
    "threads_per_instance",
]


@dataclass
class ServeConfig:
    """Server settings (``xdpx serve --http`` options).

    Attributes:
        max_batch_size: texts per model call at most (1 = batching off).
        max_wait_ms: how long the oldest queued text may wait for others, in milliseconds
            (0.5: with 8 clients on the demo model, 2 ms gave 1,650 requests/s against
            2,920 for 0.5, at 64 clients the same; ``bench/serve_load.py``).
        max_queue: texts waiting at most; beyond, requests get 503.
        max_body_bytes: request bodies above get 413.
        retry_after_s: the ``Retry-After`` header of a 503, in seconds.
        inline_ms: a model call expected to take less than this many milliseconds runs
            on the event loop instead of the worker thread (see :class:`DynamicBatcher`);
            0 = always the worker thread. (2: 3,250 requests/s with 8 clients against
            2,680 for 1 ms, on the demo model.)
        max_padding: the most padding a model call's texts may carry, as a share of its
            padded ``[rows, width]`` area (:func:`xdpx.batching.length_chunks` cuts a
            batch into calls of similar length); None = the model's own
            (:attr:`xdpx.serving.runtime.ServedModel.max_padding`).
        instances: model calls in flight at once, each in its own worker thread (Triton's
            ``instance_group`` ``count``). ``xdpx serve`` gives each instance
            ``cores // instances`` onnxruntime threads (:func:`threads_per_instance`), so
            two instances on 2 cores run two batches side by side, one thread each, where
            one instance runs one batch on two threads. 2 (the default) against 1 (with 2
            threads), int8 graphs of STS-B at 64 clients on 2 cores, two alternating runs
            of ``bench/serve_students.py`` (``reports/serve_instances-stsb.json``): the
            6-layer MiniLM cross-encoder 615-645 -> 837-859 requests/s, its 4-layer student
            836-914 -> 1,111-1,118, the n-gram -> student cascade 1,372-1,444 -> 1,924-1,955
            (its two members also run side by side), the n-gram 3,544-3,632 ->
            3,707-4,137. In a first look 3 instances were no faster than 2, and 2 instances
            of 2 threads each slower than 1. The eager backend serves one call at a time
            whatever this says (PyTorch has one thread pool a process).
    """

    max_batch_size: int = 64
    max_wait_ms: float = 0.5
    max_queue: int = 1024
    max_body_bytes: int = 1_000_000
    retry_after_s: int = 1
    inline_ms: float = 2.0
    max_padding: float | None = None
    instances: int = 2

    def __post_init__(self) -> None:
        if self.instances < 1:
            raise ValueError(f"instances must be >= 1, got {self.instances}")


def available_cores() -> int:
    """The cores this process may run on (``os.sched_getaffinity``, else ``os.cpu_count()``)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def threads_per_instance(instances: int, cores: int | None = None) -> int:
    """onnxruntime intra-op threads for each of ``instances`` model instances: the cores
    shared out, at least 1.

    Args:
        instances: model calls in flight at once (:attr:`ServeConfig.instances`), >= 1.
        cores: the cores to share (None: :func:`available_cores`).
    """
    return max(1, (available_cores() if cores is None else cores) // max(1, instances))


class Overloaded(Exception):
    """The queue cannot take the request's texts (the server answers 503)."""


#: One queued text: ``(text, text2)`` (``text2`` None for a single-text model), or any
#: input the batcher's ``run_batch`` takes.
Input = Any


@dataclass
class _Item:
    input: Input
    future: asyncio.Future
    arrived: float


class DynamicBatcher:
    """Merges the texts of concurrent requests into model calls (see
    :mod:`xdpx.serving.server`'s module docstring, "Dynamic batching").

    Args:
        run_batch: ``inputs -> [n, num_labels]`` probabilities, one row per input in order
            (one model call; run in a worker thread). The server's inputs are raw
            ``(text, text2)`` pairs, encoded in that call: one tokenizer call per batch.
        config: ``max_batch_size``, ``max_wait_ms``, ``max_queue``.
        on_batch: called with each model call's size (metrics).

    A model call runs in a worker thread, so the event loop keeps reading and answering
    requests while it runs (onnxruntime and PyTorch release the GIL). Up to
    ``config.instances`` calls run at once, each in its own thread: the batcher takes a free
    instance first, then gathers the next batch, so texts that arrive while every instance
    is busy wait together for the next call. ``run_batch`` must then be safe to call from
    several threads at once (an onnxruntime session is; :class:`xdpx.serving.runtime.ServedModel`
    locks its eager backend). Handing a call to
    the thread and its result back costs about a millisecond under load (two thread
    wake-ups and GIL hand-overs), more than a small call of a small model takes: the
    demo's ngram_lr answers one text in 0.2 ms. So a call whose expected time (texts x
    the running mean of seconds per text of earlier calls, measured inside the call) is
    under ``inline_ms`` runs on the event loop itself, which it blocks that long. On
    the demo model with ``bench/serve_load.py``'s clients, both versions up in one run:
    one client 0.65 against 0.75 ms per request (p50); batching off at 64 clients 3,045
    against 1,636 requests/s. The first call, with no estimate yet, and the calls of a
    large model run in the thread.

    Call :meth:`start` inside the event loop, :meth:`stop` at shutdown.
    """

    #: Weight of the newest call in the running mean of seconds per text.
    COST_SMOOTHING = 0.2

    def __init__(
        self,
        run_batch: Callable[[list[Input]], np.ndarray],
        config: ServeConfig,
        on_batch: Callable[[int], None] | None = None,
    ) -> None:
        self.run_batch, self.cfg, self.on_batch = run_batch, config, on_batch
        self.queue: deque[_Item] = deque()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._pool = ThreadPoolExecutor(config.instances, thread_name_prefix="xdpx-model")
        self._free: asyncio.Semaphore | None = None  # instances not running a call
        self._calls: set[asyncio.Task] = set()
        self._last_batch = 1
        self._per_text_s: float | None = None  # running mean; None until a call is timed

    @property
    def depth(self) -> int:
        """Texts waiting for a model call."""
        return len(self.queue)

    def start(self) -> None:
        self._wake = asyncio.Event()
        self._free = asyncio.Semaphore(self.cfg.instances)
        self._task = asyncio.get_running_loop().create_task(self._work())

    async def stop(self) -> None:
        """Answer what is queued and in flight, then stop the worker."""
        while self.queue or self._calls:
            await asyncio.sleep(0.005)
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._pool.shutdown(wait=True)

    async def submit(self, inputs: Sequence[Input]) -> np.ndarray:
        """Queue ``inputs`` (of ``run_batch``) and wait for their probabilities
        ``[n, num_labels]``, in order.

        Raises:
            Overloaded: the queue has no room for all of them (nothing is queued).
            Exception: what the model call raised (for this batch's requests only).
        """
        if len(self.queue) + len(inputs) > self.cfg.max_queue:
            raise Overloaded(f"{len(self.queue)} texts queued, room for {self.cfg.max_queue}")
        loop = asyncio.get_running_loop()
        now = time.perf_counter()
        items = [_Item(x, loop.create_future(), now) for x in inputs]
        self.queue.extend(items)
        assert self._wake is not None, "start() the batcher first"
        self._wake.set()
        return np.stack(await asyncio.gather(*(i.future for i in items)))

    def _inline(self, n: int) -> bool:
        """Whether a call of ``n`` texts is expected to take under ``inline_ms``."""
        per_text = self._per_text_s
        return per_text is not None and n * per_text * 1000.0 < self.cfg.inline_ms

    def _timed(self, inputs: list[Input]) -> np.ndarray:
        """``run_batch(inputs)``, folding its seconds per text into the running mean."""
        start = time.perf_counter()
        out = self.run_batch(inputs)
        per_text = (time.perf_counter() - start) / max(len(inputs), 1)
        old = self._per_text_s
        a = self.COST_SMOOTHING
        self._per_text_s = per_text if old is None else (1 - a) * old + a * per_text
        return out

    async def _work(self) -> None:
        assert self._wake is not None and self._free is not None
        loop = asyncio.get_running_loop()
        max_wait = self.cfg.max_wait_ms / 1000.0
        while True:
            if not self.queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            await self._free.acquire()  # a free instance before the batch is gathered
            # a lone text after a lone text (one client at a time) runs at once: waiting for
            # others only pays when requests overlap
            alone = len(self.queue) == 1 and self._last_batch == 1
            deadline = self.queue[0].arrived + (0.0 if alone else max_wait)
            while len(self.queue) < self.cfg.max_batch_size:
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), left)
                except TimeoutError:
                    break
            n = min(len(self.queue), self.cfg.max_batch_size)
            self._last_batch = n
            batch = [self.queue.popleft() for _ in range(n)]
            if self.on_batch is not None:
                self.on_batch(n)
            if self._inline(n):  # on the event loop, which it blocks that long
                await self._call(batch, inline=True)
                continue
            call = loop.create_task(self._call(batch, inline=False))
            self._calls.add(call)
            call.add_done_callback(self._calls.discard)

    async def _call(self, batch: list[_Item], inline: bool) -> None:
        """One model call on ``batch`` (on the event loop when ``inline``, else in a worker
        thread), its rows handed to the requests; its instance is freed when it ends."""
        assert self._free is not None
        inputs = [i.input for i in batch]
        try:
            if inline:
                probs = self._timed(inputs)
            else:
                loop = asyncio.get_running_loop()
                probs = await loop.run_in_executor(self._pool, self._timed, inputs)
            for i, p in zip(batch, probs, strict=True):
                if not i.future.done():
                    i.future.set_result(p)
        except Exception as e:  # noqa: BLE001 - the batch's requests get it, the server lives
            log.error("model call on a batch of %d failed", len(batch), exc_info=e)
            for i in batch:
                if not i.future.done():
                    i.future.set_exception(e)
        finally:
            self._free.release()
