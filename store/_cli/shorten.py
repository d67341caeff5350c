"""Names (run ids, metric keys) shortened to a column's width so that they stay distinct.

rich's ellipsis keeps the start of a cell, so `critic/score/mean`, `critic/score/max` and
`critic/score/min` all read `critic/sco…`. Here a name too long for its column loses its
middle, cut where it has a separator when it can (`critic/…/mean`), and keeps the
character that tells it apart from the other names of the column: its first character
that no other name has at that place after the same start.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from itertools import accumulate, pairwise

from rich.cells import cell_len

ELLIPSIS = "…"
#: Characters a name is preferably cut next to.
SEPARATORS = frozenset("/-_.:@ ()[],=")
#: How many kept characters a cut next to a separator is worth.
_ALIGNED = 4
#: The fewest characters of its start a shortened name keeps (if its width allows).
_HEAD = 3
#: Characters a line of a wrapped name may end with.
_BREAK_AFTER = frozenset("/-_.:, =")


def _shared_start(a: str, b: str) -> int:
    """How many characters `a` and `b` start with in common."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def telling_index(names: Sequence[str]) -> dict[str, int]:
    """For each name, the index of the character a shortened form must keep for it to
    stay apart from the others: the first one past what it shares with its closest name
    (its last character if it is the start of another name)."""
    ordered = sorted(set(names))
    shared = [_shared_start(a, b) for a, b in pairwise(ordered)]
    index = {}
    for i, name in enumerate(ordered):
        around = max(shared[i - 1] if i else 0, shared[i] if i < len(shared) else 0)
        index[name] = max(min(around, len(name) - 1), 0)
    return index


def _cut_points(name: str) -> set[int]:
    """Places in `name` next to a separator (between characters; 0 and the end excluded)."""
    return {i for i in range(1, len(name))
            if name[i - 1] in SEPARATORS or name[i] in SEPARATORS}


def shorten_one(name: str, width: int, keep: int = 0) -> str:
    """`name` in `width` cells: whole if it fits, else its start and end around an
    ellipsis, keeping the character at index `keep`: the form that keeps most characters,
    a cut next to a separator counting as `_ALIGNED` more, then the one with the longer
    end."""
    total = cell_len(name)
    if total <= width:
        return name
    if width < 2:
        return ELLIPSIS[:width]
    room = width - 1  # cells for the start and the end
    at = list(accumulate((cell_len(c) for c in name), initial=0))  # cells before index i
    n = len(name)

    def head_for(cells: int, limit: int) -> int:
        """The longest start within `cells` cells and `limit` characters."""
        return min(bisect_right(at, cells) - 1, limit)

    def tail_for(cells: int, after: int) -> int:
        """Where the longest end within `cells` cells starts (not before `after`)."""
        return max(bisect_left(at, total - cells), after)

    points = _cut_points(name)
    ends = sorted(points | {n})
    candidates = set()
    for h in points:
        if at[h] < room:
            s = tail_for(room - at[h], h + 1)
            candidates.add((h, s))
            candidates.add((h, ends[bisect_left(ends, s)]))
    for s in ends:
        if total - at[s] < room:
            candidates.add((head_for(room - (total - at[s]), s - 1), s))
    best: tuple[tuple[int, int], int, int] | None = None
    for h, s in candidates:
        if h < min(_HEAD, room // 2) or h >= s or not (keep < h or keep >= s):
            continue
        if at[h] + 1 + total - at[s] > width:
            continue
        aligned = (h in points) + (s in points or s == n)
        score = (h + n - s + _ALIGNED * aligned, n - s)
        if best is None or score > best[0]:
            best = (score, h, s)
    if best is not None:
        return name[:best[1]] + ELLIPSIS + name[best[2]:]
    # no form keeps the telling character: the start, cut at the width
    return name[:head_for(room, n)] + ELLIPSIS


def _start(name: str, width: int) -> str:
    """The start of `name` cut to `width` cells with an ellipsis."""
    head = len(name)
    while head and cell_len(name[:head]) > width - 1:
        head -= 1
    return name[:head] + ELLIPSIS


def _end(name: str, width: int) -> str:
    """The end of `name` in `width` cells, after its first characters and an ellipsis."""
    head = name[:min(_HEAD, max(width - 2, 0))]
    tail = len(head) + 1
    while tail < len(name) and cell_len(head + ELLIPSIS + name[tail:]) > width:
        tail += 1
    return head + ELLIPSIS + name[tail:]


def _clashing(names: Sequence[str], forms: list[str]) -> list[int]:
    """Where different names got the same form."""
    owners: dict[str, set[str]] = {}
    for name, form in zip(names, forms, strict=True):
        owners.setdefault(form, set()).add(name)
    return [i for i, form in enumerate(forms) if len(owners[form]) > 1]


def shorten(names: Sequence[str], width: int) -> list[str]:
    """Each name in `width` cells (`shorten_one`), the forms of different names kept
    different wherever the width allows: names whose forms clash get their longest end
    instead (names mostly differ there), and if they still clash, their longest start."""
    keep = telling_index(names)
    forms = [shorten_one(n, width, keep[n]) for n in names]
    for remedy in (_end, _start):
        clash = _clashing(names, forms)
        for i in clash:
            forms[i] = remedy(names[i], width)
    return forms


def distinct_width(names: Sequence[str], floor: int = 1) -> int:
    """The narrowest width (at least `floor`, at most the widest name) at which the
    shortened names are all different."""
    unique = sorted(set(names))
    if not unique:
        return floor
    widest = max(cell_len(n) for n in unique)
    keep = telling_index(unique)
    width = max(min(len(n), keep[n] + 2, len(n) - keep[n] + 2) for n in unique)
    low = min(max(width, floor), widest)
    high = widest  # whole names are distinct
    while low < high:  # the narrowest distinct width, by bisection
        middle = (low + high) // 2
        if len(set(shorten(unique, middle))) == len(unique):
            high = middle
        else:
            low = middle + 1
    return low


def name_parts(name: str) -> list[str]:
    """The pieces `wrap_name` keeps whole where it can: words, and the parts of a word
    after each separator (`critic/`, `score/`, `mean`)."""
    parts = [""]
    for c in name:
        parts[-1] += c
        if c in _BREAK_AFTER:
            parts.append("")
    return [p.strip() for p in parts if p.strip()]


def wrap_name(name: str, width: int) -> str:
    """`name` over lines of at most `width` cells, broken at spaces and after separators
    (a header such as `critic/score/mean` reads `critic/` / `score/` / `mean`); a part
    wider than the width is folded."""
    if cell_len(name) <= width or width < 1:
        return name
    lines = [""]
    for part in name_parts(name):
        joined = lines[-1] + (" " if lines[-1][-1:] not in _BREAK_AFTER - {" "} else "")
        if lines[-1] and cell_len(joined + part) <= width:
            lines[-1] = joined + part
            continue
        lines.append("")
        for c in part:
            if lines[-1] and cell_len(lines[-1] + c) > width:
                lines.append("")
            lines[-1] += c
    return "\n".join(line for line in lines if line)
