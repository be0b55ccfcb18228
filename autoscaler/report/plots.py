"""The report's figures, as inline SVG with their captions.

Plots read only the :class:`Report`, like the tables, and are deterministic (fixed SVG ids and
hash salt, no metadata) so that a report can be diffed. Each figure answers one question at a
glance: what each policy spent over time, how much more than the cheapest policy it spent (a
difference of 1 % stays visible however far apart the other policies are), what demand and supply
looked like, and how long jobs waited.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import ConnectionPatch
from matplotlib.ticker import FuncFormatter
from matplotlib.transforms import offset_copy

from autoscaler.report.model import PolicyResult, Report, Series
from autoscaler.report.render_format import (
    cheapest_policy,
    plain,
    secs,
    signed_pct,
    signed_usd,
    usd,
)
from autoscaler.sim.lowerbound_result import LowerBoundResult

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

HOURS_PER_DAY = 24.0
_COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
_BOUND_MARKERS = ("D", "v", "s", "^", "o")
_PLOT_RC: dict[RcKeyType, Any] = {
    "svg.fonttype": "path",
    "svg.hashsalt": "hybrid-gpu-autoscaler-report",
    "font.size": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
}
# Matplotlib stamps a date, its version and URLs into SVG metadata; none of it belongs in a
# reproducible report, and dropping every key drops the metadata block altogether.
_SVG_METADATA = {"Date": None, "Creator": None, "Format": None, "Type": None}
_ID_REFERENCE = re.compile(r'(\bid="|href="#|url\(#)')
# A policy whose extra cost never exceeds this share of the widest one is squashed into less
# than a tenth of the panel's height: it gets a close-up panel of its own.
CLOSE_UP_SHARE = 0.1


@dataclass(frozen=True)
class Plot:
    """One figure of the report: the ``<svg>`` element and what it shows, in words."""

    svg: str
    caption: str


def _color(index: int) -> str:
    return _COLORS[index % len(_COLORS)]


def _days(series: Series) -> list[float]:
    return [t / HOURS_PER_DAY for t in series.t_hours]


@contextmanager
def plot_style() -> Iterator[None]:
    """Styles are read when artists are made and when the SVG is written; both happen inside."""
    with matplotlib.rc_context(_PLOT_RC):
        yield


def _svg(figure: Any, scope: str) -> str:
    """The figure as an ``<svg>`` element to inline in HTML: no XML prolog or DOCTYPE, and every
    id prefixed so that several figures in one page never share one."""
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", metadata=_SVG_METADATA)
    text = buffer.getvalue()
    text = text[text.index("<svg") :]
    return _ID_REFERENCE.sub(lambda m: f"{m.group(1)}{scope}-", text).strip()


def _dollars_axis(ax: Any, signed: bool = False) -> None:
    """One style for every tick: cents only when the whole axis spans less than $100."""

    def tick(value: float, _pos: int | None) -> str:
        cents = max(abs(v) for v in ax.get_ylim()) < 100
        text = f"${abs(value):,.2f}" if cents else f"${abs(value):,.0f}"
        if value < 0:
            return "-" + text
        return ("+" + text if value > 0 else text) if signed else text

    ax.yaxis.set_major_formatter(FuncFormatter(tick))


# ---------------------------------------------------------------- cumulative cost


def _window_end_days(report: Report) -> float:
    ends = [p.timeline.cost.t_hours[-1] for p in report.policies if p.timeline.cost.t_hours]
    return max(ends) / HOURS_PER_DAY if ends else report.window.days


_BOUND_DASHES = ("--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)), (0, (8, 2)))
# Two bounds of nearly one value draw nearly one curve: each its own grey, dashes and marker.
_BOUND_INKS = ("0.1", "0.5", "0.3", "0.65")
# A curve that ends further below its marker than this share of the bound is called out.
_SHORT_SHARE = 1e-6


@dataclass(frozen=True)
class _BoundsDrawn:
    """What the bounds added to the cost plot, for its caption."""

    markers: int
    curves: int
    short: tuple[str, ...]
    """'W=600 s ($0.17)' for each curve that ends below its marker (a dual raised the bound)."""


def _bound_curve(
    ax: Any, bound: LowerBoundResult, end: float, beside: Any, style: Any, ink: str
) -> bool:
    """The spending of one cheapest schedule the bound's closed form or LP found, dashed from the
    window's start to the bound's marker. False where the bound carries no curve (infeasible, or
    a report written before bounds had one)."""
    if bound.cost is None or not bound.accrual_cost:
        return False
    days = [0.0, *(t / HOURS_PER_DAY for t in bound.accrual_t_hours)]
    spent = [0.0, *bound.accrual_cost]
    ax.plot(days, spent, color=ink, lw=1.1, ls=style, zorder=4)
    # The marker sits a few points past the end so that two bounds of nearly one value stay
    # apart: a short join in the same style carries the curve to it.
    join = ConnectionPatch(
        (days[-1], spent[-1]),
        (end, bound.cost),
        coordsA=ax.transData,
        coordsB=beside,
        color=ink,
        lw=1.1,
        ls=style,
        clip_on=False,
        zorder=4,
    )
    ax.add_artist(join)
    return True


def _bound_label(bound: LowerBoundResult, curve: bool) -> str:
    assert bound.cost is not None
    text = f"lower bound W={secs(bound.max_wait_s)}: {usd(bound.cost)}"
    return plain(text + (" (dashed: one cheapest LP schedule)" if curve else " (total)"))


def _bound_marks(ax: Any, report: Report) -> _BoundsDrawn:
    """Each bound's total as a marker just past the window's end and, where the bound carries
    it, the spending of one cheapest schedule its LP found as a dashed curve ending there. The
    bound is one number for the whole window: the curve shows one way of reaching the LP's
    optimum, not a bound at every moment."""
    end = _window_end_days(report)
    curves = 0
    short: list[str] = []
    drawn = [b for b in report.lower_bounds if b.cost is not None]
    for j, bound in enumerate(drawn):
        assert bound.cost is not None
        # side by side just past the end, so that two bounds of nearly one value stay apart
        beside = offset_copy(ax.transData, fig=ax.figure, x=4 + 10 * j, units="points")
        style = _BOUND_DASHES[j % len(_BOUND_DASHES)]
        marker = _BOUND_MARKERS[j % len(_BOUND_MARKERS)]
        ink = _BOUND_INKS[j % len(_BOUND_INKS)]
        curve = _bound_curve(ax, bound, end, beside, style, ink)
        ax.plot(
            [end],
            [bound.cost],
            transform=beside,
            ls="none",
            marker=marker,
            ms=7,
            mfc="white",
            mec=ink,
            mew=1.4,
            clip_on=False,
            zorder=5,
        )
        # The legend's entry: an empty line in the curve's dashes with the marker on it.
        ax.plot(
            [],
            [],
            color=ink,
            lw=1.1 if curve else 0,
            ls=style if curve else "none",
            marker=marker,
            ms=7,
            mfc="white",
            mec=ink,
            mew=1.4,
            label=_bound_label(bound, curve),
        )
        if curve:
            curves += 1
            gap = bound.cost - bound.accrual_cost[-1]
            if gap > _SHORT_SHARE * max(bound.cost, 1.0):
                short.append(f"W={secs(bound.max_wait_s)} ({usd(gap)})")
    return _BoundsDrawn(len(drawn), curves, tuple(short))


def _bounds_caption(drawn: _BoundsDrawn) -> str:
    if not drawn.markers:
        return ""
    text = (
        " Open markers just past the window's end: the offline lower bound for each maximum "
        "wait, one total for the whole window (compare it with where each curve ends)."
    )
    if drawn.curves:
        text += (
            " The dashed curve ending at a marker is the spending of one cheapest schedule found "
            "while computing that bound, one of possibly many: it is not a bound at every "
            "moment, and a policy may lie below it for a while and still end above the marker."
        )
    if drawn.short:
        text += (
            " Where the exact dual raised the bound above the pooled linear program's optimum, "
            "that schedule costs less than the bound and its curve ends below the marker: "
            + ", ".join(drawn.short)
            + "."
        )
    if drawn.curves < drawn.markers:
        text += (
            " A bound with no curve (a report written before bounds kept one) is shown as an "
            "end point only, not as a curve over time."
        )
    return text


def cost_plot(report: Report) -> Plot:
    with plot_style():
        fig = Figure(figsize=(9, 4), layout="constrained")
        ax = fig.add_subplot()
        for i, p in enumerate(report.policies):
            cost = p.timeline.cost
            label = plain(f"{p.label}: {usd(p.cost)}")
            ax.plot(_days(cost), cost.values, color=_color(i), lw=1.5, label=label)
        bounds = _bound_marks(ax, report)
        ax.set_xlabel("days since window start")
        ax.set_ylabel("cumulative cloud cost")
        ax.set_ylim(bottom=0)
        ax.margins(x=0)
        _dollars_axis(ax)
        ax.legend(loc="upper left", fontsize=8)
        svg = _svg(fig, "cost")
    caption = "Cumulative cloud cost per policy over the window." + _bounds_caption(bounds)
    return Plot(svg, caption)


# ---------------------------------------------------------------- cost relative to the cheapest


@dataclass(frozen=True)
class _Extra:
    """One policy's cumulative cost minus the cheapest policy's, over time."""

    index: int
    policy: PolicyResult
    days: list[float]
    dollars: list[float]

    @property
    def widest(self) -> float:
        return max((abs(v) for v in self.dollars), default=0.0)


def _extra_over(index: int, policy: PolicyResult, base: PolicyResult) -> _Extra:
    """Linear interpolation of the cheapest's curve at this policy's sample times: both are
    sampled at tick times, and a cumulative cost between two ticks lies between its values."""
    own = policy.timeline.cost
    theirs = base.timeline.cost
    if policy is base or not theirs.t_hours:
        return _Extra(index, policy, _days(own), [0.0] * len(own.values))
    at = np.interp(own.t_hours, theirs.t_hours, theirs.values)
    extra = np.asarray(own.values, dtype=np.float64) - at
    return _Extra(index, policy, _days(own), [float(v) for v in extra])


def _extra_label(extra: _Extra, base: PolicyResult) -> str:
    if extra.policy is base:
        return plain(f"{extra.policy.label}: the cheapest, {usd(base.cost)}")
    difference = extra.policy.cost - base.cost
    share = f" ({signed_pct(difference / base.cost)})" if base.cost > 0 else ""
    return plain(f"{extra.policy.label}: {signed_usd(difference)}{share}")


def _percent_axis(ax: Any, base_cost: float) -> None:
    """A second scale on the right: the same difference as a share of the cheapest's total, so
    the curves' ends read as the table's 'vs cheapest' column."""
    if base_cost <= 0:
        return
    right = ax.secondary_yaxis(
        "right",
        functions=(lambda d: d / base_cost * 100.0, lambda p: p * base_cost / 100.0),
    )

    def tick(value: float, _pos: int | None) -> str:
        # as many decimals as the tick has (+2.5 %, +5 %), never a rounded +2 % for 2.5
        text = f"{value:+,.3f}".rstrip("0").rstrip(".")
        return "0 %" if text in {"+0", "-0"} else f"{text} %"

    right.yaxis.set_major_formatter(FuncFormatter(tick))
    right.set_ylabel("share of the cheapest's total")


def _extra_panel(ax: Any, extras: Sequence[_Extra], base: PolicyResult, title: str) -> None:
    for extra in extras:
        is_base = extra.policy is base
        ax.plot(
            extra.days,
            extra.dollars,
            color=_color(extra.index),
            lw=1.0 if is_base else 1.5,
            ls="--" if is_base else "-",
            label=_extra_label(extra, base),
        )
    ax.axhline(0.0, color="0.2", lw=0.6)
    ax.set_title(title, loc="left", fontsize=9)
    ax.set_ylabel("cost above the cheapest")
    ax.margins(x=0)
    _dollars_axis(ax, signed=True)
    _percent_axis(ax, base.cost)
    ax.legend(loc="upper left", fontsize=8)


@dataclass(frozen=True)
class RelativeCost:
    """The figure of cost above the cheapest policy, and whether it has a close-up panel."""

    figure: Figure
    panels: tuple[Any, ...]
    """The upper panel (every policy) and, with ``close_up``, the close-up below it."""
    cheapest: PolicyResult
    close_up: bool


def relative_cost_figure(report: Report) -> RelativeCost | None:
    """Each policy's cumulative cost minus the cheapest policy's, over time; policies squashed
    by a much dearer one get a close-up panel. None for a report with fewer than two policies.
    Call inside ``plot_style()`` so that the figure is drawn in the report's style."""
    base = cheapest_policy(report.policies)
    if base is None or len(report.policies) < 2:
        return None
    extras = [_extra_over(i, p, base) for i, p in enumerate(report.policies)]
    widest = max(e.widest for e in extras)
    others = [e for e in extras if e.policy is not base]
    close = [e for e in others if e.widest <= CLOSE_UP_SHARE * widest]
    close_up = bool(close) and len(close) < len(others)
    fig = Figure(figsize=(9, 6.6 if close_up else 3.8), layout="constrained")
    axes = fig.subplots(2 if close_up else 1, 1, squeeze=False)[:, 0]
    title = f"every policy, against {base.label} (the cheapest)"
    _extra_panel(axes[0], extras, base, plain(title))
    if close_up:
        near = [e for e in extras if e.policy is base or e in close]
        share = f"{CLOSE_UP_SHARE:.0%}"
        title = f"close-up: the policies within {share} of the widest difference"
        _extra_panel(axes[1], near, base, plain(title))
    axes[-1].set_xlabel("days since window start")
    return RelativeCost(fig, tuple(axes), base, close_up)


def relative_cost_plot(report: Report) -> Plot | None:
    with plot_style():
        drawn = relative_cost_figure(report)
        if drawn is None:
            return None
        svg = _svg(drawn.figure, "relcost")
    base = drawn.cheapest
    caption = (
        f"Cost above the cheapest policy ({base.label}, {usd(base.cost)} over the window): "
        "each policy's cumulative cloud cost minus the cheapest's at the same moment, in dollars "
        "(left) and as a share of the cheapest's total (right). A curve's end is its total "
        "difference; its slope shows when the difference was made, and a dip below zero a "
        "stretch in which that policy had spent less so far."
    )
    if drawn.close_up:
        caption += (
            " The lower panel redraws the policies the upper one squashes near zero on their own "
            "scale, so that a difference of 1 % can be seen."
        )
    return Plot(svg, caption)


# ---------------------------------------------------------------- demand, supply and waits

_SUPPLY_LINES: tuple[tuple[str, str, Callable[[PolicyResult], Series]], ...] = (
    ("pending GPUs", "#d62728", lambda p: p.timeline.pending_gpus),
    ("running GPUs", "#222222", lambda p: p.timeline.running_gpus),
    ("cloud GPUs", "#1f77b4", lambda p: p.timeline.cloud_gpus),
    ("on-prem busy GPUs", "#2ca02c", lambda p: p.timeline.onprem_busy_gpus),
)


def _supply_panel(ax: Any, policy: PolicyResult, onprem_gpus: int) -> None:
    for name, color, pick in _SUPPLY_LINES:
        series = pick(policy)
        ax.plot(_days(series), series.values, color=color, lw=1, label=name, ds="steps-post")
    if onprem_gpus:
        ax.axhline(onprem_gpus, color="#2ca02c", lw=0.8, ls=":", label="on-prem GPUs")
    ax.set_title(plain(policy.label), loc="left", fontsize=9)
    ax.set_ylabel("GPUs")
    ax.margins(x=0)


def supply_plot(report: Report) -> Plot:
    panels = max(1, len(report.policies))
    with plot_style():
        fig = Figure(figsize=(9, 1.8 * panels + 0.9), layout="constrained")
        axes = fig.subplots(panels, 1, sharex=True, sharey=True, squeeze=False)[:, 0]
        for ax, policy in zip(axes, report.policies, strict=False):
            _supply_panel(ax, policy, report.onprem_gpus or 0)
        axes[-1].set_xlabel("days since window start")
        axes[0].set_ylim(bottom=0)
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside upper center", ncols=5, fontsize=8)
        svg = _svg(fig, "supply")
    return Plot(
        svg,
        "Demand and supply per policy: GPUs pending, GPUs running jobs, cloud GPUs paid for "
        "and on-prem GPUs busy.",
    )


def _wait_unit(values: Sequence[float]) -> tuple[str, float]:
    """Seconds, minutes or hours, whichever keeps the axis numbers short."""
    top = max(values, default=0.0)
    if top >= 3 * 3600:
        return "h", 3600.0
    if top >= 3 * 60:
        return "min", 60.0
    return "s", 1.0


def _hourly_steps(series: Series, scale: float) -> tuple[list[float], list[float]]:
    """Each submission hour as its own flat segment, with a break over hours in which no job was
    submitted: joining across the gap would claim waits for jobs that do not exist."""
    xs: list[float] = []
    ys: list[float] = []
    for k, (hour, value) in enumerate(zip(series.t_hours, series.values, strict=True)):
        if k and hour != series.t_hours[k - 1] + 1:
            xs.append(math.nan)
            ys.append(math.nan)
        xs += [hour / HOURS_PER_DAY, (hour + 1) / HOURS_PER_DAY]
        ys += [value / scale, value / scale]
    return xs, ys


def wait_plot(report: Report) -> Plot:
    everything = [v for p in report.policies for v in p.timeline.wait_p95_by_hour.values]
    target_s = report.wait_target_s or 0.0
    unit, scale = _wait_unit([*everything, target_s])
    with plot_style():
        fig = Figure(figsize=(9, 3.5), layout="constrained")
        ax = fig.add_subplot()
        for i, p in enumerate(report.policies):
            xs, ys = _hourly_steps(p.timeline.wait_p95_by_hour, scale)
            ax.plot(xs, ys, color=_color(i), lw=1.2, label=plain(p.label))
        if target_s > 0:
            target = f"wait target {secs(target_s)}"
            ax.axhline(target_s / scale, color="0.3", lw=1, ls="--", label=target)
        ax.set_xlabel("submission time, days since window start")
        ax.set_ylabel(f"p95 queue wait ({unit})")
        ax.set_ylim(bottom=0)
        ax.margins(x=0)
        ax.legend(loc="upper left", fontsize=8)
        svg = _svg(fig, "wait")
    return Plot(
        svg, "p95 queue wait of the jobs submitted in each hour (carried-in jobs left out)."
    )


def plots(report: Report) -> list[Plot]:
    """Every figure of the report, in the order a reader needs them."""
    relative = relative_cost_plot(report)
    return [
        cost_plot(report),
        *([relative] if relative is not None else []),
        supply_plot(report),
        wait_plot(report),
    ]
