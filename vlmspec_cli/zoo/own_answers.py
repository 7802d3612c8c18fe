"""The target's own answers to whole conversations, turn by turn: what a draft head learns
from (zoo/hidden_broad.py for the tinyworld heads, zoo/hidden_workload.py for a user's
workload file).

A conversation is its user turns (text, images). The target answers the first greedily
(target-only decoding on the runtime's own engine, ``batch`` conversations at a time:
``SpeculativeEngine.run`` decodes each row exactly as alone), its answer is fed back as
the assistant's turn exactly as ``vlmspec bench`` feeds it (the decoded text), the next
user turn follows, and so on. What the head is trained on is one example per
conversation: the request for its last reply (every earlier turn, the target's own
answers included, sits in its prompt and is learnt over, as ``collect`` learns over the
prompt's text) and the target's tokens for that reply.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vlmspec_cli.runtime.request import Message, Request


@dataclass
class UserTurn:
    text: str
    images: tuple = ()


@dataclass
class Dialogue:
    """A conversation to answer: ``turns`` (the user's), ``tag`` (a topic or the line it
    came from, for reports and errors)."""

    turns: list[UserTurn]
    tag: str = ""
    answers: list[str] = field(default_factory=list)     # the target's, as text
    last_tokens: list[int] | None = None                 # the target's last reply, as ids
    error: str | None = None


def request_for(dialogue: Dialogue, max_new_tokens: int) -> Request:
    """The request for the next reply: the turns so far, the target's answers between."""
    messages: list[Message] = []
    for i, turn in enumerate(dialogue.turns[: len(dialogue.answers) + 1]):
        messages.append(Message("user", turn.text, tuple(turn.images)))
        if i < len(dialogue.answers):
            messages.append(Message("assistant", dialogue.answers[i]))
    return Request(messages, max_new_tokens=max_new_tokens,
                   request_id=f"{dialogue.tag}#{len(dialogue.answers) + 1}")


def answer_dialogues(lm, dialogues: list[Dialogue], max_new_tokens: int, batch: int = 8,
                     log=None) -> list[Dialogue]:
    """Every turn of every dialogue answered by the target (in place); a dialogue whose
    request fails (too long for the target, an image it cannot take) gets ``error`` and is
    not answered further. Returns the dialogues answered to their last turn."""
    from vlmspec_cli.drafters import create_drafter
    from vlmspec_cli.runtime.round.engine import SpeculativeEngine
    from vlmspec_cli.runtime.round.verify import SamplingParams

    if not getattr(lm.adapter, "embeds_images", False):
        batch = 1           # rows share one cache only where the family allows it (session.py)
    engine = SpeculativeEngine(lm, create_drafter("none"), 1, SamplingParams(0.0),
                               batch_size=batch)
    turn = 0
    while True:
        live = [d for d in dialogues if d.error is None and len(d.answers) < len(d.turns)]
        if not live:
            break
        turn += 1
        for d, res in _decode(engine, live, max_new_tokens):
            if isinstance(res, Exception):
                d.error = f"turn {len(d.answers) + 1}: {res}"
                continue
            if len(d.answers) + 1 == len(d.turns):
                d.last_tokens = list(res.tokens)
            d.answers.append(res.text)
        if log is not None:
            log(f"turn {turn}: {len(live)} conversations answered")
    return [d for d in dialogues if d.error is None]


def _decode(engine, dialogues: list[Dialogue], max_new_tokens: int):
    """(dialogue, Result or the exception) for each dialogue's next reply."""
    if engine.batch_size > 1:
        yield from engine.run(dialogues, lambda d: request_for(d, max_new_tokens))
        return
    for d in dialogues:
        try:
            yield d, engine.generate(request_for(d, max_new_tokens))
        except (ValueError, RuntimeError, IndexError) as exc:
            yield d, exc


def training_pairs(dialogues: list[Dialogue], max_new_tokens: int) -> tuple[list, list]:
    """(requests, answers) for ``hidden_train.collect``: each dialogue's last request and
    the target's tokens for it."""
    reqs, answers = [], []
    for d in dialogues:
        last = Dialogue(d.turns, d.tag, d.answers[:-1])
        reqs.append(request_for(last, max_new_tokens))
        answers.append(d.last_tokens)
    return reqs, answers
