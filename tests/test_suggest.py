"""vlmspec_cli.suggest: the one did-you-mean hint every user-facing name check uses."""

from vlmspec_cli.suggest import closest, did_you_mean


def test_closest_picks_the_nearest_choice_or_none():
    assert closest("methdo", ["method", "name", "task"]) == "method"
    assert closest("zzz", ["method", "name"]) is None
    assert closest(3, [1, 2, 3.5, "3"]) == "3"  # words and choices compare as text


def test_cutoff_and_aliases():
    assert closest("temprature", ["temperature"], cutoff=0.8) == "temperature"
    assert closest("temp", ["temperature"], cutoff=0.8) is None
    # an alias names a choice difflib would not find, but only if it is a choice here
    assert closest("content", ["role", "text"], aliases={"content": "text"}) == "text"
    assert closest("content", ["role"], aliases={"content": "text"}) is None


def test_did_you_mean_wording():
    assert did_you_mean("chian", ["chain", "tree"]) == " (did you mean 'chain'?)"
    assert did_you_mean("foldr", ["folder"], show="${{{}}}".format) == " (did you mean ${folder}?)"
    assert did_you_mean("xyz", ["chain"]) == ""
