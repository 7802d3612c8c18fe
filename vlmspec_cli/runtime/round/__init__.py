"""The round: the engine (draft -> one target forward -> verify -> commit), the drafter protocol and proposals, acceptance (verify.py), trees, the round policy, round timing."""
