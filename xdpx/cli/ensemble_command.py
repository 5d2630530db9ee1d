"""``xdpx ensemble`` (:mod:`xdpx.ensemble`): registered on the app by :mod:`xdpx.cli`; the
library is imported only when the command runs."""

from __future__ import annotations

import typer

from xdpx.cli.common import _user_errors


def ensemble(
    members: list[str] = typer.Argument(..., metavar="MEMBER...", help="Two or more run directories (their export/) or export directories, trained on the same raw data."),
    out: str = typer.Option(..., "--out", "-o", help="The ensemble directory to write (replaced whole; serve it with xdpx serve --http)."),
    dev: str = typer.Option(None, "--dev", help="Raw labelled dev file the weights are chosen on (default: the dev file member 0's prepro read)."),
    test: str = typer.Option(None, "--test", help="Raw labelled test file, scored once with the chosen weights (default: member 0's test file, unless --dev is given)."),
    metric: str = typer.Option("accuracy", "--metric", help="The dev criterion: accuracy or macro_f1 (ties: the lower dev log loss)."),
    step: float = typer.Option(0.05, "--step", min=0.001, max=1.0, help="The weight grid's step (two members), or 1/rounds of greedy ensemble selection (more)."),
    int8: bool = typer.Option(False, "--int8", help="Use and serve the members' int8 graphs (model.int8.onnx; export.quantize=int8)."),
    threads: int = typer.Option(None, "--threads", min=1, help="onnxruntime threads per member (default: the library's)."),
    name: list[str] = typer.Option(None, "--name", "-n", help="The members' names in the report, in order (repeatable; default: their run directories' names)."),
    cascade: float = typer.Option(None, "--cascade", min=0.0, max=1.0, metavar="MAX_DEFER", help="Serve a cascade: member 0 (put the fast model first) answers alone where its top probability reaches a threshold chosen on dev; the rest, at most this share of dev (e.g. 0.2), go to the weighted average of all members."),
) -> None:  # fmt: skip
    """A probability-averaging ensemble of trained runs, weights chosen on dev, served as one model.

    Every member scores the dev file with its own export (onnxruntime); the weights of the
    average of their class probabilities are chosen on dev (two members: a grid of
    `--step`; more: Caruana et al. 2004's greedy ensemble selection). Every member alone is
    a candidate, so the ensemble is never below its best member on dev. The test file is
    scored once, with the paired SE against every member. The directory holds the members'
    exports, `ensemble.json` (the weights), `report.json` and `confusion.png`; `xdpx serve
    --http DIR` serves it like a run.

    With `--cascade MAX_DEFER` it serves a cascade: member 0 alone answers the texts it is
    confident of, and only the least confident (at most MAX_DEFER of dev) pay for the
    other members: near member 0's speed with most of the average's accuracy.

    **Examples:**

    `xdpx ensemble models/default models/minilm --out models/ensemble`

    `xdpx ensemble models/default models/minilm --out models/ens --dev data/raw/dev.tsv --test data/raw/test.tsv`

    `xdpx ensemble models/a models/b models/c --out models/abc --metric macro_f1 --int8`

    `xdpx ensemble models/default models/minilm -n ngram -n minilm --out models/ensemble`

    `xdpx ensemble models/default models/e5 --cascade 0.2 --int8 --out models/cascade`

    `xdpx serve models/ensemble --http --port 8000`
    """
    from xdpx.ensemble import build_ensemble

    with _user_errors():
        report = build_ensemble(
            members, out, dev, test, metric, step,
            "model.int8.onnx" if int8 else "model.onnx", threads, names=name or None,
            cascade=cascade,
        )  # fmt: skip
    for s, m in report["splits"].items():
        line = f"{s}: ensemble {metric} {m[metric]:.4f}"
        for name, c in report["paired"][s].items():
            line += f"; vs {name} {c['b']:.4f}: {c['diff'] * 100:+.2f} ± {c['se'] * 100:.2f} pts"
        typer.echo(line)
    weights = ", ".join(f"{n} {w:g}" for n, w in report["weights"].items())
    typer.echo(f"weights (chosen on dev): {weights} -> {out}")
    if cascade is not None:
        c = report["cascade"]
        shares = ", ".join(f"{s} {d:.1%}" for s, d in c["deferred"].items())
        typer.echo(f"cascade threshold (chosen on dev, at most {cascade:.0%} deferred): {c['threshold']:.4f}; deferred to the other members: {shares}")  # fmt: skip
