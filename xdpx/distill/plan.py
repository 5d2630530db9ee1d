"""The teacher -> student distillation pipeline, the plan half: its params, the configs of its
steps, the k-copy subsets of the labelled transfer set and the ship rule.

The pipeline (``distill/dvc.yaml``, ``python -m flows.distill``, ``xdpx distill``;
docs/distillation.md) runs these steps, each a function of ``stages.distill`` (it runs the
stages, which a core module may not import; :mod:`xdpx.cv` and ``flows/cv.py`` split the
same way):

1. ``configs``: :func:`step_configs` resolves ``distill/params.yaml`` (a :class:`DistillPlan`),
   the teacher's and the student's params files (``extends`` chains followed) and their
   overrides into one small YAML per step under ``configs_dir``, holding only what that
   step reads. DVC hashes those files, so an edit that changes no step's config (a comment,
   another section of ``params.yaml``) re-runs this cheap step and nothing after it.
2. ``teacher``: prepro + train of the teacher (any params file, e.g. ``params/bert-e5.yaml``)
   on ``raw``, into ``teacher.data_dir`` and ``teacher.save_dir``.
3. ``transfer``: the transfer set (:func:`xdpx.distill.transfer.build_transfer_set`), built
   once with the largest ``grid.copies``.
4. ``label``: the teacher's logits on every transfer row
   (:func:`xdpx.distill.transfer.label_transfer_set`; resumable).
5. ``students``: the student config trained on the gold train split alone (``alone``: the
   n-gram alone with the shipped ``params.yaml``), then once per grid point
   (:class:`GridPoint`: ``distill_alpha``, ``distill_temperature``, ``copies``) on the
   labelled transfer set cut to ``copies`` copies per text (:func:`write_copies_subset`),
   each with its best-of-dev checkpoint (the epochs: the per-epoch dev curve).
6. ``decide``: the teacher, ``alone`` and the best grid point on dev and test, and the ship
   rule (:func:`decide`) -> ``report_dir/decision.json`` and ``decision.md``.
7. ``export``: the shipped model's ONNX export into ``ship_dir`` (with the decision).

**Copies of the grid.** The transfer file holds, after the ``n`` train rows, ``k_max``
copies of each train text in a row (copy ``c`` of text ``i`` at row ``n + i * k_max + c``),
then the recombined pairs (``neighbour``, pair tasks), then the unlabelled rows. Copy ``c``
of text ``i`` draws from ``default_rng([seed, i, c, side])`` whatever ``k_max`` is, so the
first ``k`` copies of each text are exactly the copies a build with ``augment_copies = k``
makes: a smaller ``k`` is the *per-text* prefix of the copies (not a prefix of the file),
which :func:`write_copies_subset` streams out of the labelled file (ids renumbered). The teacher
labels each row alone (eval mode), so the subset's logits are those a ``k`` build would get
up to float rounding of other batch shapes.

**The ship rule.** The student (the grid point best on dev) ships only when its dev score
(``train.major_metric``) is above that of the student config trained on the gold labels alone;
otherwise the pipeline ships ``alone`` and ``decision.json`` says why. Test scores are
reported, never used for a choice.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from xdpx import io
from xdpx.config import (
    HF_MODELS,
    ConfigError,
    DistillConfig,
    EvaluateConfig,
    ExportConfig,
    Params,
    PreproConfig,
    TrainConfig,
    load_params,
    parse_override,
    read_yaml_mapping,
)
from xdpx.data import DataError
from xdpx.distill.ship_rule import (  # noqa: F401 - re-exported
    _fmt as _fmt,
    decide,
    decision_markdown,
    kept_share,
)
from xdpx.rundir import RunDir

__all__ = [
    "STEPS",
    "PLAN_FILE",
    "ModelSpec",
    "TransferPaths",
    "Grid",
    "GridPoint",
    "DistillPlan",
    "TeacherStep",
    "TransferStep",
    "LabelStep",
    "StudentsStep",
    "DecideStep",
    "ExportStep",
    "STEP_MODELS",
    "load_plan",
    "config_files",
    "step_configs",
    "write_step_configs",
    "read_step_config",
    "write_copies_subset",
    "decide",
    "kept_share",
    "decision_markdown",
]

#: The steps in order: ``distill/dvc.yaml``'s stages and the flow's tasks.
STEPS = ("configs", "teacher", "transfer", "label", "students", "decide", "export")
#: The pipeline's params file.
PLAN_FILE = "distill/params.yaml"
#: Where the params files of teacher and student may live: ``distill/dvc.yaml``'s
#: ``configs`` stage lists these as deps, so an ``extends`` chain must stay inside them.
CONFIG_DEPS = ("params.yaml", "params/", "distill/")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSpec(_Strict):
    """``teacher`` / ``student``: a params file plus overrides, and where the step writes."""

    params: str = Field(
        description="Params file (its prepro and train sections; extends followed)."
    )
    overrides: list[str] = Field([], description="section.key=value applied after the file.")
    data_dir: str = Field(description="Prepared data written here (the student: one subdir per k).")
    save_dir: str = Field(description="Run(s) written here (the student: one subdir per run).")


class StudentSpec(ModelSpec):
    """``student``: a :class:`ModelSpec` that may start from the teacher's weights."""

    from_teacher: bool = Field(
        False,
        description=(
            "hf_classifier students: train.pretrained_model = the teacher's best checkpoint "
            "(its embeddings, first grid.layers layers and head; DistilBERT / Sajjad et al. "
            "2020); the student's tokenizer must be the teacher's."
        ),
    )


class BaselineSpec(_Strict):
    """``baseline``: the fast model a student must beat to ship (the n-gram default), trained
    on the gold labels under ``student.data_dir/baseline`` and ``student.save_dir/baseline``."""

    params: str = Field(description="Params file (its prepro and train sections).")
    overrides: list[str] = Field([], description="section.key=value applied after the file.")


class TransferPaths(_Strict):
    """``transfer``: the two files of :mod:`xdpx.distill.transfer`."""

    out_file: str = Field(description="The transfer set (step transfer).")
    labelled_file: str = Field(description="The teacher-labelled transfer set (step label).")


class Grid(_Strict):
    """``grid``: every combination is one student run, scored on dev."""

    alpha: list[float] = Field([0.3, 0.5], min_length=1, description="train.distill_alpha values.")
    temperature: list[float] = Field([2.0, 4.0], min_length=1, description="train.distill_temperature values.")  # fmt: skip
    copies: list[int] = Field([0, 1], min_length=1, description="Augmented copies per text (k).")
    layers: list[int | None] = Field(
        [None],
        min_length=1,
        description=(
            "hf_classifier students: train.hf_config.num_hidden_layers (the first L layers of "
            "the student's pretrained model or, with student.from_teacher, of the teacher); "
            "null = as the student config has it. Each L also trains alone-l<L> (gold labels)."
        ),
    )

    @field_validator("layers")
    @classmethod
    def _layers_positive(cls, v: list[int | None]) -> list[int | None]:
        if any(x is not None and x < 1 for x in v):
            raise ValueError(f"every layers value must be >= 1 or null, got {v}")
        return v

    @field_validator("alpha")
    @classmethod
    def _alpha_in_unit(cls, v: list[float]) -> list[float]:
        if any(not 0 <= a <= 1 for a in v):
            raise ValueError(f"every alpha must be in [0, 1], got {v}")
        return v

    @field_validator("temperature")
    @classmethod
    def _positive(cls, v: list[float]) -> list[float]:
        if any(t <= 0 for t in v):
            raise ValueError(f"every temperature must be > 0, got {v}")
        return v

    @field_validator("copies")
    @classmethod
    def _non_negative(cls, v: list[int]) -> list[int]:
        if any(k < 0 for k in v):
            raise ValueError(f"every copies value must be >= 0, got {v}")
        return v

    def points(self) -> list[GridPoint]:
        """Every combination, in the order layers, alpha, temperature, copies (the last
        fastest)."""
        return [
            GridPoint(alpha=a, temperature=t, copies=k, layers=n)
            for n, a, t, k in itertools.product(
                self.layers, self.alpha, self.temperature, self.copies
            )
        ]


class GridPoint(_Strict):
    """One student run: ``distill_alpha``, ``distill_temperature``, ``copies`` (k) and the
    transformer student's ``layers`` (None: the student config's own)."""

    alpha: float
    temperature: float
    copies: int
    layers: int | None = None

    @property
    def name(self) -> str:
        """``a0.5-t2-k4`` (``l2-a0.5-t2-k4`` with layers): the run's directory under
        ``student.save_dir``."""
        base = f"a{self.alpha:g}-t{self.temperature:g}-k{self.copies}"
        return base if self.layers is None else f"l{self.layers}-{base}"

    @property
    def alone(self) -> str:
        """The run of the same student architecture on the gold labels alone."""
        return "alone" if self.layers is None else f"alone-l{self.layers}"


class DistillPlan(_Strict):
    """``distill/params.yaml``: the teacher -> student pipeline. Relative paths are relative
    to the project root (the stages run there, ``wdir: ..``). Every output path is here once;
    ``distill/dvc.yaml`` names each step's inputs by the producing step's key."""

    raw: str = Field("data/raw", description="train.tsv, dev.tsv, test.tsv: prepro.data_source of teacher and student.")  # fmt: skip
    teacher: ModelSpec
    student: StudentSpec
    baseline: BaselineSpec | None = Field(
        None,
        description=(
            "The fast model a student must beat on dev to ship (e.g. params.yaml, the n-gram); "
            "null = the student config trained on the gold labels (alone)."
        ),
    )
    transfer: TransferPaths
    grid: Grid = Field(default_factory=Grid)
    configs_dir: str = Field(description="One resolved config per step (step configs).")
    report_dir: str = Field(description="decision.json, decision.md and the metrics (step decide).")
    ship_dir: str = Field(description="The shipped model's ONNX export (step export).")


# ---------------------------------------------------------------------- step configs
class TeacherStep(_Strict):
    """Step ``teacher``: the teacher's prepro and train sections."""

    prepro: PreproConfig
    train: TrainConfig


class TransferStep(_Strict):
    """Step ``transfer``: the student's ``distill`` section (augment_copies = the largest
    k) and its ``prepro`` section (the files' format and columns)."""

    prepro: PreproConfig
    distill: DistillConfig


class LabelStep(_Strict):
    """Step ``label``: the ``distill`` keys labelling reads."""

    distill: DistillConfig


class StudentsStep(_Strict):
    """Step ``students``: the student's prepro and train sections, the grid, the labelled
    file (built with ``built_copies`` copies per text) and where the step writes."""

    prepro: PreproConfig
    train: TrainConfig
    grid: Grid
    labelled_file: str
    built_copies: int
    data_dir: str
    save_dir: str
    baseline_prepro: PreproConfig | None = None
    baseline_train: TrainConfig | None = None


class DecideStep(_Strict):
    """Step ``decide``: the runs to score, the evaluate section and where to write."""

    evaluate: EvaluateConfig
    teacher_run: str
    teacher_data: str
    grid: Grid
    data_dir: str
    save_dir: str
    major_metric: str
    report_dir: str
    baseline: bool = False


class ExportStep(_Strict):
    """Step ``export``: the student's export section, the decision and the output dir."""

    export: ExportConfig
    decision_file: str
    ship_dir: str


STEP_MODELS: dict[str, type[BaseModel]] = {
    "teacher": TeacherStep,
    "transfer": TransferStep,
    "label": LabelStep,
    "students": StudentsStep,
    "decide": DecideStep,
    "export": ExportStep,
}


def _nested_override(raw: dict[str, Any], item: str) -> None:
    """Apply ``a.b.c=value`` (or a top-level ``raw=...``) to the nested mapping ``raw`` (the
    plan's keys nest deeper than params sections, and some are top-level).

    Raises:
        ConfigError: the item is not ``key=value``, or a key on its path is not a mapping.
    """
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key.sub=value")
    path = item.split("=", 1)[0].strip()
    if "." in path:
        _, _, value = parse_override(item)
    else:
        _, _, value = parse_override(f"_.{item}")
    keys = path.split(".")
    node = raw
    for k in keys[:-1]:
        node = node.setdefault(k, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {item!r}: {k} is not a mapping")
    node[keys[-1]] = value


def load_plan(path: str = PLAN_FILE, overrides: list[str] | tuple[str, ...] = ()) -> DistillPlan:
    """Read the pipeline's params file and apply ``key.sub=value`` overrides
    (``grid.alpha=[0.5]``, ``teacher.params=params/bert-minilm.yaml``).

    Raises:
        ConfigError: a missing or malformed file, an unknown key or a bad value (naming the
            file and the key).
    """
    raw = read_yaml_mapping(path, "the distillation pipeline's params file")
    for item in overrides:
        _nested_override(raw, item)
    try:
        return DistillPlan(**raw)
    except ValidationError as e:
        where = "; ".join(
            f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors()
        )
        raise ConfigError(f"{path}: {where}") from None


def config_files(path: str) -> list[str]:
    """``path`` and the files its ``extends`` chain merges in, as normalised relative paths."""
    out, seen = [], set()
    while path:
        norm = os.path.normpath(path)
        if norm in seen:
            raise ConfigError(f"{path}: extends itself")
        seen.add(norm)
        out.append(norm)
        if not io.exists(path):
            break
        raw = yaml.safe_load(io.read_text(path)) or {}
        parent = raw.get("extends") if isinstance(raw, dict) else None
        path = os.path.join(os.path.dirname(path), parent) if parent else ""
    return out


def _check_deps(plan_file: str, role: str, params: str) -> None:
    """An ``extends`` chain that leaves :data:`CONFIG_DEPS` would change a step unseen."""
    for f in config_files(params):
        if not any(f == d or f.startswith(d) for d in CONFIG_DEPS):
            raise ConfigError(
                f"{plan_file}: {role}.params={params} reads {f}, outside what distill/dvc.yaml's "
                f"configs stage depends on ({', '.join(CONFIG_DEPS)}); put the file under params/"
            )


def _model_params(plan_file: str, role: str, spec: ModelSpec, plan: DistillPlan) -> Params:
    _check_deps(plan_file, role, spec.params)
    return load_params(spec.params, [*spec.overrides, f"prepro.data_source={plan.raw}"])


def _dump(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json")


def step_configs(plan: DistillPlan, plan_file: str = PLAN_FILE) -> dict[str, dict[str, Any]]:
    """The config of every step after ``configs``: step name -> a mapping that
    ``STEP_MODELS[step]`` validates, holding only what that step reads (so a step re-runs
    only when its own config changes).

    The paths come from the plan: the teacher's ``prepro.data_dir`` / ``train.data_dir`` =
    ``teacher.data_dir``, ``train.save_dir`` = ``teacher.save_dir`` (``overwrite``: the
    directory is the pipeline's own); the transfer files; ``distill.teacher`` =
    ``<teacher.save_dir>/<best>``. ``distill.augment_copies`` = the largest ``grid.copies``.

    Raises:
        ConfigError: a bad params file or override, an ``extends`` chain outside
            :data:`CONFIG_DEPS`, or a config the pipeline cannot use (a regression task,
            ``lazy_load`` with distillation).
    """
    t = _model_params(plan_file, "teacher", plan.teacher, plan)
    s = _model_params(plan_file, "student", plan.student, plan)
    b = _model_params(plan_file, "baseline", plan.baseline, plan) if plan.baseline else None  # type: ignore[arg-type]
    roles = [("teacher", t), ("student", s)] + ([("baseline", b)] if b else [])
    layered = any(n is not None for n in plan.grid.layers)
    if (layered or plan.student.from_teacher) and s.train.model not in HF_MODELS:
        raise ConfigError(f"{plan_file}: grid.layers / student.from_teacher need a transformers student (train.model={s.train.model})")  # fmt: skip
    if plan.student.from_teacher:
        if s.prepro.tokenizer_path != t.prepro.tokenizer_path:
            raise ConfigError(f"{plan_file}: student.from_teacher needs the teacher's tokenizer: student prepro.tokenizer_path={s.prepro.tokenizer_path}, teacher's {t.prepro.tokenizer_path}")  # fmt: skip
        s = s.model_copy(
            update={
                "train": s.train.model_copy(
                    update={"pretrained_model": RunDir(plan.teacher.save_dir).best}
                )
            }  # fmt: skip
        )
    for role, p in roles:
        if p.train.task != "classification" or p.prepro.label_type != "class":
            raise ConfigError(f"{plan_file}: {role}: distillation needs classification (task={p.train.task}, label_type={p.prepro.label_type})")  # fmt: skip
    tp = t.prepro.model_copy(update={"data_dir": plan.teacher.data_dir})
    tt = t.train.model_copy(
        update={
            "data_dir": plan.teacher.data_dir,
            "save_dir": plan.teacher.save_dir,
            "overwrite": True,
        }  # fmt: skip
    )
    k_max = max(plan.grid.copies)
    distill = s.distill.model_copy(
        update={
            "augment_copies": k_max,
            "out_file": plan.transfer.out_file,
            "labelled_file": plan.transfer.labelled_file,
            "teacher": f"{plan.teacher.save_dir.rstrip('/')}/<best>",
        }
    )
    label = DistillConfig(
        train_file=distill.train_file,
        out_file=distill.out_file,
        labelled_file=distill.labelled_file,
        teacher=distill.teacher,
        chunk_rows=distill.chunk_rows,
        batch_size=distill.batch_size,
    )
    students = StudentsStep(
        prepro=s.prepro.model_copy(update={"data_dir": plan.student.data_dir}),
        train=s.train.model_copy(update={"overwrite": True}),
        grid=plan.grid,
        labelled_file=plan.transfer.labelled_file,
        built_copies=k_max,
        data_dir=plan.student.data_dir,
        save_dir=plan.student.save_dir,
        baseline_prepro=b.prepro.model_copy(
            update={"data_dir": io.join(plan.student.data_dir, "baseline")}
        )
        if b
        else None,  # fmt: skip
        baseline_train=b.train.model_copy(update={"overwrite": True}) if b else None,
    )
    decide_cfg = DecideStep(
        evaluate=s.evaluate,
        teacher_run=plan.teacher.save_dir,
        teacher_data=plan.teacher.data_dir,
        grid=plan.grid,
        data_dir=plan.student.data_dir,
        save_dir=plan.student.save_dir,
        major_metric=s.train.major_metric,
        report_dir=plan.report_dir,
        baseline=b is not None,
    )
    export = ExportStep(
        export=s.export,
        decision_file=io.join(plan.report_dir, "decision.json"),
        ship_dir=plan.ship_dir,  # fmt: skip
    )
    return {
        "teacher": _dump(TeacherStep(prepro=tp, train=tt)),
        "transfer": _dump(TransferStep(prepro=s.prepro, distill=distill)),
        "label": _dump(LabelStep(distill=label)),
        "students": _dump(students),
        "decide": _dump(decide_cfg),
        "export": _dump(export),
    }


def write_step_configs(configs: dict[str, dict[str, Any]], configs_dir: str) -> list[str]:
    """Write ``<configs_dir>/<step>.yaml`` for each step (atomically, keys in a fixed order so
    the same config gives the same bytes); returns the paths."""
    out = []
    for step, cfg in configs.items():
        path = io.join(configs_dir, f"{step}.yaml")
        io.write_text(path, f"# step {step} of distill/dvc.yaml, written by its configs stage\n" + yaml.safe_dump(cfg, sort_keys=True, allow_unicode=True))  # fmt: skip
        out.append(path)
    return out


def read_step_config(configs_dir: str, step: str) -> BaseModel:
    """``<configs_dir>/<step>.yaml`` as ``STEP_MODELS[step]``.

    Raises:
        ConfigError: the file is missing (run the configs step) or does not validate.
    """
    path = io.join(configs_dir, f"{step}.yaml")
    if not io.exists(path):
        raise ConfigError(f"{path}: missing; run the configs step first (python -m stages.distill configs)")  # fmt: skip
    try:
        return STEP_MODELS[step](**(yaml.safe_load(io.read_text(path)) or {}))
    except ValidationError as e:
        raise ConfigError(f"{path}: {e.errors()[0]['loc']}: {e.errors()[0]['msg']}") from None


# ---------------------------------------------------------------------- k-copy subsets
def _lines(path: str) -> Iterator[str]:
    with open(path, encoding="utf-8", newline="") as f:
        yield from f


def write_copies_subset(labelled_file: str, out_file: str, built: int, copies: int) -> int:
    """Stream the labelled transfer set (built with ``built`` copies per text) into
    ``out_file`` with the first ``copies`` copies of each text (module docstring): the train
    rows, copies ``0 .. copies-1`` of each text, the recombined pairs, the unlabelled rows;
    ids renumbered ``0, 1, ...``. Written atomically; returns the rows written.

    Raises:
        ConfigError: ``copies`` > ``built``.
        DataError: the file's ``origin`` column does not follow the layout (``file:line``).
    """
    if copies > built:
        raise ConfigError(f"copies={copies}: the transfer set holds {built} copies per text")
    n_train, aug_seen, rows = 0, 0, 0
    with io.open_atomic(out_file, "w") as out:
        lines = _lines(labelled_file)
        header = next(lines, "")
        cols = header.rstrip("\r\n").split("\t")
        if "origin" not in cols or cols[0] != "id":
            raise DataError(f"{labelled_file}:1: not a labelled transfer set header: {cols}")
        origin_at = cols.index("origin")
        out.write(header)
        for n, line in enumerate(lines, start=2):
            fields = line.rstrip("\r\n").split("\t")
            if len(fields) != len(cols):
                raise DataError(f"{labelled_file}:{n}: expected {len(cols)} fields, got {len(fields)}")  # fmt: skip
            origin = fields[origin_at]
            if origin == "train":
                if aug_seen:
                    raise DataError(f"{labelled_file}:{n}: a train row after the copies")
                n_train += 1
            elif origin == "augment":
                aug_seen += 1
                if (aug_seen - 1) % built >= copies:
                    continue
            if origin in ("neighbour", "unlabelled") and aug_seen != n_train * built:
                raise DataError(
                    f"{labelled_file}:{n}: {aug_seen} copies before the {origin} rows, "
                    f"expected {n_train} texts x {built}"
                )
            fields[0] = str(rows)
            out.write("\t".join(fields) + "\n")
            rows += 1
    if aug_seen != n_train * built:
        raise DataError(f"{labelled_file}: {aug_seen} copies for {n_train} texts x {built}")
    return rows
