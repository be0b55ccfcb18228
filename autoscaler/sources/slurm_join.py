"""What a cloud node says of itself when it joins Slurm, rendered from its pool.

``join-cloud-node.sh`` gives the node the features that partitions and jobs select on (docs/
slurm.md, "Cloud node features"): the autoscaler's own, the market (``market-spot`` or
``market-on-demand``: what keeps protected work off spot), the pool and the GPU model. The script
reads them from its environment, or the market from the cloud's metadata; ``user_data`` renders a
pool's boot script with that environment written in, so a pool's launch template, instance
template or custom data can carry exactly what the pool is. ``node_features`` is the same
rendering in Python, for the placement code and the tests to agree with the script on.

With the Slurm source's ``join_user_data`` on, the adapter renders it for every pool that joins
the scheduler and the providers hand it to the cloud at launch (``gres_type`` picks the pool's
gres type, ``environment_problem`` checks the site's own additions to the environment).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from importlib import resources

from autoscaler.model import Market, Pool, gpu_model_matches
from autoscaler.model.sharing import SharingMode

DEFAULT_CLOUD_FEATURE = "gpu-autoscaler"
MARKET_FEATURES = {Market.SPOT: "market-spot", Market.ON_DEMAND: "market-on-demand"}
_NOT_FEATURE = re.compile(r"[^A-Za-z0-9_.-]")
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
# What the pool (or the adapter's cloud_feature and join_gpu_types) says, or what differs per
# instance: the site's own environment may not set these for every node of every pool.
DECIDED_BY_POOL = frozenset(
    {
        "GPU_AUTOSCALER_NODE_NAME",
        "GPU_AUTOSCALER_MARKET",
        "GPU_AUTOSCALER_POOL",
        "GPU_AUTOSCALER_GPU_MODEL",
        "GPU_AUTOSCALER_GPU_TYPE",
        "GPU_AUTOSCALER_FEATURE",
        "GPU_AUTOSCALER_SHARDS",
    }
)


def feature_word(text: str) -> str:
    """``text`` as a Slurm feature name: letters, digits and ``_.-``, others replaced by ``-``
    (as the script's ``feature_word``)."""
    return _NOT_FEATURE.sub("-", text)


def node_features(pool: Pool, cloud_feature: str = DEFAULT_CLOUD_FEATURE) -> tuple[str, ...]:
    """The features the join script gives a node of ``pool``, in the script's order."""
    features = [cloud_feature, MARKET_FEATURES[pool.market], f"pool-{feature_word(pool.name)}"]
    if pool.gpu_model:
        features.append(f"gpu-{feature_word(pool.gpu_model.lower())}")
    return tuple(features)


def join_environment(
    pool: Pool, cloud_feature: str = DEFAULT_CLOUD_FEATURE, gpu_type: str | None = None
) -> dict[str, str]:
    """The join script's environment for a node of ``pool``; ``gpu_type`` is the gres type the
    site's Slurm names the pool's GPUs by (``a100``). A pool that shares its GPUs by
    time-slicing joins with that many shards per GPU (``GPU_AUTOSCALER_SHARDS``: Slurm's
    ``gres/shard``, what ``--gres=shard:N`` jobs run on, ``slurm_shards``); a MIG pool's slices
    are gres types of the site's own, not shards."""
    environment = {
        "GPU_AUTOSCALER_FEATURE": cloud_feature,
        "GPU_AUTOSCALER_MARKET": pool.market.value,
        "GPU_AUTOSCALER_POOL": pool.name,
    }
    if pool.gpu_model:
        environment["GPU_AUTOSCALER_GPU_MODEL"] = pool.gpu_model
    if gpu_type:
        environment["GPU_AUTOSCALER_GPU_TYPE"] = gpu_type
    sharing = pool.gpu_sharing
    if sharing is not None and sharing.mode is SharingMode.TIME_SLICING and sharing.replicas:
        environment["GPU_AUTOSCALER_SHARDS"] = str(sharing.replicas)
    return environment


def join_script() -> str:
    """The text of ``join-cloud-node.sh`` as shipped."""
    return (resources.files("autoscaler") / "data/slurm/join-cloud-node.sh").read_text()


def user_data(
    pool: Pool,
    cloud_feature: str = DEFAULT_CLOUD_FEATURE,
    gpu_type: str | None = None,
    environment: Mapping[str, str] | None = None,
) -> str:
    """A boot script for a node of ``pool``: the pool's join environment (and ``environment``:
    ``GPU_AUTOSCALER_SLURMD_ARGS``, ``GPU_AUTOSCALER_NODE_CONF``...) exported, then the join
    script. Raises ``ValueError`` for an environment name a shell cannot export."""
    values = {**join_environment(pool, cloud_feature, gpu_type), **(environment or {})}
    for name in values:
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not an environment variable name")
    exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in values.items())
    script = join_script()
    shebang, _, body = script.partition("\n")
    return f"{shebang}\n# gpu-autoscaler pool {pool.name}\n{exports}{body}"


def gres_type(
    pool: Pool, gpu_types: Mapping[str, str], gpu_models: Mapping[str, str]
) -> str | None:
    """The gres type a node of ``pool`` registers its GPUs under: the one ``gpu_types`` names
    for the pool, else the type whose model in the adapter's ``gpu_models`` (gres type -> model)
    names the pool's GPU model (``a100: A100`` for ``NVIDIA A100 40GB``, as jobs' gres types are
    matched; the most specific model wins, then the first listed), else none (``gpu:N``,
    untyped). Jobs that ask for ``--gres=gpu:a100:1`` run only on nodes whose gres has that
    type."""
    if pool.name in gpu_types:
        return gpu_types[pool.name]
    matching = [t for t, model in gpu_models.items() if gpu_model_matches(model, pool.gpu_model)]
    return max(matching, key=lambda t: len(_model_words(gpu_models[t])), default=None)


def _model_words(model: str) -> frozenset[str]:
    return frozenset(re.findall(r"[a-z0-9]+", model.lower()))


def environment_problem(name: str, value: str) -> str | None:
    """Why ``name=value`` cannot be added to every pool's join environment, or None."""
    if not _ENV_NAME.fullmatch(name):
        return f"{name[:40]!r} is not an environment variable name (A-Z, 0-9 and _)"
    if name in DECIDED_BY_POOL:
        return (
            f"{name} is set for each pool by the adapter (its market, name, GPU model and "
            "gpu_sharing, cloud_feature, join_gpu_types) or is the instance's own"
        )
    if "\0" in value:
        return f"{name}'s value holds a NUL character"
    return None
