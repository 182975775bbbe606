"""PPO with self-imitation learning (Oh et al. 2018, arXiv:1806.05635, section 5.3 "PPO+SIL"): SLM-Lab's
``PPOSIL``, reimplemented.

A ``PPO`` (rollouts of ``time_horizon`` vector steps, clipped-surrogate epochs; see ``ppo.py``) with
``SILMixin`` (``sil.py``): after each PPO update, ``training_iter`` replay batches of ``training_batch_iter``
SIL steps each, on the same nets and optimizers. Keys: ``PPOSpec``'s plus ``SILFields``; train_df columns:
PPO's plus ``sil_policy_loss`` and ``sil_val_loss``.
"""

from __future__ import annotations

from dataclasses import dataclass

from agents.algorithms.ppo import PPO, PPOSpec
from agents.algorithms.sil import SIL_METRICS, SILFields, SILMixin


@dataclass(frozen=True)
class PPOSILSpec(SILFields, PPOSpec):
    """PPOSIL keys (SLM-Lab names): ``PPOSpec``'s plus ``SILFields``."""


class PPOSIL(SILMixin, PPO):
    """PPO + SIL (SLM-Lab ``PPOSIL``); see module docstring."""

    spec_cls = PPOSILSpec
    metric_names = PPO.metric_names + SIL_METRICS
