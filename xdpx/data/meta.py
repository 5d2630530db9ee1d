"""``meta.json``: what prepro wrote, as a typed model (:class:`PreparedMeta`).

prepro writes it into the prepared data directory; every checkpoint carries a copy
(``xdpx.checkpoint``), so the model's preprocessing can be rebuilt from the checkpoint
alone. Every reader goes through :meth:`PreparedMeta.read`, which names the file and the
field when it is not a meta.json this version of xdpx can read.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from xdpx import io
from xdpx.data.readers import DataError
from xdpx.data.vocab import spells_oov

META_FILE = "meta.json"


class SplitMeta(BaseModel):
    """One prepared split."""

    model_config = ConfigDict(extra="forbid")

    rows: int = Field(ge=0)
    skipped: int = Field(0, ge=0, description="Bad lines skipped (prepro.skip_bad_lines).")
    source: str | list[str] | None = Field(
        None, description="The raw file it was read from (a list when several)."
    )
    max_length_seen: int = Field(0, ge=0, description="Longest sequence before truncation.")
    truncated: int = Field(0, ge=0, description="Sequences cut to max_len.")
    has_labels: bool = True
    shards: int = Field(1, ge=0, description="Parquet shards written.")
    bad_lines: list[Any] = Field(default_factory=list)
    shard_rows: dict[str, int] | None = Field(
        None,
        description="Shard file name (under the split's directory) -> rows, in reading "
        "order; None in data prepared before it was recorded (the shards are listed).",
    )
    label_counts: list[int] | None = Field(
        None, description="Examples per class index (labelled rows only)."
    )
    control_stripped: int = Field(
        0,
        ge=0,
        description="Rows whose control characters were removed (control_chars: strip_warn or strip).",
    )


class PreparedMeta(BaseModel):
    """The content of a prepared data directory's ``meta.json``.

    ``version`` is :attr:`VERSION` for files this xdpx writes; a file without it (written
    before the field existed) is read when it has the same fields.
    """

    model_config = ConfigDict(extra="forbid")
    VERSION: ClassVar[int] = 1

    version: int = VERSION
    tokenizer: str = Field(description="Resolved tokenizer: char, word, whitespace or hf.")
    tokenizer_auto: dict[str, Any] | None = Field(
        None, description="prepro.tokenizer=auto: the choice and the share of no-space script."
    )
    lower: bool
    max_len: int = Field(ge=1)
    vocab_size: int = Field(ge=1)
    num_labels: int = Field(ge=1)
    labels: list[str]
    pad_id: int = 0
    unk_id: int | None = None
    sep_id: int | None = None
    pair: bool = Field(False, description="Text pairs encoded separately (input_ids2).")
    pair_encoding: Literal["separate", "joint"] | None = None
    splits: dict[str, SplitMeta]
    conflicts: dict[str, Any] | None = Field(
        None,
        description="Texts under two labels (xdpx.data.conflicts.Conflicts.report): action, "
        "texts, within (per split), across_train, rows, examples (file:line (label) pairs).",
    )
    overlaps: dict[str, dict[str, Any]] | None = Field(
        None,
        description="Texts shared by two splits (xdpx.data.overlaps.find_overlaps), per pair "
        "'a~b': splits, exact, near (case, whitespace, punctuation), rows, distinct, "
        "identical, examples (file:line pairs); None in data prepared before it was recorded.",
    )
    labels_missing: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Labelled split -> labels with train examples but none there.",
    )
    train_only_labels: list[str] = Field(
        default_factory=list, description="Labels with train examples and none in any other split."
    )
    prepro: dict[str, Any] = Field(description="The prepro section that wrote the data.")

    @classmethod
    def path_in(cls, directory: str) -> str:
        """``<directory>/meta.json``."""
        return io.join(directory, META_FILE)

    @classmethod
    def read(cls, directory: str) -> PreparedMeta:
        """Read ``<directory>/meta.json`` (a prepared data dir or a checkpoint).

        Raises:
            FileNotFoundError: no meta.json there (run prepro first).
            DataError: not JSON, written by a newer xdpx, or a field is missing or wrong;
                the message names the file and the field.
        """
        path = cls.path_in(directory)
        if not io.exists(path):
            raise FileNotFoundError(f"{path} not found (run prepro first)")
        try:
            raw = json.loads(io.read_text(path))
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(raw, dict):
            raise DataError(f"{path}: expected a JSON object, got {type(raw).__name__}")
        version = raw.get("version", cls.VERSION)
        if version != cls.VERSION:
            raise DataError(
                f"{path}: meta.json version {version} is not the version this xdpx reads "
                f"({cls.VERSION}); re-run prepro with this xdpx"
            )
        try:
            return cls.model_validate(raw)
        except ValidationError as e:
            err = e.errors()[0]
            field = ".".join(str(p) for p in err["loc"])
            raise DataError(
                f"{path}: field {field!r}: {err['msg']} (not a meta.json of xdpx prepro? "
                "re-run prepro)"
            ) from None

    @property
    def spells_oov(self) -> bool:
        """The data writes unknown words as ``[UNK]`` + ``##c`` tokens
        (:func:`xdpx.data.vocab.spells_oov`; False for data prepared before ``prepro.oov``)."""
        return spells_oov(self.prepro.get("oov", "unk"), self.tokenizer)

    def write(self, directory: str) -> str:
        """Write ``<directory>/meta.json`` atomically; returns its path."""
        path = self.path_in(directory)
        io.write_text(path, self.model_dump_json(indent=2) + "\n")
        return path

    def split(self, name: str) -> SplitMeta:
        """The split ``name``.

        Raises:
            DataError: no such split (names the splits there are).
        """
        if name not in self.splits:
            raise DataError(
                f"no split {name!r} in the prepared data (splits: {sorted(self.splits)})"
            )
        return self.splits[name]
