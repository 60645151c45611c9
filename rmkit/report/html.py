"""`report.html`: one self-contained page (inline CSS, figures embedded as base64 PNG, no network)."""

from __future__ import annotations

import base64
import html

from rmkit.report import plots
from rmkit.report.build import length_warnings
from rmkit.report.scoring import EvalSet, ModelScores

STYLE = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:0.6em 0 1.4em}th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}
th:first-child,td:first-child{text-align:left}th{background:#f2f2f2}.note{color:#666;font-size:0.9em}
img{max-width:100%;display:block;margin:0.5em 0 1.5em}.partial{color:#555;font-size:0.9em}
.grids{display:flex;flex-wrap:wrap;gap:1.2em}.grid td{text-align:center;min-width:4em}
caption{text-align:left;font-size:0.9em;padding:2px 0}
.warning{background:#fff4e0;border-left:4px solid #e08a00;padding:0.4em 0.8em}"""

# Writes into the page how many figures decoded and how many script errors happened, so a headless browser
# (tests/report/test_html.py) can check that the page renders.
CHECK_SCRIPT = """var rmkitErrors=0;window.addEventListener('error',function(){rmkitErrors++;},true);
window.addEventListener('load',function(){var imgs=document.images,ok=0;
for(var i=0;i<imgs.length;i++){if(imgs[i].complete&&imgs[i].naturalWidth>0){ok++;}}
var el=document.getElementById('render-check');el.textContent=ok+' of '+imgs.length+' figures rendered';
el.setAttribute('data-figures-ok',ok);el.setAttribute('data-figures',imgs.length);
el.setAttribute('data-errors',rmkitErrors);});"""


def _e(value) -> str:
    return html.escape(str(value))


def pct(value) -> str:
    return "&mdash;" if value is None else f"{100 * value:.1f}%"


def num(value, digits: int = 3) -> str:
    return "&mdash;" if value is None else f"{value:.{digits}f}"


def table(header: list[str], rows: list[list[str]]) -> str:
    """Cells are HTML already (escape text with `_e`)."""
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def headline(report: dict) -> str:
    sections = next(iter(report["models"].values()))["sections"]
    header = ["model", "pairs", "accuracy [95% CI]"] + ([_e(s) for s in sections] + ["RewardBench"] if sections else [])
    header += ["ECE", "longer wins", "acc. chosen longer", "acc. chosen shorter", "pairs truncated"]
    rows = []
    for name, entry in report["models"].items():
        overall, bias = entry["overall"], entry["length_bias"]
        ci = overall["ci95"]
        row = [_e(name), str(overall["n"]), f"{pct(overall['accuracy'])} [{pct(ci[0])}, {pct(ci[1])}]"]
        if sections:
            row += [section_cell(v) for v in entry["sections"].values()]
            row.append(pct(overall["rewardbench"]) if overall["rewardbench"] is not None else "incomplete")
        row += [num(entry["calibration"]["ece"]), pct(bias["longer_wins_accuracy"]), pct(bias["chosen_longer"]["accuracy"]),
                pct(bias["chosen_shorter"]["accuracy"]), str(entry["truncated"])]
        rows.append(row)
    return table(header, rows)


def warning_block(report: dict) -> str:
    items = "".join(f"<li><b>{_e(name)}</b>, {_e(where)}: {_e(text)}</li>" for name, where, text in length_warnings(report))
    return f'<div class="warning" id="length-warnings"><b>Length bias</b><ul>{items}</ul></div>' if items else ""


def section_cell(entry: dict, parts: str = "subsets") -> str:
    """A score (`entry["score"]`), or, when `entry` lacks some of its `parts`, "incomplete (N missing)" with
    the mean over the parts that are present beside it (a partial figure, not the benchmark's)."""
    if entry["complete"]:
        return pct(entry["score"])
    partial = entry["present_score"]
    shown = f"; present {parts}: {pct(partial)}" if partial is not None else ""
    return f'incomplete ({len(entry["missing"])} missing)<span class="partial">{shown}</span>'


def section_notes(report: dict) -> str:
    entry = next(iter(report["models"].values()))
    missing = {s: v["missing"] for s, v in entry["sections"].items() if v["missing"]}
    if not entry["sections"]:
        return ""
    text = (f"Sections weigh their subsets by RewardBench's own example counts ({_e(report['aggregation'])}); "
            "the RewardBench score is the mean of the four sections.")
    for section, names in missing.items():
        present = ", ".join(f"{_e(n)} {pct(e['sections'][section]['present_score'])}" for n, e in report["models"].items())
        text += (f" <b>{_e(section)}</b> is incomplete (no {_e(', '.join(names))}); the weighted mean of its "
                 f"present subsets, not a RewardBench score: {present}.")
    return f'<p class="note">{text}</p>'


def subset_table(name: str, entry: dict) -> str:
    header = ["subset", "n", "accuracy", "95% CI", "ties", "longer wins", "Spearman(reward, length)",
              "mean margin", "acc. chosen longer", "acc. chosen shorter"]
    rows = [[_e(subset), str(s["n"]), pct(s["accuracy"]), f"{pct(s['ci95'][0])} &ndash; {pct(s['ci95'][1])}",
             str(s["ties"]), pct(s["longer_wins_accuracy"]), num(s["reward_length_spearman"]), num(s["mean_margin"]),
             pct(s["length_split"]["chosen_longer"]["accuracy"]), pct(s["length_split"]["chosen_shorter"]["accuracy"])]
            for subset, s in entry["subsets"].items()]
    return f"<h3>{_e(name)}</h3>" + table(header, rows)


def comparison_tables(report: dict) -> str:
    comparison = report.get("comparison")
    if not comparison or not report["num_pairs"]:
        return ""
    names = comparison["models"]
    side = table(["subset"] + [_e(n) for n in names],
                 [[_e(s)] + [pct(acc[n]) for n in names] for s, acc in comparison["accuracy"].items()])
    agree = table(["models", "agreement", "both right", "both wrong", "only first right", "only second right"],
                  [[_e(" vs ".join(a["models"])), pct(a["agreement"]), str(a["both_right"]), str(a["both_wrong"]),
                    str(a["only_first_right"]), str(a["only_second_right"])] for a in comparison["agreement"]])
    return ("<h2>Comparison</h2><h3>Accuracy per subset</h3>" + side + "<h3>Agreement (same side picked)</h3>"
            + agree + '<p class="note">The pairs they disagree on most: disagreements.jsonl.</p>')


def figure(title: str, png: bytes | None) -> str:
    if png is None:
        return f'<p class="note">{_e(title)}: no figure (matplotlib is not installed).</p>'
    data = base64.b64encode(png).decode("ascii")
    return f'<h3>{_e(title)}</h3><img alt="{_e(title)}" src="data:image/png;base64,{data}">'


def pair_sections(report: dict, models: list[ModelScores]) -> list[str]:
    """Headline, subsets, comparison and the four figures of the pairs."""
    figures = [("Accuracy per subset", plots.accuracy_by_subset(report)),
               ("Rewards: chosen vs rejected", plots.reward_histograms(models)),
               ("Reliability diagram", plots.reliability_diagram(report)),
               ("Length bias", plots.length_bias(report))]
    return ["<h2>Headline</h2>", headline(report), warning_block(report), section_notes(report),
            "<h2>Subsets</h2>", *(subset_table(n, e) for n, e in report["models"].items()),
            comparison_tables(report),
            "<h2>Figures</h2>", *(figure(title, png) for title, png in figures),
            '<p class="note">Length is counted in characters of the response. "Longer wins" is the '
            "accuracy of always picking the longer response (the length-only baseline; equal lengths count as "
            "wrong); a model within 2 points of it, or below, is flagged above. Confidence is "
            "sigmoid(|r_chosen &minus; r_rejected|); ECE weighs each bin's |accuracy &minus; confidence| by its "
            "pairs. Pairs truncated: pairs whose chosen or rejected input (prompt and response) was longer than "
            "the model's max length in tokens and was cut, keeping its end.</p>"]


def contents(report: dict, evalset: EvalSet) -> str:
    what = [f"{report['num_pairs']} pairs"] if report["num_pairs"] else []
    for key, label in (("rewardbench_v2", "RewardBench 2 prompts"), ("rm_bench", "RM-Bench prompts"),
                       ("processbench", "ProcessBench solutions"), ("prmbench", "PRMBench solutions")):
        if key in report.get("benchmarks", {}):
            what.append(f"{report['benchmarks'][key]['num_rows']} {label}")
    skipped = f", {report['skipped']} records skipped" if report["skipped"] else ""
    return (f"<p>{', '.join(what)} from {_e(', '.join(evalset.paths))}{skipped}. "
            f"Accuracy: {_e(report['accuracy_rule'])}.</p>")


def render_html(report: dict, evalset: EvalSet, models: list[ModelScores]) -> str:
    """The whole page."""
    from rmkit.report.html_bench import benchmark_sections  # it builds on this module's helpers

    cut = {n: e["truncated_texts"] for n, e in report["models"].items() if e["truncated_texts"]}
    cut_note = ("<p class=\"note\">Completions truncated to the model's max length (RewardBench 2 and RM-Bench): "
                + ", ".join(f"{_e(n)} {c}" for n, c in cut.items()) + ".</p>") if cut else ""
    parts = [
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>rmkit eval report</title>"
        f"<style>{STYLE}</style><script>{CHECK_SCRIPT}</script></head><body>",
        "<h1>Reward model report</h1>", contents(report, evalset),
        *(pair_sections(report, models) if report["num_pairs"] else []),
        benchmark_sections(report), cut_note,
        '<p class="note">Files: report.json, scores-&lt;model&gt;.jsonl (pairs), scores-rewardbench2-&lt;model&gt;.jsonl, '
        'scores-rm-bench-&lt;model&gt;.jsonl, scores-processbench-&lt;model&gt;.jsonl, scores-prmbench-&lt;model&gt;.jsonl.</p><p class="note" id="render-check"></p>',
        "</body></html>",
    ]
    return "\n".join(parts)
