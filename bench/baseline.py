"""Fixed classical baseline: TF-IDF character 1-3-grams + logistic regression.

The vectorizer is fit on train only; the inverse regularisation strength ``C``
is picked on dev accuracy from a fixed grid (ties go to the smaller ``C``), and
test accuracy is reported for the chosen ``C``. Given the xdpx metrics file,
the xdpx test accuracy is printed next to it with the difference.

Usage::

    python bench/baseline.py [--data-dir data/raw] [--metrics reports/metrics.json]
                             [--json reports/baseline.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pandas as pd

try:
    from xdpx import io
except ModuleNotFoundError:  # run as a script from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from xdpx import io
from xdpx import baselines

__all__ = ["C_GRID", "read_split", "run_baseline", "main"]

#: Inverse regularisation strengths tried on dev.
C_GRID: tuple[float, ...] = baselines.C_GRID


def read_split(path: str, text_column: str = "text", label_column: str = "label") -> pd.DataFrame:
    """Read one TSV split written by ``stages.fetch`` (header row, no quoting).

    Returns:
        DataFrame with string columns ``text`` and ``label``.

    Raises:
        KeyError: a column is missing.
    """
    df = baselines.read_tsv(path, [text_column, label_column])
    return pd.DataFrame({"text": df[text_column], "label": df[label_column]})


def run_baseline(data_dir: str, c_grid: tuple[float, ...] = C_GRID) -> dict[str, Any]:
    """Fit TF-IDF char 1-3-grams + LR on train, pick ``C`` on dev, score test
    (:func:`xdpx.baselines.tfidf_lr` with ``analyzer="char"``).

    Args:
        data_dir: directory with ``train.tsv``, ``dev.tsv`` and ``test.tsv``.
        c_grid: candidate ``C`` values.

    Returns:
        ``{"dev_accuracy": {C: acc}, "C": best C, "dev_accuracy_best": acc,
        "test_accuracy": acc, "n": {split: rows}, "features", "seconds"}``;
        accuracies are fractions in [0, 1].
    """
    result = baselines.run_baseline(data_dir, analyzer="char", c_grid=c_grid)
    result.pop("test_correct")
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Command line entry; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--data-dir", default="data/raw", help="Directory of {train,dev,test}.tsv.")
    parser.add_argument(
        "--metrics", help="xdpx metrics JSON with test.accuracy to compare against."
    )
    parser.add_argument("--json", dest="json_out", help="Write the baseline numbers to this JSON.")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)

    result = run_baseline(args.data_dir)
    sizes = ", ".join(f"{s}={n}" for s, n in result["n"].items())
    print(
        f"baseline tfidf char 1-3 + LR on {args.data_dir} ({sizes}, {result['features']} features)"
    )
    for c, acc in result["dev_accuracy"].items():
        print(f"  C={float(c):g}: dev accuracy {acc:.4f}")
    print(f"chosen C={result['C']:g}; test accuracy {result['test_accuracy']:.4f}")

    if args.metrics:
        metrics = json.loads(io.read_text(args.metrics))
        xdpx_acc = float(metrics["test"]["accuracy"])
        result["xdpx_test_accuracy"] = xdpx_acc
        result["difference"] = xdpx_acc - result["test_accuracy"]
        print(
            f"test accuracy: xdpx {xdpx_acc:.4f}  baseline {result['test_accuracy']:.4f}  "
            f"difference (xdpx - baseline) {result['difference']:+.4f}"
        )
    if args.json_out:
        io.write_text(args.json_out, json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
