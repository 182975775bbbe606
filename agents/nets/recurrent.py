"""``RecurrentNet``: a GRU / LSTM / RNN over windows of the last L observations (SLM-Lab's RecurrentNet)."""

from __future__ import annotations

from typing import Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from agents.nets.layers import HIDDEN_GAIN, INIT_FNS, check_names, hidden_activation, init_linear, make_heads
from agents.nets.spec import NetSpec

RNN_CELLS: dict[str, type[nn.RNNBase]] = {"GRU": nn.GRU, "LSTM": nn.LSTM, "RNN": nn.RNN}


class RecurrentNet(nn.Module):
    """Recurrent net over a window of the last L observations (SLM-Lab ``RecurrentNet``): ``fc_hid_layers``
    applied to each step (Linear + activation), a ``cell_type`` cell (``nn.GRU`` / ``nn.LSTM`` / ``nn.RNN``
    with tanh, batch-first) run over the L steps from a zero hidden state, the last layer's final hidden
    state ``h_n[-1]`` (B, H) (with ``bidirectional``, as SLM-Lab, the backward direction's), extra inputs
    concatenated, then one or more linear heads.

    The window, not a hidden state, is what a rollout carries: the env returns each sub-env's last L
    observations, zero-padded at episode starts (``envs.wrappers.ObsWindow``, built by ``make_env`` with
    ``seq_len_of(net_spec)``), as SLM-Lab v4's sequence memories gave its RecurrentNet; the window lives in
    the (pickled) env, so it is reset at every episode end and restored exactly from a checkpoint.

    Args:
        in_shape: one input (L, *O): L = ``seq_len`` steps of observations O, flattened to D = prod(O).
        out_dims: size of each head; an int gives a single head.
        cell_type: key of ``RNN_CELLS``.
        hidden_size: H, the cell's hidden width; num_layers: stacked cell layers.
        fc_hid_layers: widths of the per-step layers before the cell; may be empty (the cell reads D).
        hid_layers_activation / out_layer_activation / init_fn / head_gains: as ``MLPNet``; ``init_fn`` also
            initializes every cell weight matrix (orthogonal_ with gain 1) and zeroes the cell biases.
        extra_in_dim: E, features of extra inputs joined to ``h_n[-1]`` before the heads.
        bidirectional: run the cell both ways over the window.

    Forward: ``x`` (B, L, *O) any dtype (cast to float32) and optional extras (B, E) -> (B, out_dim) if one
    head else a list of (B, out_dim_k).

    Raises:
        ValueError: an unknown ``cell_type``, an ``in_shape`` with fewer than 2 dims, or as ``MLPNet``.
    """

    def __init__(self, in_shape: Sequence[int], out_dims: int | Sequence[int], cell_type: str, hidden_size: int,
                 num_layers: int = 1, fc_hid_layers: Sequence[int] = (), hid_layers_activation: str = "relu",
                 init_fn: str | None = None, out_layer_activation: str | None = None,
                 head_gains: Sequence[float] | None = None, extra_in_dim: int = 0,
                 bidirectional: bool = False) -> None:
        super().__init__()
        check_names(hid_layers_activation, out_layer_activation, init_fn)
        if cell_type not in RNN_CELLS:
            raise ValueError(f"unknown cell_type '{cell_type}'; expected one of {sorted(RNN_CELLS)}")
        if len(in_shape) < 2:
            raise ValueError(f"RecurrentNet needs inputs (seq_len, *O), got shape {tuple(in_shape)}")
        self.seq_len, self.in_dim, self.cell_type = int(in_shape[0]), int(np.prod(in_shape[1:])), cell_type
        dims = [self.in_dim, *fc_hid_layers]
        fcs: list[nn.Module] = []
        for d_in, d_out in zip(dims[:-1], dims[1:]):
            fcs += [nn.Linear(d_in, d_out), hidden_activation(hid_layers_activation)]
        self.fc = nn.Sequential(*fcs)
        self.rnn = RNN_CELLS[cell_type](dims[-1], hidden_size, num_layers, batch_first=True,
                                        bidirectional=bidirectional)
        self.single_head, self.heads = make_heads(hidden_size + extra_in_dim, out_dims, out_layer_activation,
                                                   init_fn, head_gains, hid_layers_activation)
        for layer in self.fc:
            if isinstance(layer, nn.Linear):
                init_linear(layer, init_fn, HIDDEN_GAIN, hid_layers_activation)
        if init_fn is not None:
            for name, param in self.rnn.named_parameters():
                if name.startswith("weight"):
                    INIT_FNS[init_fn](param)
                else:
                    nn.init.zeros_(param)

    @classmethod
    def from_spec(cls, net_spec: NetSpec, obs_space: gym.Space, out_dims: int | Sequence[int],
                  head_gains: Sequence[float] | None = None, extra_in_dim: int = 0) -> RecurrentNet:
        """The recurrent net of ``net_spec`` for window observations ``obs_space`` of shape (seq_len, *O).

        Raises:
            ValueError: ``rnn_hidden_size`` or ``seq_len`` unset, a space that is not a numeric Box whose first
                dim is ``seq_len`` (the env was not built with ``seq_len_of(net_spec)``), or as the constructor.
        """
        for key in ("rnn_hidden_size", "seq_len"):
            if getattr(net_spec, key) is None:
                raise ValueError(f"agent.net.{key}: RecurrentNet needs it (a positive int)")
        shape = getattr(obs_space, "shape", None) or ()
        if not (isinstance(obs_space, gym.spaces.Box) and np.issubdtype(obs_space.dtype, np.number)
                and len(shape) >= 2 and shape[0] == net_spec.seq_len):
            raise ValueError(f"RecurrentNet needs numeric Box windows (seq_len={net_spec.seq_len}, *O) from the env "
                             f"(make_env with seq_len), got {obs_space}")
        return cls(shape, out_dims, net_spec.cell_type, net_spec.rnn_hidden_size, net_spec.rnn_num_layers,
                   net_spec.fc_hid_layers, net_spec.hid_layers_activation, net_spec.init_fn,
                   net_spec.out_layer_activation, head_gains, extra_in_dim, net_spec.bidirectional)

    def features(self, x: torch.Tensor, extra: Sequence[torch.Tensor]) -> torch.Tensor:
        """``h_n[-1]`` (B, H) of windows (B, L, *O), extra inputs (B, E_k) joined: (B, H + E)."""
        h = self.fc(x.float().reshape(len(x), self.seq_len, self.in_dim))
        _, h_n = self.rnn(h)
        h = (h_n[0] if self.cell_type == "LSTM" else h_n)[-1]  # LSTM: (h_n, c_n)
        if extra:
            h = torch.cat([h, *(e.reshape(len(e), -1).float() for e in extra)], dim=-1)
        return h

    def forward(self, x: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
        """(B, L, *O) and extras (B, E) -> (B, out_dim), or a list of (B, out_dim_k) with several heads."""
        h = self.features(x, extra)
        outs = [head(h) for head in self.heads]
        return outs[0] if self.single_head else outs
