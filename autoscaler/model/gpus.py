"""What a GPU model name says about the GPU: its memory, for shapes that ask for a minimum.

Catalogs give memory for some instance types and not others (Azure's size table has none, GCP's
only where the accelerator's name states it); a pool or on-prem node that names a well-known
model gets that model's memory from here. Names are matched by tokens as job requests are, so
``A100-SXM4-80GB`` and ``a100-80gb`` find the 80 GB A100, and a plain ``A100`` finds nothing
(two memory sizes exist), which leaves the memory unknown rather than guessed.
"""

from __future__ import annotations

from autoscaler.model import gpu_model_matches

# GiB per GPU of the models the shipped catalogs and traces name. A name that two sizes share
# (A100 40/80 GB, V100 16/32 GB) is listed by its sized names only.
_MEMORY_GIB: tuple[tuple[str, float], ...] = (
    ("a100-80gb", 80.0),
    ("a100-40gb", 40.0),
    ("a800-80gb", 80.0),
    ("h100", 80.0),
    ("h800", 80.0),
    ("h200", 141.0),
    ("b200", 180.0),
    ("l40s", 48.0),
    ("l40", 48.0),
    ("l4", 24.0),
    ("a10g", 24.0),
    ("a10", 24.0),
    ("t4", 16.0),
    ("v100-32gb", 32.0),
    ("v100", 16.0),
    ("k80", 12.0),
    ("m60", 8.0),
    ("p100", 16.0),
)


def memory_gib(model: str | None) -> float | None:
    """Memory per GPU of ``model``, or None when the name does not say it unambiguously."""
    if not model:
        return None
    lowered = model.lower()
    if "v100" in lowered and "32" in lowered:
        return 32.0
    for name, gib in _MEMORY_GIB:
        if gpu_model_matches(name, model):
            if name == "v100" and "32" in lowered:
                continue
            return gib
    return None
