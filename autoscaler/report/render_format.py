"""Numbers for people, shared by the tables and the plots so that a figure reads the same in both.

A figure the source cannot know (None) shows as a dash, never as a zero.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from autoscaler.report.model import PolicyResult

DASH = "—"


def usd(value: float | None) -> str:
    """Whole dollars once cents stop mattering; cents for the small sums of a short replay."""
    if value is None or not math.isfinite(value):
        return DASH
    sign = "-" if value < 0 else ""
    amount = abs(value)
    return f"{sign}${amount:,.0f}" if amount >= 100 else f"{sign}${amount:,.2f}"


def usd_cents(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return DASH
    return f"-${-value:,.2f}" if value < 0 else f"${value:,.2f}"


def signed_usd(value: float) -> str:
    """A difference: always with its sign, so +$63 and -$63 are not mistaken for totals."""
    return "+" + usd(value) if value >= 0 else usd(value)


def ratio(value: float | None) -> str:
    return DASH if value is None or not math.isfinite(value) else f"{value:.2f}x"


def pct(fraction: float | None) -> str:
    return DASH if fraction is None else f"{fraction * 100:.1f} %"


def signed_pct(fraction: float) -> str:
    """A relative difference with its sign; two decimals below 1 % so that 0.4 % and 0.04 % do
    not both read as 0.0 %."""
    digits = 2 if abs(fraction) < 0.01 else 1
    return f"{fraction * 100:+,.{digits}f} %"


def num(value: float | None, digits: int = 0) -> str:
    return DASH if value is None else f"{value:,.{digits}f}"


def secs(value: float | None) -> str:
    return DASH if value is None else f"{value:g} s"


def plain(text: str) -> str:
    """Keep user text literal in a plot: ``$`` would start mathtext, a leading ``_`` hides a
    legend entry."""
    text = text.replace("$", r"\$")
    return " " + text if text.startswith("_") else text


def cheapest_policy(policies: Sequence[PolicyResult]) -> PolicyResult | None:
    """The policy every other is measured against: the lowest total cost, the first listed among
    equals (so the choice does not depend on float noise in the order of the replays)."""
    return min(policies, key=lambda p: p.cost, default=None)
