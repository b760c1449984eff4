"""mmt: multi-machine training for Hydra apps.

The launcher itself is the Hydra plugin ``hydra_plugins.mmt_launcher``; this package is what a training script
imports: the rank-env contract (:class:`RankInfo`).
"""

from mmt.rank_env import RankInfo

__all__ = ["RankInfo"]
__version__ = "0.1.0"
