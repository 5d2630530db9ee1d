"""``xdpx convert-tf`` and ``xdpx export-tf`` (:mod:`xdpx.tf_checkpoint`): TensorFlow
checkpoints in Google's BERT layout, in and out; registered on the app by :mod:`xdpx.cli`."""

from __future__ import annotations

import typer

from xdpx.cli.common import _user_errors

#: How to get TensorFlow for ``--savedmodel`` (the optional extra).
TF_EXTRA = "pip install 'xdpx[tf]'   (tensorflow-cpu; or tensorflow on a GPU machine)"


def convert_tf(
    source: str = typer.Argument(..., help="A Google-format BERT checkpoint: its directory (bert_config.json, vocab.txt, bert_model.ckpt.*) or its prefix."),
    out: str = typer.Argument(..., help="The transformers directory to write (config.json, model.safetensors, tokenizer)."),
    lower: bool = typer.Option(None, "--lower/--cased", help="The WordPiece tokenizer lower-cases (default: bert_config.json's do_lower_case, else from the release's name: cased_... -> --cased, else --lower)."),
) -> None:  # fmt: skip
    """A TensorFlow BERT checkpoint as a transformers / safetensors directory, once (XDPX's `export_pt`).

    Reads the tensor bundle without TensorFlow, checks every tensor's CRC32C, maps Google's
    variable names to transformers' (kernels transposed; Adam's slots, `global_step` and the
    pre-training heads left out; a fine-tuned classifier head kept) and builds the WordPiece
    tokenizer from `vocab.txt`. `train.pretrained_model` and `prepro.tokenizer_path` also take
    the TensorFlow directory itself (converted once into the cache): this command is for
    keeping the converted directory.

    **Examples:**

    `xdpx convert-tf chinese_L-12_H-768_A-12 models/bert-chinese`

    `xdpx convert-tf cased_L-12_H-768_A-12/bert_model.ckpt models/bert-cased --cased`

    `xdpx train train.model=hf_classifier train.pretrained_model=models/bert-chinese`
    """
    from xdpx.tf_checkpoint import convert_google_bert

    with _user_errors():
        r = convert_google_bert(source, out, lower)
    head = f"its {r['num_labels']}-class classifier head kept" if r["head"] else "no classifier head (a new one at fine-tuning)"  # fmt: skip
    typer.echo(f"{r['prefix']}: {r['tensors']} tensors read (CRC32C checked), {r['kept']} kept, {len(r['skipped'])} left out (optimizer slots, global_step, pre-training heads); {head}; do_lower_case {r['do_lower_case']} -> {out}")  # fmt: skip


def export_tf(
    checkpoint: str = typer.Argument(..., help="An xdpx checkpoint of a BERT-family hf_classifier: a checkpoint dir or `<run>/<best>`."),
    out: str = typer.Argument(..., help="The directory to write: bert_model.ckpt.*, bert_config.json, vocab.txt, target_map.txt (and saved_model/)."),
    savedmodel: bool = typer.Option(False, "--savedmodel", help="Also write a SavedModel (out/saved_model, signature serving_default: input_ids -> logits); needs TensorFlow."),
) -> None:  # fmt: skip
    """A fine-tuned model as a TensorFlow checkpoint in Google's BERT layout (XDPX's `export_tf`).

    The weights under Google's names (`output_weights`/`output_bias` for the classifier),
    written by xdpx's own tensor-bundle writer (no TensorFlow needed), which TensorFlow's
    `tf.train.load_checkpoint` reads. `--savedmodel` also builds the BERT classifier in
    TensorFlow from that checkpoint and saves it for TF Serving (`serving_default`:
    `input_ids [batch, seq_len]` int64, padding id 0, to `logits [batch, num_labels]`).

    **Examples:**

    `xdpx export-tf 'models/minilm/<best>' export/minilm-tf`

    `xdpx export-tf 'models/bert-chinese-run/<best>' export/tf --savedmodel`
    """
    from xdpx.tf_checkpoint import export_google_bert

    with _user_errors():
        if savedmodel:
            try:
                import tensorflow  # noqa: F401
            except ImportError:
                raise ValueError(f"--savedmodel needs TensorFlow, which is not installed: {TF_EXTRA}") from None  # fmt: skip
        r = export_google_bert(checkpoint, out)
        typer.echo(f"{r['checkpoint']}: {r['tensors']} tensors -> {r['prefix']}.* ({len(r['labels'])} labels)")  # fmt: skip
        if savedmodel:
            from xdpx.tf_savedmodel import build_saved_model

            path = build_saved_model(out, f"{out.rstrip('/')}/saved_model")
            typer.echo(f"SavedModel (serving_default: input_ids -> logits) -> {path}")
