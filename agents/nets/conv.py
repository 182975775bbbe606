"""The conv family: ``ConvNet`` and ``DuelingConvNet`` for image observations (Mnih et al. 2015's Nature CNN by
default), their layer arguments and image layouts."""

from __future__ import annotations

from typing import Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from agents.nets.layers import HIDDEN_GAIN, check_names, dueling_q, hidden_activation, init_linear, make_heads
from agents.nets.spec import NetSpec

# agent.net.precision -> the autocast dtype of a conv net's body (None: no autocast)
PRECISIONS: dict[str, torch.dtype | None] = {"float32": None, "bfloat16": torch.bfloat16}
PRECISION_NETS = ("ConvNet", "DuelingConvNet")  # the net types that read agent.net.precision


def conv_layer_args(layer: Sequence[int]) -> tuple[int, int, int, int, int]:
    """SLM-Lab's ``[out, kernel, stride, padding, dilation]`` (last two optional: 0, 1) as a 5-tuple of ints.

    Raises:
        ValueError: not 3 to 5 ints, or a non-positive out/kernel/stride/dilation or a negative padding.
    """
    layer = list(layer)
    if not 3 <= len(layer) <= 5 or not all(isinstance(v, int) and not isinstance(v, bool) for v in layer):
        raise ValueError(f"conv layer {layer}: expected [out, kernel, stride, padding, dilation] ints")
    out, kernel, stride, padding, dilation = [*layer, 0, 1][:5] if len(layer) == 3 else [*layer, 1][:5]
    if min(out, kernel, stride, dilation) < 1 or padding < 0:
        raise ValueError(f"conv layer {layer}: out, kernel, stride, dilation must be >= 1 and padding >= 0")
    return out, kernel, stride, padding, dilation


class ConvNet(nn.Module):
    """Conv net for image observations: ``conv_hid_layers`` (Conv2d + activation each), flatten, extra inputs
    concatenated, ``fc_hid_layers`` (Linear + activation), then one or more linear heads (SLM-Lab ``ConvNet``;
    defaults the Nature CNN of Mnih et al. 2015).

    Args:
        in_shape: one observation: (C, H, W) channel-first (a frame stack), (H, W) (one grayscale channel
            added), or (H, W, C) with C in {1, 3, 4} and H, W > 4 (channel-last: permuted inside).
        out_dims: size of each head; an int gives a single head.
        conv_hid_layers: ``[[out, kernel, stride, padding, dilation], ...]``, see ``conv_layer_args``.
        fc_hid_layers: widths after the convolutions; may be empty (heads on the conv features).
        hid_layers_activation / out_layer_activation / init_fn / head_gains: as ``MLPNet`` (orthogonal init:
            ``HIDDEN_GAIN`` on conv and fc layers).
        extra_in_dim: E, features of extra inputs joined to the flattened conv output.
        obs_scale: multiplier of the input (1/255 for uint8 pixels) or None.
        precision: ``"float32"``, or ``"bfloat16"``: convolutions and fc layers under ``torch.autocast``
            (bfloat16 on the input's device), their output cast back to float32 before the heads.
        batch_norm: a ``BatchNorm2d`` after the activation of every conv layer but the first (SLM-Lab's ConvNet).

    Forward: ``x`` (B, *in_shape) any dtype (uint8 stays uint8 until here; cast to float32, times
    ``obs_scale``) and optional extras (B, E) -> (B, out_dim) float32 if one head else a list of (B, out_dim_k).

    Raises:
        ValueError: a shape other than the three above, a bad conv layer, an image too small for the
            convolutions, or (as ``MLPNet``) unknown activation/init names or head gains.
    """

    def __init__(self, in_shape: Sequence[int], out_dims: int | Sequence[int], conv_hid_layers: Sequence[Sequence[int]],
                 fc_hid_layers: Sequence[int], hid_layers_activation: str = "relu", init_fn: str | None = None,
                 out_layer_activation: str | None = None, head_gains: Sequence[float] | None = None,
                 extra_in_dim: int = 0, obs_scale: float | None = None, precision: str = "float32",
                 batch_norm: bool = False) -> None:
        super().__init__()
        check_names(hid_layers_activation, out_layer_activation, init_fn)
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {precision!r}")
        self.in_shape, self.obs_scale = tuple(in_shape), obs_scale
        self.autocast_dtype = PRECISIONS[precision]
        self.layout = image_layout(self.in_shape)
        chw = self.chw_shape(self.in_shape)
        convs: list[nn.Module] = []
        channels = chw[0]
        for i, layer in enumerate(conv_hid_layers):
            out, kernel, stride, padding, dilation = conv_layer_args(layer)
            convs += [nn.Conv2d(channels, out, kernel, stride, padding, dilation),
                      hidden_activation(hid_layers_activation), *([nn.BatchNorm2d(out)] if batch_norm and i else [])]
            channels = out
        self.conv = nn.Sequential(*convs, nn.Flatten())
        self.conv.eval()  # the size probe below must not update batch-norm statistics
        with torch.no_grad():
            try:
                conv_dim = int(self.conv(torch.zeros(1, *chw)).shape[-1])
            except RuntimeError as err:
                raise ValueError(f"observation {self.in_shape} too small for conv layers {conv_hid_layers}: {err}")
        self.conv.train()
        dims = [conv_dim + extra_in_dim, *fc_hid_layers]
        fcs: list[nn.Module] = []
        for d_in, d_out in zip(dims[:-1], dims[1:]):
            fcs += [nn.Linear(d_in, d_out), hidden_activation(hid_layers_activation)]
        self.fc = nn.Sequential(*fcs)
        self.single_head, self.heads = make_heads(dims[-1], out_dims, out_layer_activation, init_fn, head_gains,
                                                   hid_layers_activation)
        for layer in [*self.conv, *self.fc]:
            if isinstance(layer, (nn.Linear, nn.Conv2d)):
                init_linear(layer, init_fn, HIDDEN_GAIN, hid_layers_activation)
        # NHWC kernels: on CPU (oneDNN) a Nature-CNN forward + backward of 256 frames takes 0.21 s instead of 0.39 s
        # on one thread; the weights keep their values and logical shapes (state_dict, sha256 unchanged in meaning)
        self.conv.to(memory_format=torch.channels_last)

    @classmethod
    def from_spec(cls, net_spec: NetSpec, obs_space: gym.Space, out_dims: int | Sequence[int],
                  head_gains: Sequence[float] | None = None, extra_in_dim: int = 0) -> ConvNet:
        """The conv net of ``net_spec`` for an image ``obs_space`` (numeric Box of 2 or 3 dims).

        ``normalize`` None scales by 1/255 when the space is uint8; true always; false never.

        Raises:
            ValueError: a space that is not a numeric image Box, or as the constructor.
        """
        if not (isinstance(obs_space, gym.spaces.Box) and np.issubdtype(obs_space.dtype, np.number)):
            raise ValueError(f"{cls.__name__} needs a numeric Box observation space, got {obs_space}")
        scale = net_spec.normalize if net_spec.normalize is not None else obs_space.dtype == np.uint8
        return cls(obs_space.shape, out_dims, net_spec.conv_hid_layers, net_spec.fc_hid_layers,
                   net_spec.hid_layers_activation, net_spec.init_fn, net_spec.out_layer_activation, head_gains,
                   extra_in_dim, 1.0 / 255.0 if scale else None, net_spec.precision, net_spec.batch_norm)

    def chw_shape(self, shape: tuple[int, ...]) -> tuple[int, int, int]:
        """(C, H, W) of one observation of ``shape`` under this net's layout."""
        if self.layout == "hw":
            return (1, *shape)
        return (shape[2], shape[0], shape[1]) if self.layout == "hwc" else tuple(shape)

    def features(self, x: torch.Tensor, extra: Sequence[torch.Tensor]) -> torch.Tensor:
        """fc output (B, F) of observations (B, *in_shape) and extra inputs, each (B, E_k)."""
        if self.layout == "hw":
            x = x.unsqueeze(1)
        elif self.layout == "hwc":
            x = x.permute(0, 3, 1, 2)
        x = x.contiguous(memory_format=torch.channels_last)  # NHWC while still uint8: a quarter of the bytes
        dtype = self.autocast_dtype or torch.float32  # the convs' input dtype (autocast would cast to it anyway)
        if x.dtype != dtype:  # uint8 (or float32 under bf16) -> dtype once, scaled in place (layout kept)
            x = x.to(dtype)
            if self.obs_scale is not None:
                x.mul_(self.obs_scale)
        elif self.obs_scale is not None:  # a float32 input is not modified
            x = x * self.obs_scale
        with torch.autocast(x.device.type, dtype=self.autocast_dtype or torch.bfloat16,
                            enabled=self.autocast_dtype is not None):
            h = self.conv(x)
            if extra:
                h = torch.cat([h, *(e.reshape(len(e), -1).float() for e in extra)], dim=-1)
            return self.fc(h).float()

    def forward(self, x: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
        """(B, *in_shape) and extras (B, E) -> (B, out_dim), or a list of (B, out_dim_k) with several heads."""
        h = self.features(x, extra)
        outs = [head(h) for head in self.heads]
        return outs[0] if self.single_head else outs


class DuelingConvNet(ConvNet):
    """Dueling Q-network (Wang et al. 2016) on a ``ConvNet`` body: ``Q = V + A - mean_a A`` (B, A).

    Same arguments as ``ConvNet`` with one head (``out_dims`` = number of actions).

    Raises:
        ValueError: as ``ConvNet``, or ``out_dims`` that is not one int.
    """

    def __init__(self, in_shape: Sequence[int], out_dims: int | Sequence[int], conv_hid_layers: Sequence[Sequence[int]],
                 fc_hid_layers: Sequence[int], hid_layers_activation: str = "relu", init_fn: str | None = None,
                 out_layer_activation: str | None = None, head_gains: Sequence[float] | None = None,
                 extra_in_dim: int = 0, obs_scale: float | None = None, precision: str = "float32",
                 batch_norm: bool = False) -> None:
        if not isinstance(out_dims, int):
            raise ValueError(f"DuelingConvNet has one Q head (int out_dims), got {out_dims}")
        gains = None if head_gains is None else [head_gains[0], head_gains[0]]
        super().__init__(in_shape, [1, out_dims], conv_hid_layers, fc_hid_layers, hid_layers_activation, init_fn,
                         out_layer_activation, gains, extra_in_dim, obs_scale, precision, batch_norm)
        self.single_head = True

    def forward(self, x: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor:
        """(B, *in_shape) and extras (B, E) -> Q-values (B, A) float32."""
        return dueling_q(self.heads, self.features(x, extra))


def image_layout(shape: Sequence[int]) -> str:
    """``"chw"``, ``"hw"`` or ``"hwc"`` (channel-last: last dim 1, 3 or 4 and the first two > 4) of one image.

    Raises:
        ValueError: a shape of other than 2 or 3 dims.
    """
    if len(shape) == 2:
        return "hw"
    if len(shape) != 3:
        raise ValueError(f"conv nets need (C, H, W), (H, W) or (H, W, C) observations, got shape {tuple(shape)}")
    return "hwc" if shape[2] in (1, 3, 4) and min(shape[0], shape[1]) > 4 else "chw"
