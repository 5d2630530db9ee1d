"""The teacher -> student distillation pipeline (distill/dvc.yaml, flows/distill.py,
stages/distill.py, xdpx/distill/plan.py): `dvc repro distill/dvc.yaml` end to end and a
no-op second repro, the Prefect flow (`xdpx distill`) with its decision artifact, the k-copy
subsets and the ship rule. The transfer set's streaming (chunk_rows 7 < the rows) and the
resumed labelling are tests/test_transfer.py's.

One tiny project serves every test: 300 train / 100 dev / 100 test real reviews, a teacher
that learns nothing (ngram_lr, one update at learning rate 1e-9) and an ngram_lr student in
2^12 buckets; the grid is alpha 1 (the teacher alone teaches), T 2, copies 0 and 2. So the
students lose to the n-gram on the gold labels alone, and the pipeline ships it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import import_closure  # noqa: E402

#: The student: params.yaml with these changes (tiny and quick).
STUDENT = {
    "prepro": {"max_len": 64},
    "train": {"ngram_buckets": 4096, "batch_size": 16, "max_epoch": 3, "threads": 1},
    "distill": {"chunk_rows": 128, "batch_size": 64},
    "export": {"num_samples": 16, "latency_runs": 1},
}
#: The teacher (params/teacher.yaml, extending params.yaml): learning rate 1e-9, one update.
TEACHER = {"extends": "../params.yaml", "train": {"learning_rate": 1.0e-9, "max_update": 1}}
PLAN_OVERRIDES = {
    "teacher": {"params": "params/teacher.yaml"},
    "grid": {"alpha": [1.0], "temperature": [2.0], "copies": [0, 2]},
}


def _write_project(root: Path, raw_src: str) -> Path:
    """A project tree in ``root``: code, tiny params, distill/ and data/raw (300/100/100)."""
    root.mkdir(parents=True, exist_ok=True)
    for name in ("xdpx", "stages"):
        shutil.copytree(ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in (".gitignore", ".dvcignore"):
        shutil.copy(ROOT / name, root / name)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    for section, values in STUDENT.items():
        params[section].update(values)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (root / "params").mkdir()
    (root / "params" / "teacher.yaml").write_text(yaml.safe_dump(TEACHER, sort_keys=False))
    (root / "distill").mkdir()
    shutil.copy(ROOT / "distill" / "dvc.yaml", root / "distill" / "dvc.yaml")
    plan = yaml.safe_load((ROOT / "distill" / "params.yaml").read_text())
    for key, values in PLAN_OVERRIDES.items():
        plan[key].update(values)
    (root / "distill" / "params.yaml").write_text(yaml.safe_dump(plan, sort_keys=False))
    raw = root / "data" / "raw"
    raw.mkdir(parents=True)
    for split, n in (("train", 300), ("dev", 100), ("test", 100)):
        lines = Path(raw_src, f"{split}.tsv").read_text(encoding="utf-8").splitlines()
        (raw / f"{split}.tsv").write_text("\n".join(lines[: n + 1]) + "\n", encoding="utf-8")
    return root


def _sh(*args: str, cwd: Path, env: dict) -> str:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(args)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def raw_src(real_subset):
    return real_subset[0]


def _check_decision(root: Path) -> dict:
    decision = json.loads((root / "reports/distill/decision.json").read_text())
    assert [r["run"] for r in decision["grid"]] == ["a1-t2-k0", "a1-t2-k2"]
    assert all(r["best_epoch"] in (1, 2, 3) for r in decision["grid"])
    # the teacher learnt nothing; the students (alpha 1: the teacher alone) lose on dev
    assert decision["dev"]["student"] <= decision["dev"]["alone"]
    assert decision["shipped"] == "alone" and decision["run"] == "alone"
    assert decision["reason"].startswith("keeps alone: ")
    # the paired comparisons on the same 100 texts: student and teacher against alone
    dev = decision["paired"]["dev"]
    assert dev["n"] == 100 and dev["method"] == "McNemar exact"
    assert dev["diff"] == pytest.approx(decision["dev"]["student"] - decision["dev"]["alone"])
    assert dev["diff"] * 100 == pytest.approx(dev["a_only"] - dev["b_only"])
    assert set(decision["paired"]) == {"dev", "test", "teacher_dev", "teacher_test"}
    assert decision["kept_share"] is None or decision["teacher_gain"] > 0
    assert decision["checkpoint"] == "models/distill/student/alone/best"
    shipped = root / "models/distill/shipped"
    assert (shipped / "model.onnx").exists() and (shipped / "report.json").exists()
    assert json.loads((shipped / "decision.json").read_text()) == decision
    return decision


@pytest.fixture(scope="module")
def repro(raw_src, tmp_path_factory):
    """The tiny project after `dvc repro distill/dvc.yaml`, then a second repro and `dvc
    status`: ``(root, env, second repro's output, status output)``."""
    root = _write_project(tmp_path_factory.mktemp("dvc") / "p", raw_src)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "DVC_NO_ANALYTICS": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(root),
    }
    _sh("dvc", "init", "-q", "--no-scm", cwd=root, env=env)
    _sh("dvc", "repro", "distill/dvc.yaml", cwd=root, env=env)
    again = _sh("dvc", "repro", "distill/dvc.yaml", cwd=root, env=env)
    status = _sh("dvc", "status", "distill/dvc.yaml", cwd=root, env=env)
    return root, env, again, status


@pytest.mark.e2e
def test_dvc_repro_runs_the_pipeline_and_a_second_repro_is_a_no_op(repro):
    root, _, again, status = repro
    _check_decision(root)
    # the k=0 students trained on the 300 train rows alone, the k=2 ones on 300 + 600 copies
    sub = (root / "data/distill/student/k0-subset/labelled.tsv").read_text().splitlines()
    assert len(sub) == 301 and sub[-1].split("\t")[0] == "299"
    assert len((root / "data/distill/labelled.tsv").read_text().splitlines()) == 901
    assert "Running stage" not in again, again
    assert "up to date" in status, status


@pytest.mark.e2e
def test_a_first_xdpx_distill_runs_the_steps_publishes_the_decision_and_prints_no_error(repro, tmp_path):  # fmt: skip
    """The first contact and the flow: `xdpx distill --no-teacher` in a fresh PREFECT_HOME
    (Prefect's temporary server, as a new user gets it), in the repro'd project with its
    teacher.

    - It succeeds and prints no ERROR or traceback: the server's telemetry heartbeat (an
      ERROR offline, then "database is locked" in SQLite) is off unless the user turns it
      on (flows/__init__.py).
    - Its outputs are DVC's (the same plan as the repro's: `dvc status` stays clean).
    - Every step but the teacher ran (the flow logs ``<step> done``).
    - What the server recorded, read back from that PREFECT_HOME's database once the CLI
      (and its server) have exited: one completed flow run and the decision as its markdown
      artifact, equal to ``decision.md``. (One flow run in this file: an in-process run
      against the session's server checked the same for ~45 CPU-s more.)
    """
    from xdpx.distill.plan import STEPS

    root, env, _, _ = repro
    env = {k: v for k, v in env.items() if k != "PREFECT_SERVER_ANALYTICS_ENABLED"}
    home = tmp_path / "prefect"
    env["PREFECT_HOME"] = str(home)
    out = _sh(sys.executable, "-m", "xdpx.cli", "distill", "--no-teacher", cwd=root, env=env)
    assert "Flow run" in out and "Finished in state Completed" in out, out[-2000:]
    noisy = [line for line in out.splitlines() if "ERROR" in line or "Traceback" in line]
    assert not noisy, "\n".join(noisy[:5])
    assert "teacher: using the run in models/distill/teacher" in out, out[-2000:]
    for step in STEPS:
        if step not in ("configs", "teacher"):
            assert f"{step} done" in out, (step, out[-2000:])
    _check_decision(root)
    status = _sh("dvc", "status", "distill/dvc.yaml", cwd=root, env=env)
    assert "up to date" in status, status

    with contextlib.closing(sqlite3.connect(home / "prefect.db")) as db:
        [(flow_run, state)] = db.execute(
            "SELECT id, state_type FROM flow_run WHERE flow_id IN (SELECT id FROM flow WHERE name = 'xdpx-distill')"  # fmt: skip
        ).fetchall()
        artifacts = db.execute("SELECT key, type, data FROM artifact WHERE flow_run_id = ?", (flow_run,)).fetchall()  # fmt: skip
    assert state == "COMPLETED"
    [(key, kind, data)] = artifacts
    assert (key, kind) == ("xdpx-local-distill", "markdown")
    markdown = json.loads(data)
    assert markdown == (root / "reports/distill/decision.md").read_text()
    assert "ships **alone**" in markdown and "keeps alone: " in markdown and "`a1-t2-k2`" in markdown  # fmt: skip


# ---------------------------------------------------------------------- unit
@pytest.mark.unit
@pytest.mark.parametrize("student_dev, shipped", [(0.80, "student"), (0.75, "alone")])
def test_the_ship_rule_ships_the_student_only_above_the_ngram_alone_on_dev(student_dev, shipped):
    from xdpx.distill.plan import decide, decision_markdown

    def m(dev, test):
        return {"dev": {"accuracy": dev}, "test": {"accuracy": test}}

    grid = [
        {
            "alpha": 0.5,
            "temperature": 2.0,
            "copies": 4,
            "run": "a0.5-t2-k4",
            "dev": student_dev - 0.01,
            "best_epoch": 1,
        },  # fmt: skip
        {
            "alpha": 0.9,
            "temperature": 2.0,
            "copies": 4,
            "run": "a0.9-t2-k4",
            "dev": student_dev,
            "best_epoch": 3,
        },  # fmt: skip
    ]
    d = decide(grid, m(0.75, 0.99), m(0.85, 0.5), m(student_dev, 0.1), "accuracy")
    assert d["shipped"] == shipped and d["student_run"] == "a0.9-t2-k4"
    assert d["run"] == ("a0.9-t2-k4" if shipped == "student" else "alone")
    assert d["kept_share"] == pytest.approx((student_dev - 0.75) / 0.10)
    assert d["test"] == {"teacher": 0.5, "alone": 0.99, "student": 0.1}  # reported, not used
    assert ("beats" if shipped == "student" else "no grid point beats") in d["reason"]
    assert "| `a0.9-t2-k4` | – | 0.9 | 2 | 4 | " in decision_markdown(d)


@pytest.mark.unit
def test_a_copies_subset_is_the_per_text_prefix_of_the_copies(tmp_path):
    from xdpx.distill.plan import write_copies_subset

    rows = ["id\ttext\tlabel\torigin\tgold"]
    texts = [("t0", "train"), ("t1", "train")]
    texts += [(f"t{i}c{c}", "augment") for i in range(2) for c in range(3)]
    texts += [("n0", "neighbour"), ("u0", "unlabelled")]
    rows += [f"{n}\t{t}\tx\t{o}\t1" for n, (t, o) in enumerate(texts)]
    src = tmp_path / "labelled.tsv"
    src.write_text("\n".join(rows) + "\n")
    out = tmp_path / "k1.tsv"
    assert write_copies_subset(str(src), str(out), 3, 1) == 6
    got = [r.split("\t")[:2] for r in out.read_text().splitlines()[1:]]
    assert got == [["0", "t0"], ["1", "t1"], ["2", "t0c0"], ["3", "t1c0"], ["4", "n0"], ["5", "u0"]]  # fmt: skip
    assert write_copies_subset(str(src), str(out), 3, 0) == 4  # k 0: the recombined pairs stay
    with pytest.raises(ValueError, match="holds 3 copies"):
        write_copies_subset(str(src), str(out), 3, 4)
    with pytest.raises(
        ValueError, match="6 copies before the neighbour rows, expected 2 texts x 4"
    ):
        write_copies_subset(str(src), str(out), 4, 1)


@pytest.mark.unit
def test_every_step_of_distill_dvc_yaml_lists_its_code_and_reads_only_its_config(monkeypatch):
    import functools

    from stages.distill import BASE_MODULES, STEP_MODULES
    from xdpx.distill.plan import STEPS

    # each file parsed once for the 9 closures (they share most files)
    cached = functools.lru_cache(maxsize=None)(import_closure.imported_names)
    monkeypatch.setattr(import_closure, "imported_names", cached)

    stages = yaml.safe_load((ROOT / "distill" / "dvc.yaml").read_text())["stages"]
    assert list(stages) == list(STEPS)
    modules = {m for mods in STEP_MODULES.values() for m in mods} | set(BASE_MODULES[1:])
    closure = {
        m: {p.relative_to(ROOT).as_posix() for p in import_closure.closure(m)} for m in modules
    }
    for step, stage in stages.items():
        assert stage["wdir"] == ".." and stage["cmd"].startswith(f"python -m stages.distill {step} ")  # fmt: skip
        deps = [d for d in stage["deps"] if "${" not in d]
        need = {"stages/distill.py", "stages/__init__.py"}
        for mod in (*BASE_MODULES[1:], *STEP_MODULES[step]):
            need |= closure[mod]
        missing = sorted(f for f in need if not any(f == d or f.startswith(d + "/") for d in deps))  # fmt: skip
        assert not missing, f"distill/dvc.yaml stage {step!r} runs {missing}, not in its deps"
        if step != "configs":
            assert f"${{configs_dir}}/{step}.yaml" in stage["deps"]


@pytest.mark.unit
def test_a_params_file_outside_the_configs_deps_is_refused(tmp_path, monkeypatch):
    from xdpx.config import ConfigError
    from xdpx.distill.plan import load_plan, step_configs

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.yaml").write_text("train: {max_epoch: 1}\n")
    plan = load_plan(str(ROOT / "distill" / "params.yaml"), ["teacher.params=mine.yaml"])
    with pytest.raises(ConfigError, match=r"teacher.params=mine.yaml reads mine.yaml"):
        step_configs(plan)
    with pytest.raises(ConfigError, match="grid.alpha"):
        load_plan(str(ROOT / "distill" / "params.yaml"), ["grid.alpha=[2]"])


@pytest.mark.unit
def test_overrides_reach_top_level_and_nested_plan_keys():
    """`xdpx distill raw=DIR report_dir=DIR grid.copies=[1,3] "teacher.overrides=[...]"`: the
    plan's top-level keys take an override as its sections' keys do."""
    from xdpx.config import ConfigError
    from xdpx.distill.plan import load_plan

    plan = load_plan(str(ROOT / "distill" / "params.yaml"), [
        "raw=/data/stsb", "report_dir=reports/distill-stsb", "grid.copies=[1, 3]",
        "teacher.overrides=[prepro.transliterate=null, train.threads=2]"])  # fmt: skip
    assert plan.raw == "/data/stsb" and plan.report_dir == "reports/distill-stsb"
    assert plan.grid.copies == [1, 3]
    assert plan.teacher.overrides == ["prepro.transliterate=null", "train.threads=2"]
    with pytest.raises(ConfigError, match="must look like"):
        load_plan(str(ROOT / "distill" / "params.yaml"), ["raw"])


@pytest.mark.unit
def test_the_transformer_students_preset_starts_from_the_teacher_against_the_ngram(monkeypatch):
    from xdpx.distill.plan import load_plan, step_configs

    monkeypatch.chdir(ROOT)
    preset = "distill/transformer-students.yaml"
    cfg = step_configs(load_plan(preset), preset)
    students = cfg["students"]
    assert students["train"]["model"] == "hf_classifier"
    assert students["train"]["pretrained_model"] == "models/distill-tf/teacher/best"
    assert students["grid"]["layers"] == [2, 3]
    assert students["baseline_train"]["model"] == "ngram_lr" and cfg["decide"]["baseline"]
    assert students["prepro"]["tokenizer_path"] == cfg["teacher"]["prepro"]["tokenizer_path"]


@pytest.mark.unit
def test_the_stsb_students_preset_trains_pair_students_on_recombined_pairs_against_match_ngram(monkeypatch):  # fmt: skip
    from xdpx.distill.plan import load_plan, step_configs

    monkeypatch.chdir(ROOT)
    preset = "distill/stsb-students.yaml"
    cfg = step_configs(load_plan(preset), preset)
    students = cfg["students"]
    assert students["train"]["pretrained_model"] == "models/distill-stsb/teacher/best"
    assert students["grid"]["layers"] == [2, 3]
    assert cfg["transfer"]["distill"]["pair_neighbours"] == 3  # AugSBERT's recombined pairs
    for step in (cfg["teacher"], students):
        assert step["prepro"]["text2_column"] == "text2" and step["prepro"]["transliterate"] is None  # fmt: skip
    assert students["baseline_train"]["model"] == "match_ngram"
    assert students["baseline_prepro"]["text2_column"] == "text2"
