"""Fitting tables to a terminal (`tracklake._cli.fit`, `tracklake._cli.shorten`): names cut
in their middle stay distinct and within their width, numbers keep their whole width,
the most important columns are kept first, headers break after separators."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.cells import cell_len

from tracklake._cli.fit import Column, Whole, allot, hidden_note
from tracklake._cli.shorten import distinct_width, shorten, shorten_one, wrap_name

KEYS = ["critic/score/mean", "critic/score/max", "critic/score/min", "actor/pg_loss",
        "val-core/gsm8k/reward/mean@5", "val-core/math/reward/mean@5"]

names = st.text(alphabet="ab/-_.x1é漢", min_size=1, max_size=40)
#: keys built like real ones: shared starts, middles and ends around a few differences
keys = st.lists(st.sampled_from(["actor", "critic", "layers.1", "layers.10", "experts.5",
                                 "experts.6", "grad_norm", "mean", "x"]),
                min_size=1, max_size=8).map("/".join)


@settings(max_examples=300, deadline=None)
@given(st.lists(names | keys, min_size=1, max_size=25, unique=True), st.integers(0, 30))
def test_names_shortened_at_their_distinct_width_or_wider_stay_distinct_and_fit(
        given_names: list[str], extra: int) -> None:
    width = distinct_width(given_names) + extra
    forms = shorten(given_names, width)
    assert len(set(forms)) == len(given_names)
    for name, form in zip(given_names, forms, strict=True):
        assert cell_len(form) <= max(width, 1)
        if cell_len(name) <= width:
            assert form == name


@settings(max_examples=300, deadline=None)
@given(names, st.integers(2, 40), st.data())
def test_a_shortened_name_keeps_its_start_its_end_and_the_character_asked(
        name: str, width: int, data: st.DataObject) -> None:
    keep = data.draw(st.integers(0, len(name) - 1))
    form = shorten_one(name, width, keep)
    assert cell_len(form) <= width
    if form != name:
        head, _, tail = form.partition("…")
        assert name.startswith(head) and name.endswith(tail)
        if keep + 2 <= width and cell_len(name[:keep + 1]) < width:  # then it can be kept
            assert len(head) > keep or len(name) - len(tail) <= keep


def test_keys_sharing_a_start_are_cut_in_their_middle_at_separators() -> None:
    assert shorten(KEYS, 13)[:3] == ["critic/…/mean", "critic/…/max", "critic/…/min"]
    assert shorten(KEYS, 40) == KEYS  # whole when they fit
    two = shorten(KEYS, distinct_width(KEYS))[4:]
    assert len(set(two)) == 2 and all(k.startswith("val-") for k in two)


def test_a_header_breaks_after_separators_and_at_spaces() -> None:
    assert wrap_name("critic/score/mean", 7) == "critic/\nscore/\nmean"
    assert wrap_name("last step", 4) == "last\nstep"
    assert wrap_name("critic/score/mean", 20) == "critic/score/mean"
    for line in wrap_name("a_very_long_segment_without/breaks_here", 6).splitlines():
        assert cell_len(line) <= 6


def test_claims_are_granted_in_order_and_the_rest_of_the_room_goes_to_the_kept() -> None:
    # run (least 8, whole 30), status 8, metric 6, start 19: at 40 cells of a box table
    least, whole = [8, 8, 6, 19], [30, 8, 6, 19]
    widths = allot(least, whole, [0, 1, 2, Whole(0), 3], 40)
    assert widths[3] is None  # start: no room left for it
    assert widths[1:3] == [8, 6]
    used = sum(w for w in widths if w) + 3 * 3 + 1
    assert used == 40 and widths[0] == 40 - 8 - 6 - 10  # the run id takes what is left
    wide = allot(least, whole, [0, 1, 2, Whole(0), 3], 200)
    assert wide == whole


def test_the_first_claimed_column_is_kept_even_in_a_terminal_too_narrow_for_it() -> None:
    assert allot([50, 4], [60, 4], [0, 1], 20) == [16, None]


def test_a_number_column_is_never_narrower_than_its_widest_number() -> None:
    column = Column("critic/score/mean", ["0.8146", "-1.235e+04"])
    assert column.least == len("-1.235e+04")
    assert Column("last step", ["4900"]).least == 4  # the header breaks between words
    names = Column("run", ["grpo-lr1e-6-seed1", "grpo-lr1e-6-seed2"], "shorten")
    assert names.least < names.whole


def test_the_hidden_columns_are_said_in_one_line_that_fits() -> None:
    hidden = ["project", "attempts", "ranks", "start", "val-core/gsm8k/reward/mean@5"]
    for width in (30, 60, 80, 200):
        line = hidden_note(hidden, width, "--format tsv lists them")
        assert cell_len(line) <= width and line.startswith("(5 columns hidden")
    assert hidden_note(hidden, 200, "x").endswith("mean@5; x)")
