"""Masked-language-model training (``train.task: mlm``): BERT masking, whole words, seeded.

Masking follows BERT's ``create_pretraining_data.py`` (Devlin et al. 2019, section 3.1 and
appendix A.1; google-research/bert): in each sequence ``max(1, round(n * mlm_probability))``
of its ``n`` maskable tokens are chosen (specials such as ``[CLS]``/``[SEP]``/padding never
are), whole *words* at a time in a random order, skipping a word that would overshoot the
count; each chosen token becomes ``[MASK]`` with probability 0.8, a random token with 0.1,
and stays itself with 0.1; the loss is the cross-entropy of the original token at the chosen
positions only.

A *word* is one token unless ``mask_whole_words`` (Cui et al. 2019, "Pre-Training with
Whole Word Masking for Chinese BERT"): then

* a WordPiece continuation (``##ing``) belongs to the word before it, so ``play ##ing`` is
  masked together or not at all;
* a run of single-character CJK tokens (Chinese BERT's and xdpx's ``char`` tokenizer) is
  segmented into words by jieba (Sun 2012-, ``jieba.lcut``), and the characters of one word
  are masked together, as in Chinese whole-word-masking BERT (which used LTP).

The masks of a sample are drawn by ``numpy.random.default_rng([seed, epoch, sample_id])``:
the same config gives the same masks however the samples are batched, accumulated or
spread over DDP ranks, and a resumed run draws exactly what the uninterrupted one did.
Evaluation uses ``epoch = 0`` (training epochs start at 1), so every evaluation of a run
scores the same masked valid split.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from xdpx.data.tokenizers import is_no_space_letter

__all__ = [
    "EVAL_EPOCH",
    "IGNORE_INDEX",
    "MASK_TOKENS",
    "MaskedLM",
    "masker_for",
    "mlm_loss",
    "special_ids",
    "word_ids",
    "write_pretrained",
]

#: Label of positions that are not predicted (``torch.nn.functional.cross_entropy``'s default).
IGNORE_INDEX = -100
#: The ``epoch`` the masks of the valid split are drawn with (training epochs are 1-based).
EVAL_EPOCH = 0
#: Mask tokens recognised in a vocabulary (BERT's, RoBERTa's); without one, xdpx appends one.
MASK_TOKENS = ("[MASK]", "<mask>")
#: Tokens never masked: sequence markers and padding.
SPECIAL_TOKENS = frozenset(
    {"[PAD]", "[CLS]", "[SEP]", "[MASK]", "<pad>", "<s>", "</s>", "<mask>", "<cls>", "<sep>"}
)


def special_ids(tokens: Sequence[str]) -> np.ndarray:
    """Ids of the tokens that are never masked (:data:`SPECIAL_TOKENS`), sorted ``[k]`` int64."""
    return np.array([i for i, t in enumerate(tokens) if t in SPECIAL_TOKENS], dtype=np.int64)


def _is_cjk_char(token: str) -> bool:
    """A one-letter token of a script written without spaces (prepro's ``auto`` test,
    :func:`xdpx.data.tokenizers.is_no_space_letter`)."""
    return len(token) == 1 and is_no_space_letter(token)


@functools.cache
def _segmenter() -> Callable[[str], list[str]]:
    """``jieba.lcut`` with its start-up chatter silenced (it logs at DEBUG to stderr)."""
    try:
        import jieba
    except ImportError as e:  # a dependency of xdpx; only a broken install lacks it
        raise ImportError(
            f"mask_whole_words on Chinese text needs the jieba segmenter ({e}): pip install jieba"
        ) from None
    jieba.setLogLevel(logging.WARNING)
    return jieba.lcut


def word_ids(
    tokens: Sequence[str], segment: Callable[[str], list[str]] | None = None
) -> np.ndarray:
    """The word each token belongs to, for whole-word masking.

    Args:
        tokens: the token strings of one sequence (``[n]``).
        segment: splits a run of CJK characters into words (default: jieba); it must return
            pieces that concatenate to its input.

    Returns:
        ``[n]`` int64: word index per token (0, 1, ... in order), -1 for special tokens.
        A ``##`` continuation joins the previous word; consecutive single-character CJK
        tokens are grouped by the segmenter's words.

    Raises:
        ValueError: the segmenter's pieces do not concatenate to the run it was given.
    """
    out = np.full(len(tokens), -1, dtype=np.int64)
    word = -1
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok in SPECIAL_TOKENS:
            i += 1
            continue
        if tok.startswith("##") and i > 0 and out[i - 1] >= 0:
            out[i] = word
            i += 1
            continue
        if _is_cjk_char(tok):
            j = i
            while j < len(tokens) and _is_cjk_char(tokens[j]):
                j += 1
            run = "".join(tokens[i:j])
            pieces = (segment or _segmenter())(run)
            if "".join(pieces) != run:
                raise ValueError(f"the segmenter changed the text {run!r} into {pieces!r}")
            k = i
            for piece in pieces:
                word += 1
                out[k : k + len(piece)] = word
                k += len(piece)
            i = j
            continue
        word += 1
        out[i] = word
        i += 1
    return out


class MaskedLM:
    """Draws BERT masks for samples by ``(seed, epoch, sample id)`` (see the module docstring).

    Args:
        tokens: the prepared data's vocabulary in id order (``vocab.txt``).
        mask_id: id of the mask token (:meth:`mask_id_for`).
        probability: ``train.mlm_probability``, the share of maskable tokens predicted.
        whole_words: ``train.mask_whole_words``.
        seed: ``train.seed``.
        segment: CJK word segmenter for ``whole_words`` (default jieba).

    Raises:
        ValueError: ``probability`` outside (0, 1], or no token is left to draw random
            replacements from.
    """

    #: shares of the chosen tokens replaced by the mask token, by a random token (the rest
    #: keep their own): BERT's 80/10/10.
    MASK_SHARE, RANDOM_SHARE = 0.8, 0.1

    def __init__(
        self,
        tokens: Sequence[str],
        mask_id: int,
        probability: float = 0.15,
        whole_words: bool = False,
        seed: int = 1,
        segment: Callable[[str], list[str]] | None = None,
    ) -> None:
        if not 0 < probability <= 1:
            raise ValueError(f"mlm_probability must lie in (0, 1], got {probability}")
        self.tokens = list(tokens)
        self.mask_id = int(mask_id)
        self.probability = float(probability)
        self.whole_words = whole_words
        self.seed = int(seed)
        self.segment = segment
        self.specials = special_ids(self.tokens)
        self._special = np.zeros(max(len(self.tokens), self.mask_id + 1), dtype=bool)
        self._special[self.specials] = True
        self._special[self.mask_id] = True
        self.random_ids = np.flatnonzero(~self._special[: len(self.tokens)])
        if not len(self.random_ids):
            raise ValueError("the vocabulary has no ordinary token to draw replacements from")

    @staticmethod
    def mask_id_for(tokens: Sequence[str]) -> int:
        """The vocabulary's mask token id, or ``len(tokens)`` (one id appended: the model's
        embedding table then has one more row than the vocabulary)."""
        for name in MASK_TOKENS:
            if name in tokens:
                return list(tokens).index(name)
        return len(tokens)

    def words(self, ids: np.ndarray) -> np.ndarray:
        """``[n]`` word index per token of ``ids`` (-1 = never masked)."""
        special = self._special[np.minimum(ids, len(self._special) - 1)]
        if not self.whole_words:
            out = np.cumsum(~special) - 1
            out[special] = -1
            return out
        return word_ids([self.tokens[i] for i in ids], self.segment)

    def mask(self, ids: np.ndarray, sample_id: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Mask one sequence.

        Args:
            ids: ``[n]`` token ids of the sample (unpadded).
            sample_id: its row in the split (a stable id across epochs).
            epoch: the training epoch (1-based), or :data:`EVAL_EPOCH` for evaluation.

        Returns:
            ``(input_ids [n], labels [n])`` int64: the masked input and the original ids at
            the chosen positions, :data:`IGNORE_INDEX` elsewhere.
        """
        ids = np.asarray(ids, dtype=np.int64)
        rng = np.random.default_rng([self.seed, int(epoch), int(sample_id)])
        words = self.words(ids)
        n = int((words >= 0).sum())
        labels = np.full(len(ids), IGNORE_INDEX, dtype=np.int64)
        if n == 0:
            return ids.copy(), labels
        n_words = int(words.max()) + 1
        target = max(1, int(round(n * self.probability)))
        starts = np.searchsorted(np.sort(words[words >= 0]), np.arange(n_words + 1))
        order = np.argsort(words, kind="stable")[len(ids) - n :]  # positions grouped by word
        chosen: list[np.ndarray] = []
        count = 0
        for w in rng.permutation(n_words):
            size = int(starts[w + 1] - starts[w])
            if count + size > target:
                continue
            chosen.append(order[starts[w] : starts[w + 1]])
            count += size
            if count == target:
                break
        pos = np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, dtype=np.int64)
        labels[pos] = ids[pos]
        out = ids.copy()
        r = rng.random(len(pos))
        out[pos[r < self.MASK_SHARE]] = self.mask_id
        rand = pos[(r >= self.MASK_SHARE) & (r < self.MASK_SHARE + self.RANDOM_SHARE)]
        out[rand] = rng.choice(self.random_ids, size=len(rand))
        return out, labels

    def mask_many(
        self, samples: Sequence[np.ndarray], sample_ids: Sequence[int], epoch: int
    ) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """:meth:`mask` of each sample, keyed by sample id."""
        return {
            int(s): self.mask(x, int(s), epoch) for x, s in zip(samples, sample_ids, strict=True)
        }


def mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy at the masked positions, *summed* (the trainer divides by the window's
    masked-token count, so accumulation over micro-batches and ranks is exact).

    Args:
        logits: ``[n_masked, vocab_size]`` (``HFMaskedLM(input_ids, labels)``), or
            ``[batch, seq_len, vocab_size]`` for every position.
        labels: ``[n_masked]`` original ids; with 3-d logits ``[batch, seq_len]``, holding
            :data:`IGNORE_INDEX` at positions not predicted.

    Returns:
        a scalar tensor (nats, summed over the masked tokens).
    """
    if logits.dim() == 3:
        logits, labels = logits.flatten(0, 1), labels.flatten()
    return F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX, reduction="sum")


def perplexity(loss: float) -> float:
    """``exp(loss)`` of a mean per-token cross-entropy in nats (inf when it overflows)."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


def pad_masked(
    masked: Sequence[tuple[np.ndarray, np.ndarray]], pad_id: int, min_len: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad masked samples: ``(input_ids [batch, width], labels [batch, width])``, the
    labels padded with :data:`IGNORE_INDEX`."""
    from xdpx.inference import pad_batch

    x = pad_batch([m[0] for m in masked], pad_id, min_len)
    y = pad_batch([m[1] for m in masked], IGNORE_INDEX, min_len)
    return x, y  # type: ignore[return-value]


@torch.no_grad()
def evaluate_mlm(
    model: torch.nn.Module,
    parts: Sequence[Sequence[np.ndarray]],
    masker: MaskedLM,
    batch_size: int,
    pad_id: int,
    device: torch.device,
    rank: int = 0,
    world_size: int = 1,
) -> dict[str, float]:
    """MLM loss, perplexity and masked-token accuracy of ``model`` on a split.

    Every sample is masked with ``epoch = EVAL_EPOCH`` (the same masks at every evaluation);
    under ``torch.distributed`` rank ``r`` scores every ``world_size``-th sample and the
    sums are all-reduced, so every rank returns the same metrics.

    Args:
        model: ``model(input_ids, labels)`` returns the logits of the masked positions,
            ``[n_masked, vocab]`` (:class:`xdpx.models.HFMaskedLM`).
        parts: the split's samples (unpadded id arrays), in shards; sample ids run on
            across shards.
        batch_size: samples per forward pass.

    Returns:
        ``loss`` (mean cross-entropy per masked token, nats), ``perplexity`` (``exp(loss)``),
        ``accuracy`` (share of masked tokens predicted exactly).
    """
    was_training = model.training
    model.eval()
    min_len = model.min_len
    sums = np.zeros(3, dtype=np.float64)  # loss, masked tokens, correct
    offset = 0
    for samples in parts:
        mine = np.arange(rank, len(samples), world_size)
        for i in range(0, len(mine), batch_size):
            idx = mine[i : i + batch_size]
            masked = [masker.mask(samples[j], offset + int(j), EVAL_EPOCH) for j in idx]
            x, y = pad_masked(masked, pad_id, min_len)
            x, y = x.to(device), y.to(device)
            logits = model(x, y)  # [n_masked, vocab]
            target = y[y != IGNORE_INDEX]
            sums += [
                float(mlm_loss(logits, target)),
                float(len(target)),
                float((logits.argmax(-1) == target).sum()),
            ]
        offset += len(samples)
    model.train(was_training)
    if world_size > 1:
        import torch.distributed as dist

        t = torch.tensor(sums, dtype=torch.float64, device=device)
        dist.all_reduce(t)
        sums = t.cpu().numpy()
    loss = sums[0] / max(sums[1], 1.0)
    return {"loss": loss, "perplexity": perplexity(loss), "accuracy": sums[2] / max(sums[1], 1.0)}


def masker_for(cfg: Any) -> MaskedLM:
    """The masker of ``task: mlm`` over the prepared data's vocabulary (``vocab.txt`` of
    ``cfg.data_dir``), with the ``train`` section's ``mlm_probability``,
    ``mask_whole_words`` and ``seed``."""
    from xdpx import io
    from xdpx.data import VOCAB_FILE
    from xdpx.data.vocab import read_tokens

    tokens = read_tokens(io.join(cfg.data_dir, VOCAB_FILE))
    return MaskedLM(
        tokens, MaskedLM.mask_id_for(tokens), cfg.mlm_probability, cfg.mask_whole_words, cfg.seed
    )


def write_pretrained(cfg: Any, meta: Any) -> str:
    """``task: mlm``: write the run's best checkpoint as ``<save_dir>/pretrained``, a
    ``from_pretrained`` directory with the data's tokenizer, which ``train.pretrained_model``
    and ``prepro.tokenizer_path`` accept for fine-tuning.

    Args:
        cfg: the ``train`` section (``save_dir``); meta: the prepared data's
            :class:`~xdpx.data.PreparedMeta` (its tokenizer goes along when it is ``hf``).

    Returns:
        the directory written.
    """
    from xdpx import io
    from xdpx.checkpoint import load_checkpoint
    from xdpx.rundir import BEST, RunDir

    run = RunDir(cfg.save_dir)
    model = load_checkpoint(io.join(cfg.save_dir, BEST)).model
    tokenizer = meta.prepro.get("tokenizer_path") if meta.tokenizer == "hf" else None
    model.save_pretrained(run.pretrained, tokenizer_dir=tokenizer)
    logging.getLogger("xdpx.train").info(
        "wrote %s: fine-tune it with train.pretrained_model=%s%s",
        run.pretrained, run.pretrained,
        f" (prepro.tokenizer_path={run.pretrained})" if tokenizer else "",
    )  # fmt: skip
    return run.pretrained
