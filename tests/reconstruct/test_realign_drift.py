"""Issue 42: realign under drift inside generated turns (``reconstruct.realign``).

Ids read as a ChatML conversation: ``S`` opens a message, ``E`` closes it (the end-of-turn
token), ``N`` is a newline, ``U``/``A`` the roles; the model's bytes ``B1``/``B2`` are not valid
UTF-8 by themselves, so the client got U+FFFD and resent it: ``F1 F2 F3`` in the next prompt.
"""

from __future__ import annotations

from orchard_rec.reconstruct import Generation, reconstruct
from orchard_rec.reconstruct.realign import drift_cut

S, E, N, U, A = 1, 2, 207, 10, 11
B1, B2 = 195, 182
F = [180, 132, 130]  # U+FFFD re-encoded
OPEN = [S, U, N, 50, 51, 52, E, N, S, A, N]  # user "task", then the generation prompt


def user(*words: int) -> list[int]:
    return [E, N, S, U, N, *words, E, N, S, A, N]


def gen(cid: str, prompt: list[int], out: list[int], finish: str = "stop") -> Generation:
    return Generation(cid, tuple(prompt), tuple(out), tuple(-0.5 for _ in out), finish)


def test_replacement_characters_in_later_prompts_realign_to_the_generated_bytes() -> None:
    g1 = [60, 61, B1, B2, 62, 63, 64, E]  # 'nt\n' + a partial character + 'er 3', closed
    p2 = OPEN + [60, 61, *F, 62, 63, 64] + user(70)
    g2 = [65, 66, E]
    p3 = p2 + [65, 66] + user(71)
    g3 = [67, E]
    gens = [gen("c1", OPEN, g1), gen("c2", p2, g2), gen("c3", p3, g3)]
    [s] = reconstruct(gens, session_id="s", on_mismatch="realign")
    obs2 = user(70)[1:]  # the model closed its turn: E is its own
    assert s.tokens == OPEN + g1 + obs2 + g2 + user(71)[1:] + g3
    assert s.metadata["realigned"] == ["c2", "c3"]
    at = len(OPEN) + 2
    assert s.metadata["realign_points"] == [at, at]
    assert s.metadata["realign_spans"] == [[at, at + 2]]
    assert s.loss_mask == [1] * len(g1) + [0] * len(obs2) + [1] * 3 + [0] * (len(user(71)) - 1) + [1, 1]
    # split (the default) keeps splitting
    assert len(reconstruct(gens, session_id="s")) == 2


def test_a_turn_cut_inside_a_character_ends_at_the_closer() -> None:
    g1 = [60, 61, B1]  # max_tokens cut the character: no E generated
    p2 = OPEN + [60, 61, *F] + user(70)
    gens = [gen("c1", OPEN, g1, "length"), gen("c2", p2, [65, E])]
    for turn_end in (E, None):  # the template's token, or learned from the prompts' common ending
        [s] = reconstruct(gens, session_id="s", on_mismatch="realign", turn_end=turn_end)
        assert s.tokens == OPEN + g1 + user(70) + [65, E]
        assert s.metadata["realign_spans"] == [[len(OPEN) + 2, len(OPEN) + 3]]


def test_special_tokens_dropped_from_the_text_are_drift_too() -> None:
    g1 = [60, 5, 61, 62, 63, E]  # 5: a special token the client never saw as text
    p2 = OPEN + [60, 61, 62, 63] + user(70)
    [s] = reconstruct([gen("c1", OPEN, g1), gen("c2", p2, [E])], session_id="s", on_mismatch="realign")
    assert s.tokens == OPEN + g1 + user(70)[1:] + [E]


def test_a_prompt_that_departs_outside_generated_turns_is_no_drift() -> None:
    tokens = OPEN + [60, 61, E]
    generated = [False] * len(OPEN) + [True] * 3
    edited = [S, U, N, 50, 99, 52, E, N, S, A, N, 60, 61] + user(70)  # the task itself changed
    assert drift_cut(tokens, generated, edited, last_cut=False, closer=E) is None
    same = OPEN + [60, 61, E] + user(70)[1:]  # extends it: no drift either
    assert drift_cut(tokens, generated, same, last_cut=False, closer=E) is None
    d = drift_cut(tokens, generated, OPEN + [60, *F, E] + user(70)[1:], last_cut=False, closer=E)
    assert d is not None and (d.point, d.spans) == (len(OPEN) + 1, ((len(OPEN) + 1, len(OPEN) + 2),))
