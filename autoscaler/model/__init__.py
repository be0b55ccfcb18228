"""The domain model every layer shares: pools, instances, demand, the frozen ``FleetView`` a
policy decides on and the ``Plan`` it returns (``domain``); config (``config``) and the file readers
that locate its errors; typed errors; the clock; the records the steps pass on (``records``); and
the plumbing every process shares (log lines, secret scrubbing, a small WSGI server).

Policies import from here and nowhere else in ``autoscaler``."""

from autoscaler.model.domain import (
    HOLDING_STATES,
    LIVE_STATES,
    Capacity,
    CloudNode,
    Demand,
    DemandGroup,
    DrainRequest,
    FleetView,
    Frozen,
    Instance,
    InstanceState,
    InterruptionNotice,
    Job,
    LaunchRequest,
    Market,
    Name,
    NodeShape,
    NoticeKind,
    OnPremNode,
    OnPremUse,
    Placement,
    Plan,
    Pool,
    PoolView,
    PriceQuote,
    gpu_model_matches,
)

__all__ = [
    "HOLDING_STATES",
    "LIVE_STATES",
    "Capacity",
    "CloudNode",
    "Demand",
    "DemandGroup",
    "DrainRequest",
    "FleetView",
    "Frozen",
    "Instance",
    "InstanceState",
    "InterruptionNotice",
    "Job",
    "LaunchRequest",
    "Market",
    "Name",
    "NodeShape",
    "NoticeKind",
    "OnPremNode",
    "OnPremUse",
    "Placement",
    "Plan",
    "Pool",
    "PoolView",
    "PriceQuote",
    "gpu_model_matches",
]
