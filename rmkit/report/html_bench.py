"""The report page's "RewardBench 2", "RM-Bench" and "ProcessBench" sections: every model side by side, the
baselines, the Ties score's parts, RM-Bench's 3x3 style matrix drawn per domain as a coloured grid, and
ProcessBench's accuracies and F1 per split, and PRMBench's PRMScore per error type."""

from __future__ import annotations

from rmkit.report.html import _e, num, pct, section_cell, table
from rmkit.report.rewardbench2 import SUBSETS
from rmkit.report.rmbench import DOMAINS, STYLES


def rewardbench2_section(report: dict) -> str:
    data = report["benchmarks"]["rewardbench_v2"]
    models = {n: e["rewardbench_v2"] for n, e in report["models"].items()}
    first = next(iter(models.values()))
    header = ["subset", "prompts"] + [_e(n) for n in models] + ["random baseline", "longest wins"]
    rows = []
    for subset in (s for s in SUBSETS if s in first["subsets"]):
        base = data["baselines"][subset]
        rows.append([_e(subset), str(first["prompts"][subset])] + [pct(m["subsets"][subset]) for m in models.values()]
                    + [pct(base["random"]), pct(base["longest_wins"])])
    rows.append(["<b>score</b> (mean of the six)", str(data["num_rows"])]
                + [section_cell(m, "subsets") for m in models.values()] + ["", ""])
    parts = ["<h2>RewardBench 2</h2>", table(header, rows)]
    if "ties" in first:
        keys = ("tied_accuracy", "ref_accuracy", "correctness_preferred", "correctness_preferred_hard", "margin_score")
        parts.append("<h3>Ties</h3>" + table(
            ["model", "tied accuracy (x0.30)", "ref accuracy (x0.30)", "correctness preferred (x0.20)",
             "correctness preferred, hard (x0.20)", "margin score (x0.01)", "Ties"],
            [[_e(n)] + [num(m["ties"][k]) for k in keys] + [pct(m["ties"]["score"])] for n, m in models.items()]))
    parts.append(
        '<p class="note">Every completion is scored alone against its prompt. Outside Ties a prompt scores 1/k when '
        "its chosen completion ties k-way for the highest reward and 0 when a rejected one is above it; a subset is "
        "the mean of its prompts; the random baseline is the expected score of random rewards (1/4 for one chosen "
        "and three rejected); longest wins scores each completion by its length in characters. Ties weighs "
        "accuracy on the prompts with one correct answer (ref) and with several (tied), whether the gap between "
        "correct and incorrect answers exceeds the spread among the correct ones (hard: the smaller of the ref "
        f"and tied gaps), and tanh(gap / spread - 1). As {_e(data['source'])} computes them.</p>")
    return "\n".join(parts)


def heat(value: float | None) -> str:
    """A cell coloured from red (0) through yellow to green (1)."""
    if value is None:
        return "<td>&mdash;</td>"
    return f'<td style="background:hsl({120 * value:.0f},65%,82%)">{pct(value)}</td>'


def style_grid(domain: str, entry: dict) -> str:
    """The 3x3 matrix: rows the chosen answer's style, columns the rejected answer's."""
    head = "".join(f"<th>{_e(s)}</th>" for s in STYLES)
    body = "".join(f"<tr><th>{_e(style)}</th>" + "".join(heat(v) for v in row) + "</tr>"
                   for style, row in zip(STYLES, entry["matrix"]))
    caption = (f"{_e(domain)} (n={entry['n']}): hard {pct(entry['hard'])}, normal {pct(entry['normal'])}, "
               f"easy {pct(entry['easy'])}")
    return (f'<table class="grid"><caption>{caption}</caption><thead><tr><th>chosen \\ rejected</th>{head}</tr>'
            f"</thead><tbody>{body}</tbody></table>")


def rm_bench_section(report: dict) -> str:
    models = {n: e["rm_bench"] for n, e in report["models"].items()}
    present = [d for d in DOMAINS if d in next(iter(models.values()))["domains"]]
    header = ["model"] + [_e(d) for d in present] + ["hard", "normal", "easy", "score"]
    rows = [[_e(n)] + [pct(m["domains"][d]["avg"]) for d in present]
            + [pct(m[k]) for k in ("hard", "normal", "easy")] + [section_cell(m, "domains")] for n, m in models.items()]
    parts = ["<h2>RM-Bench</h2>", table(header, rows), "<h3>Style matrices</h3>"]
    for name, entry in models.items():
        grids = "".join(style_grid(d, entry["domains"][d]) for d in present)
        parts.append(f'<h4>{_e(name)}</h4><div class="grids">{grids}</div>')
    parts.append(
        '<p class="note">Each answer is written in three styles and every style is scored alone against the prompt. '
        "A cell is the fraction of prompts whose chosen answer in the row's style scores above the rejected answer "
        "in the column's style (a tie is wrong). Above the diagonal (hard) the chosen answer is plainer than the "
        "rejected one, below it (easy) fancier: a model that rewards style over substance is green below the "
        "diagonal and red above it. A domain's score is the mean of hard, normal (the diagonal) and easy; hard, "
        "normal, easy and the score are means over chat, math, code and safety (safety-refuse and "
        f"safety-response together). As {_e(report['benchmarks']['rm_bench']['source'])} computes them.</p>")
    return "\n".join(parts)


def processbench_section(report: dict) -> str:
    data = report["benchmarks"]["processbench"]
    models = {n: e["processbench"] for n, e in report["models"].items()}
    first = next(iter(models.values()))
    header = ["split", "erroneous", "correct"] + [f"{_e(n)}: {k}" for n in models
                                                  for k in ("error acc.", "correct acc.", "F1", "step AUC")]
    rows = [[_e(split), str(s["n_error"]), str(s["n_correct"])]
            + [pct(m["splits"][split][k]) for m in models.values()
               for k in ("error_acc", "correct_acc", "f1", "step_auc")]
            for split, s in first["splits"].items()]
    rows.append(["<b>average</b>", "", ""] + [cell for m in models.values()
                                              for cell in ("", "", pct(m["average_f1"]), pct(m["average_step_auc"]))])
    cut = {n: sum(s["cut"] for s in m["splits"].values()) for n, m in models.items()}
    cut_note = (" Solutions longer than the model's max length (their last steps unscored, so judged right): "
                + ", ".join(f"{_e(n)} {c}" for n, c in cut.items()) + ".") if any(cut.values()) else ""
    return "\n".join([
        "<h2>ProcessBench</h2>", table(header, rows),
        f'<p class="note">Threshold {num(data["threshold"], 2)}: {_e(data["rule"])}. Error acc.: the erroneous '
        "solutions whose first wrong step is found exactly; correct acc.: the correct solutions with no step judged "
        f"wrong; F1: their harmonic mean; average: the mean over the splits. As {_e(data['source'])} computes "
        "them. Step AUC (rmkit's, no threshold): the chance that a step before a first error scores above a first "
        f"wrong step, ties half; 50% is chance.{cut_note}</p>"])


def prmbench_section(report: dict) -> str:
    data = report["benchmarks"]["prmbench"]
    models = {n: e["prmbench"] for n, e in report["models"].items()}
    first = next(iter(models.values()))
    header = ["error type", "solutions"] + [f"{_e(n)}: {k}" for n in models for k in ("F1", "negative F1", "PRMScore")]
    rows = [[_e(kind), str(c["n"])] + [pct(m["classes"][kind][k]) for m in models.values()
                                       for k in ("f1", "negative_f1", "prm_score")]
            for kind, c in first["classes"].items()]
    rows.append(["<b>overall</b> (the modified solutions)", str(first["overall"]["n"])]
                + [pct(m["overall"][k]) for m in models.values() for k in ("f1", "negative_f1", "prm_score")])
    return "\n".join([
        "<h2>PRMBench</h2>", table(header, rows),
        f'<p class="note">A step is judged correct when its probability is above {num(data["threshold"], 2)}. F1 of '
        "the correct steps, negative F1 of the wrong ones, PRMScore their mean; each record's clean solution counts "
        f"once, in the class correct, and not in the overall score. As {_e(data['source'])} computes them.</p>"])


def benchmark_sections(report: dict) -> str:
    benchmarks = report.get("benchmarks", {})
    parts = []
    if "rewardbench_v2" in benchmarks:
        parts.append(rewardbench2_section(report))
    if "rm_bench" in benchmarks:
        parts.append(rm_bench_section(report))
    if "processbench" in benchmarks:
        parts.append(processbench_section(report))
    if "prmbench" in benchmarks:
        parts.append(prmbench_section(report))
    return "\n".join(parts)
