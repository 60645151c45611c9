"""Step-labelled solutions (`rmkit.data.steps.StepSolution`) as token ids for a process reward model.

A solution is laid out as TRL's PRMTrainer lays it out: the prompt (plain text: no chat template; the tokenizer's
special tokens added as for any rmkit input, BOS once where the tokenizer adds one), then each step followed by
`step_separator`, the prompt, every step and the separator each tokenized on their own and concatenated:

    [prompt ids] [step 1 ids] [sep ids] [step 2 ids] [sep ids] ...

A labelled step's label sits at the last token of the separator that follows it (`positions`); an unlabelled step
(None) and, with `train_on_last_step_only`, every step but the last carry none. A solution longer than `max_length`
keeps its beginning: the steps whose separator falls past the cut are dropped and counted (`steps_cut`), and a
solution left with no label is dropped (listed with the reason, for the rejects file), as is, with `overlong="drop"`,
any solution that does not fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rmkit.data.steps import StepSolution


@dataclass(frozen=True)
class StepIds:
    """One tokenized solution: `input_ids`, the positions of its trained steps' labels (each the last token of a
    separator, increasing) and their labels (True: the step is correct)."""

    source: str
    input_ids: list[int]
    positions: tuple[int, ...]
    labels: tuple[bool, ...]

    @property
    def length(self) -> int:
        return len(self.input_ids)


@dataclass
class TokenizedSteps:
    """`items`; `dropped`: `(source, reason)` of the solutions left out; `truncated`: solutions cut to `max_length`;
    `steps_cut`: labelled steps lost past the cut."""

    items: list[StepIds] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)
    truncated: int = 0
    steps_cut: int = 0


def solution_ids(tokenizer, prompt: str, steps: Sequence[str], step_separator: str) -> tuple[list[int], list[int]]:
    """The ids of `prompt` and `steps` laid out as the module docstring says (no cut), and every step's label
    position (the last token of the separator after it)."""
    ids = list(tokenizer(prompt, add_special_tokens=True)["input_ids"])
    separator = tokenizer.encode(step_separator, add_special_tokens=False)
    ends = []
    for step in tokenizer(list(steps), add_special_tokens=False)["input_ids"]:  # one call: a fast tokenizer batches
        ids += list(step) + separator
        ends.append(len(ids) - 1)
    return ids, ends


def tokenize_solution(solution: StepSolution, tokenizer, step_separator: str,
                      train_on_last_step_only: bool = False) -> StepIds:
    """The whole solution as ids (no cut), its trained labels at their separators' last tokens."""
    ids, ends = solution_ids(tokenizer, solution.prompt, solution.steps, step_separator)
    last = len(solution.steps) - 1
    trained = [(end, bool(label)) for i, (end, label) in enumerate(zip(ends, solution.labels))
               if label is not None and (not train_on_last_step_only or i == last)]
    return StepIds(solution.source, ids, tuple(p for p, _ in trained), tuple(label for _, label in trained))


def prefix_rows(items: Sequence[StepIds]) -> list[StepIds]:
    """Each trained step of each solution as a row of its own: the solution's ids cut after the step's label
    position, the label at the row's last token (an encoder scores a step this way: `rmkit.models.step_values`)."""
    return [StepIds(item.source, item.input_ids[: position + 1], (position,), (label,))
            for item in items for position, label in zip(item.positions, item.labels)]


def tokenize_steps(solutions: Sequence[StepSolution], tokenizer, max_length: int, step_separator: str,
                   train_on_last_step_only: bool = False, overlong: str = "truncate") -> TokenizedSteps:
    """Every solution through `tokenize_solution`, then cut to `max_length` tokens as the module docstring says."""
    out = TokenizedSteps()
    for solution in solutions:
        item = tokenize_solution(solution, tokenizer, step_separator, train_on_last_step_only)
        if item.length > max_length:
            if overlong == "drop":
                out.dropped.append((item.source, f"{item.length} tokens, over {max_length} (data.overlong=drop)"))
                continue
            kept = sum(p < max_length for p in item.positions)
            out.truncated += 1
            out.steps_cut += len(item.positions) - kept
            item = StepIds(item.source, item.input_ids[:max_length], item.positions[:kept], item.labels[:kept])
        if not item.positions:
            out.dropped.append((item.source, "no labelled step to train on" + (
                f" within the first {max_length} tokens" if item.length == max_length else "")))
            continue
        out.items.append(item)
    return out
