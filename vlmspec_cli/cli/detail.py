"""How much a command says before its results: ``-v/--verbose`` and the one short line of
runtime detail a decoding command prints by default. click only; no rich, no model code.

Before every result a decoding command printed the profile's models and method, then which
models run on the fast path, the CPU thread plan and why compiled steps were off, with
the command to measure them: six dim lines at 80 columns. By default that is now one line
(``tinyworld-caption · chain (γ auto ≤ 12) · fast path on · 1 thread``); ``-v`` prints
the full lines as before.
"""

from __future__ import annotations

import click

_VERBOSE = "vlmspec.verbose"   # ctx.meta key: -v given


def _keep(ctx, param, value):
    if value:
        ctx.meta[_VERBOSE] = True
    return value


verbose_option = click.option(
    "--verbose", "-v", is_flag=True, expose_value=False, callback=_keep,
    help="Say more on stderr: the profile's models, the fast path, CPU threads and "
         "compiled steps with their reasons (default: one short line).")


def verbose() -> bool:
    """Whether this command was given -v/--verbose."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.meta.get(_VERBOSE))


def lossy_row(prof) -> dict:
    """The summary's "lossless: no (why)" row when an option changes the output from the
    target's own (profile.lossless); {} when lossless."""
    t = prof.target
    reasons = [why for lossy, why in (
        (prof.prune.active, "visual-token pruning"),
        (prof.acceptance == "relaxed", "relaxed acceptance"),
        (t.quantize == "int8" and t.int8_threshold > 0, "int8 outlier decomposition"))
        if lossy]
    if prof.lossless and not reasons:
        return {}
    return {"lossless": f"no ({', '.join(reasons) or 'a lossy option'})"}


def short_line(session, methods: str | None = None, extra: str = "") -> str:
    """One line of runtime detail: profile · method · fast path · threads or device (and
    compiled steps, "lossy" where an option changes the output from the target's, ``extra``).
    ``methods``: what bench runs, in place of the profile's method."""
    from vlmspec_cli.drafters import method_class

    prof = session.profile
    parts = [prof.name, methods or method_class(prof.method).label(prof)]
    models = [(role, lm) for role, lm in (("target", session.target), ("draft", session.draft))
              if lm is not None]
    fast = [role for role, lm in models if lm.fast is not None]
    parts.append("fast path on" if len(fast) == len(models) else
                 "fast path off" if not fast else f"fast path: {', '.join(fast)} only")
    if any(lm.fast is not None and lm.fast.compiled is not None for _, lm in models):
        parts.append("compiled steps")
    device = session.target.device
    if device.type == "cpu":
        n = session.threads.count("decode")
        if n is not None:
            parts.append(f"{n} thread{'s' if n > 1 else ''}")
    else:
        parts.append(str(device))
    if lossy_row(prof):
        parts.append("lossy")
    if extra:
        parts.append(extra)
    return " · ".join(parts)


def unread_inputs(prof, labels: dict[str, str]) -> str | None:
    """The line for ``--inputs`` given to a method that reads no drafting input (the
    default's head drafts from the target's hidden states): the option changes nothing,
    so say so rather than decode as if it had been taken."""
    from vlmspec_cli.drafters import method_class

    said = labels.get("drafting.inputs")
    if said is None or method_class(prof.method).drafting_inputs(prof):
        return None
    return (f"{said}: method {prof.method} reads no drafting input, so this changes nothing "
            f"(-m chain, tree or tabed draft from the inputs given)")
