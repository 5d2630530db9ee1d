"""The ship rule of distillation (:func:`decide`): a student ships only when its dev lead over the
reference (the student's architecture alone, or the plan's baseline) is above zero and above
one paired standard error; the same comparison on test and for the teacher, the share of the
teacher's gain kept, and the decision as markdown. :mod:`xdpx.distill.plan` re-exports it."""

from __future__ import annotations

from typing import Any


# ---------------------------------------------------------------------- the ship rule
def kept_share(
    teacher_dev: float | None, alone_dev: float | None, student_dev: float | None
) -> float | None:
    """The share of the teacher's dev gain over the student config alone that the student
    keeps: ``(student - alone) / (teacher - alone)`` (issue 49's measure); None when a score
    is missing or the teacher is not above alone."""
    if teacher_dev is None or alone_dev is None or student_dev is None:
        return None
    gain = teacher_dev - alone_dev
    return (student_dev - alone_dev) / gain if gain > 0 else None


def decide(
    grid: list[dict[str, Any]],
    alone: dict[str, dict[str, float]],
    teacher: dict[str, dict[str, float]],
    student: dict[str, dict[str, float]] | None,
    metric: str,
    paired: dict[str, dict[str, Any]] | None = None,
    reference: str = "alone",
) -> dict[str, Any]:
    """The ship rule on dev: the student ships only when it beats the student config trained
    on the gold labels alone on dev by more than the paired standard error of the difference.

    One dev set of 1-2k texts cannot separate two models a few texts apart: a rule that
    shipped on any positive dev difference shipped a student 5 points worse on
    20newsgroups-lt's test (issue 56). So the rule reads ``paired["dev"]``
    (:func:`xdpx.metrics.paired_comparison` of student against alone on the dev texts:
    McNemar's test for accuracy, a paired bootstrap otherwise) and ships when
    ``diff > se`` (and ``diff > 0``); the same comparison on test is reported, never used.
    Without paired rows (a regression task) it falls back to ``student dev > alone dev``
    and says so in the reason.

    Args:
        grid: one row per grid point: ``alpha``, ``temperature``, ``copies``, ``run``,
            ``dev`` (its best dev ``metric``), ``best_epoch``; the best (highest dev, the
            first on a tie) is the student.
        alone: ``{split: metrics}`` of the student config trained on the gold labels alone.
        teacher: ``{split: metrics}`` of the teacher.
        student: ``{split: metrics}`` of the best grid point (None: no grid).
        metric: the score (``train.major_metric``; higher is better).
        paired: ``{"dev" | "test": student vs alone, "teacher_dev" | "teacher_test": teacher
            vs alone}``, each a :func:`xdpx.metrics.paired_comparison` dict (any may be
            missing).
        reference: the run ``alone`` is (``alone``, ``alone-l<L>`` or the plan's
            ``baseline``): the run shipped when the student does not.

    Returns:
        The decision: ``metric``, ``grid``, ``dev`` / ``test`` of teacher, alone and
        student, ``teacher_gain`` (teacher dev - alone dev), ``student_gain``,
        ``kept_share`` (student gain / teacher gain on dev; None when the teacher is not
        above alone), ``test_kept_share`` (the same on test), ``paired`` (as given),
        ``shipped`` (``student`` or ``alone``), ``run`` (the shipped run's name) and
        ``reason``.
    """
    best = max(grid, key=lambda r: r["dev"]) if grid else None
    paired = dict(paired or {})

    def score(m: dict[str, dict[str, float]] | None, split: str) -> float | None:
        return None if m is None or split not in m else float(m[split][metric])

    a_dev, t_dev, s_dev = score(alone, "dev"), score(teacher, "dev"), score(student, "dev")
    teacher_gain = t_dev - a_dev if t_dev is not None and a_dev is not None else None
    student_gain = s_dev - a_dev if s_dev is not None and a_dev is not None else None
    share = kept_share(t_dev, a_dev, s_dev)
    dev_pair = paired.get("dev")
    if best is None or s_dev is None:
        shipped, reason = "alone", "no grid point was trained"
    elif dev_pair is not None:
        diff, se = float(dev_pair["diff"]), float(dev_pair["se"])
        what = (
            f"the best student {best['run']} against {reference} (gold labels only) on "
            f"dev: {metric} {dev_pair['a']:.4f} vs {dev_pair['b']:.4f}, "
            f"difference {diff:+.4f} ± {se:.4f} (paired SE; {dev_pair['method']} p "
            f"{dev_pair['p']:.3g}, {dev_pair['a_only']} texts right only for the student, "
            f"{dev_pair['b_only']} only for alone)"
        )
        if diff > 0 and diff > se:
            shipped, reason = "student", f"ships: {what} is above one paired SE"
        else:
            shipped, reason = "alone", f"keeps alone: {what} is not above one paired SE"
    elif s_dev > a_dev:
        shipped = "student"
        reason = (
            f"the student {best['run']} beats the student config trained on the gold labels "
            f"alone on dev: {metric} {s_dev:.4f} > {a_dev:.4f} (no per-text rows for a "
            "paired test: the plain comparison)"
        )
    else:
        shipped = "alone"
        reason = (
            f"no grid point beats the student config trained on the gold labels alone on dev: "
            f"the best, {best['run']}, has {metric} {s_dev:.4f} <= {a_dev:.4f}"
        )
    test = {
        "teacher": score(teacher, "test"),
        "alone": score(alone, "test"),
        "student": score(student, "test"),
    }
    return {
        "metric": metric,
        "grid": grid,
        "dev": {"teacher": t_dev, "alone": a_dev, "student": s_dev},
        "test": test,
        "teacher_gain": teacher_gain,
        "student_gain": student_gain,
        "kept_share": share,
        "test_kept_share": kept_share(test["teacher"], test["alone"], test["student"]),
        "paired": paired,
        "student_run": best["run"] if best else None,
        "shipped": shipped,
        "run": best["run"] if shipped == "student" and best else reference,
        "reason": reason,
        "reference": reference,
    }


def _fmt(x: Any) -> str:
    return "–" if x is None else f"{x:.4f}" if isinstance(x, float) else str(x)


def decision_markdown(decision: dict[str, Any]) -> str:
    """The decision as markdown: the teacher / alone / student table, the grid on dev, the
    choice and its reason (``decision.md`` and the flow's artifact)."""
    m = decision["metric"]
    share = decision["kept_share"]
    lines = [
        f"# Distillation: ships **{decision['shipped']}** (`{decision['run']}`)",
        "",
        decision["reason"] + ".",
        "",
        f"| model | dev {m} | test {m} |",
        "|---|---|---|",
    ]
    ref = decision.get("reference", "alone")
    for who in ("teacher", "alone", "student"):
        name = f"student `{decision['student_run']}`" if who == "student" else who
        name = f"`{ref}` (the reference)" if who == "alone" else name
        lines.append(f"| {name} | {_fmt(decision['dev'][who])} | {_fmt(decision['test'][who])} |")
    lines += [
        "",
        f"Teacher's dev gain over alone: {_fmt(decision['teacher_gain'])}; the student keeps "
        + ("– (the teacher is not above alone on dev)" if share is None else f"{share:.1%}")
        + " of it.",
    ]
    paired = decision.get("paired") or {}
    if paired:
        lines += [
            "",
            f"Paired on the same texts ({m}, A minus `{ref}`, ± the paired standard error):",
            "",
            "| A | split | A | reference | A - reference | paired SE | test | p | right only A / only reference |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for key in ("dev", "test", "teacher_dev", "teacher_test"):
            if key in paired:
                c = paired[key]
                who, split = (
                    ("teacher", key[8:]) if key.startswith("teacher_") else ("student", key)
                )
                lines.append(
                    f"| {who} | {split} | {c['a']:.4f} | {c['b']:.4f} | {c['diff']:+.4f} | "
                    f"{c['se']:.4f} | {c['method']} | {c['p']:.3g} | {c['a_only']} / {c['b_only']} |"
                )
    lines += [
        "",
        f"| run | layers | alpha | T | copies | dev {m} | best epoch |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in decision["grid"]:
        lines.append(
            f"| `{r['run']}` | {_fmt(r.get('layers'))} | {r['alpha']:g} | {r['temperature']:g} | "
            f"{r['copies']} | {_fmt(r['dev'])} | {r['best_epoch']} |"
        )
    own = decision.get("own_alone")
    if own:
        dev = own["paired"].get("dev")
        lines += [
            "",
            f"The student's own architecture on the gold labels alone (`{own['run']}`): dev "
            f"{_fmt(own['dev'])}, test {_fmt(own['test'])}"
            + (f"; the student {dev['diff']:+.4f} ± {dev['se']:.4f} on dev" if dev else "")
            + " (what distillation adds).",
        ]
    return "\n".join(lines) + "\n"
