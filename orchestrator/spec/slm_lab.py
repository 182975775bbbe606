"""SLM-Lab compatibility tables: the keys and names SLM-Lab's spec files use that this lab does not implement.

Every key SLM-Lab defines either works here with SLM-Lab's meaning (an ordinary field of a section dataclass)
or is listed in ``SLM_LAB_KEYS`` with the feature it belongs to: it is accepted with one of its neutral values
(the ones that mean "feature off", or that match what the lab does anyway) and otherwise refused with exit 2
naming the feature, never as an "unknown key". The table is consulted only for keys that are not fields of
their section, so a key becomes an ordinary field once its feature is built (and its row can go).
``SLM_LAB_NAMES`` does the same for registry names (algorithms, nets, memories, optimizers, losses).
"""

from __future__ import annotations

import json
from typing import Any

_V3_LR = ("SLM-Lab v3's lr decay setting, read only with agent.net.lr_decay (refused unless null); SLM-Lab v5.3 "
          "reads it nowhere, so it is accepted and unread")
ANY = object()  # in a key's neutral values: every value is accepted (SLM-Lab's own code does not read the key)
SLM_LAB_KEYS: dict[str, tuple[tuple[Any, ...], str]] = {
    "agent.algorithm.training_batch_iter": ((ANY,), "batch iterations of off-policy algorithms (SLM-Lab's PPO and "
                                                    "ActorCritic do not read it either)"),
    "agent.algorithm.clip_val_loss": ((False, None), "a clipped value loss (in SLM-Lab's PPO specs; its code reads "
                                                     "clip_vloss, never clip_val_loss)"),
    "agent.algorithm.num_step_returns": ((None,), "n-step returns (read by ActorCritic and PPO only)"),
    "agent.algorithm.policy_loss_coef": ((1.0, 1), "a policy-loss coefficient (read by REINFORCE, ActorCritic and "
                                                   "PPO only)"),
    "agent.algorithm.clip_eps": ((None,), "SLM-Lab v4's fixed clip range (v5 and the lab: clip_eps_spec)"),
    "agent.algorithm.entropy_coef": ((None,), "SLM-Lab v4's fixed entropy coefficient (v5 and the lab: "
                                              "entropy_coef_spec)"),
    "agent.algorithm.clip_vloss": ((False, None), "PPO's clipped value loss (read by PPO only)"),
    "agent.algorithm.normalize_v_targets": ((False, None), "running normalization of value targets (read by "
                                                           "ActorCritic and PPO only)"),
    "agent.algorithm.normalize_advantages": (("standardize",), "advantage normalization by percentiles "
                                                               "(DreamerV3; read by PPO only)"),
    "agent.algorithm.symlog": ((False, None), "symlog value targets (read by PPO only)"),
    "agent.algorithm.sil_policy_loss_coef": ((ANY,), "a self-imitation loss coefficient (read by SIL and PPOSIL "
                                                     "only; SLM-Lab's other algorithms ignore it too)"),
    "agent.algorithm.sil_val_loss_coef": ((ANY,), "a self-imitation loss coefficient (read by SIL and PPOSIL only; "
                                                  "SLM-Lab's other algorithms ignore it too)"),
    "agent.algorithm.spectral_norm": ((False, None), "spectral normalization of the nets"),
    "agent.net.use_same_optim": ((False, None, True), "the critic net built with the actor's optimizer spec "
                                                      "(applied by spec.apply_use_same_optim)"),
    "agent.net.actor_init_std": ((None, 0.01), "a policy-head init std other than 0.01 (with init_fn "
                                               "orthogonal_ the lab uses 0.01 on policy heads)"),
    "agent.net.critic_init_std": ((None, 1.0, 1), "a value-head init std other than 1 (with init_fn orthogonal_ "
                                                  "the lab uses 1 on value heads)"),
    "agent.net.lr_decay": ((None,), "SLM-Lab v3's lr decay (use lr_scheduler_spec)"),
    "agent.net.lr_decay_frequency": ((ANY,), _V3_LR),
    "agent.net.lr_decay_min_timestep": ((ANY,), _V3_LR),
    "agent.net.lr_anneal_timestep": ((ANY,), _V3_LR),
    "env.unity": ((None,), "SLM-Lab v4's Unity ML-Agents env settings (Unity envs are not installed here)"),
    "meta.train_mode": ((ANY,), "SLM-Lab v4's meta.train_mode, which its code reads nowhere (the mode is the MODE "
                                "argument: dev, train, search)"),
    "agent.algorithm.normalize_state": ((ANY,), "SLM-Lab v3's normalization of sampled states, which v4 moved to "
                                                "env.normalize_state and reads nowhere under agent.algorithm"),
}
# SLM-Lab v3's fixed values that v4 and v5 replaced by a schedule: unread whenever the schedule is written beside
# them (in every SLM-Lab since v4), so spec.normalize drops them, and searches over them, in that case.
SHADOWED_BY: dict[str, str] = {"agent.algorithm.clip_eps": "clip_eps_spec",
                               "agent.algorithm.entropy_coef": "entropy_coef_spec"}


SLM_LAB_NAMES: dict[str, dict[str, str]] = {
    "agent.algorithm.name": {
        "HydraDQN": "SLM-Lab's multi-env hydra DQN (several envs per agent); this lab runs one env per agent",
        "DuelingDQN": "an old SLM-Lab name (v5 writes DQN with net.type DuelingMLPNet)",
        "DuelingDoubleDQN": "an old SLM-Lab name (v5 writes DoubleDQN with net.type DuelingMLPNet)",
        "DRQN": "an old SLM-Lab recurrent DQN (v5: DQN with net.type RecurrentNet)",
        "DDRQN": "an old SLM-Lab recurrent double DQN (v5: DoubleDQN with net.type RecurrentNet)",
    },
    "agent.net.type": {
        "HydraMLPNet": "SLM-Lab's multi-env hydra net; this lab runs one env per agent",
    },
    "agent.memory.name": {},
    "optimizer": {},
    "agent.net.loss_spec.name": {
        "CrossEntropyLoss": "a classification loss (SLM-Lab's cross-entropy experiments); value and Q regression "
                            "here use MSELoss, SmoothL1Loss or HuberLoss",
    },
}


def slm_lab_key_problem(dotted: str, value: Any) -> str | None:
    """Why an SLM-Lab key this lab does not implement cannot take ``value`` (None when it is neutral)."""
    values, feature = SLM_LAB_KEYS[dotted]
    if ANY in values or any(value is v if bool in (type(value), type(v)) or v is None else value == v for v in values):
        return None
    allowed = f"; allowed only as {' or '.join(json.dumps(v) for v in values)}" if values else ""
    got = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    return f"{dotted}: SLM-Lab key not supported here: {feature}{allowed}, got {got}"


def slm_lab_name_problem(path: str, name: Any, valid: list[str]) -> str | None:
    """An SLM-Lab registry name this lab does not have, with the feature it is (None for other names)."""
    table = SLM_LAB_NAMES.get("optimizer" if path.endswith("optim_spec.name") else path, {})
    if not isinstance(name, str) or name not in table:
        return None
    return f"{path}: {name!r} ({table[name]}) is not available here; expected one of {valid}"
