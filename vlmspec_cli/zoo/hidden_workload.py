"""A user's own workload as training data for a draft head: ``python -m vlmspec_cli.zoo.hidden
--target DIR_OR_HUB_ID --workload FILE.jsonl --out HEAD_DIR`` (zoo/hidden_user.py).

FILE.jsonl is what ``vlmspec bench`` reads (tasks/mmspec.py): MMSpec lines (``image`` and
``turns``, the user's questions about the image) and ``vlmspec caption --chat`` lines
(``messages``). Every user turn is answered again by the target, greedily, in order, its
answer fed back before the next turn (zoo/own_answers.py): the head learns what this
target says to these questions, as SpecForge regenerates a dataset's answers with the
target it trains for. Assistant messages a --chat line gives are not kept (the target's own
replace them). A bad line, an image that cannot be read or a conversation the target
cannot take (too long for its positions) is named on stderr in one line and skipped.
"""

from __future__ import annotations

from vlmspec_cli.zoo.own_answers import Dialogue, UserTurn


def workload_dialogues(path: str) -> tuple[list[Dialogue], list[str]]:
    """(the file's conversations, one error line per sample left out). Raises InputError
    (tasks/inputs.py) when the file itself is unusable."""
    from vlmspec_cli.tasks.inputs import InputError, load_image, shown_name
    from vlmspec_cli.tasks.mmspec import SampleError, read_bench_file

    name = shown_name(path)
    dialogues, errors = [], []
    for item in read_bench_file(path):
        if isinstance(item, SampleError):
            errors.append(f"{name}: line {item.line}: {item.reason}; skipped")
            continue
        turns = []
        try:
            for turn in item.turns:
                if turn.role != "user":
                    continue
                turns.append(UserTurn(turn.text, tuple(load_image(p) for p in turn.image_paths)))
        except InputError as exc:
            errors.append(f"{name}: line {item.line}: image {shown_name(exc.path)}: "
                          f"{exc.reason}; skipped")
            continue
        dialogues.append(Dialogue(turns, f"{name}: line {item.line}"))
    return dialogues, errors


def workload_pairs(lm, dialogues: list[Dialogue], max_new_tokens: int, batch: int = 8):
    """(requests, the target's answers, error lines) for ``collect``: the target answers
    every turn; a conversation it cannot take is an error line."""
    from vlmspec_cli.zoo.own_answers import answer_dialogues, training_pairs

    done = answer_dialogues(lm, dialogues, max_new_tokens, batch=batch)
    errors = [f"{d.tag}: {_one_line(d.error)}; skipped" for d in dialogues if d.error]
    requests, answers = training_pairs(done, max_new_tokens)
    return requests, answers, errors


def _one_line(text: str) -> str:
    return " ".join(str(text).split())
