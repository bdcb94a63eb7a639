"""What a plain model must be for espn to convert it, checked before conversion so that a
model espn cannot use is refused with one line naming the module and the way out (rather
than a torch error at the first training step, or a division by zero in the tracer)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor, nn

from espn.errors import EspnError
from espn.supernet.flops import run_eval

if TYPE_CHECKING:
    from espn.models.registry import ModelSpec


class ModelShapeError(EspnError, ValueError):
    """A model espn cannot convert as it is; the message names the module and what to do."""


#: the size attributes of the layers espn converts: a zero means a layer with no units
_SIZES = ("in_features", "out_features", "in_channels", "out_channels", "num_features")


def check_plain_model(model: nn.Module, example_input: Tensor) -> None:
    """Refuse a model with an empty layer (``nn.Linear(64, 0)``), frozen parameters (espn
    decides which weights train, so a frozen backbone would silently be trained), or a
    ``forward`` that does not return one logits tensor ``[N, classes]`` (see
    docs/architectures.md, "Refused")."""
    for name, m in model.named_modules():
        empty = [a for a in _SIZES if getattr(m, a, None) == 0]
        if empty:
            raise ModelShapeError(
                f"module {name or type(model).__name__!r} ({m}) has {empty[0]} 0: a layer "
                "needs at least one input and one output unit"
            )
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    if frozen:
        raise ModelShapeError(
            f"parameter {frozen[0]!r} is frozen (requires_grad False; {len(frozen)} frozen in "
            "all): espn decides which weights each task trains and freezes, so unfreeze the "
            "model (model.requires_grad_(True)) before wrapping it, or adopt pretrained "
            "weights as the first task (--init-weights)"
        )
    out = run_eval(model, example_input)
    if not isinstance(out, Tensor):
        raise ModelShapeError(
            f"forward() returns a {type(out).__name__}, not one tensor of logits: espn trains, "
            "counts and exports the logits [N, classes] alone; wrap the model in a module "
            "whose forward returns them (e.g. return self.model(x)[0] or ['logits'])"
        )
    if out.dim() != 2 or out.shape[0] != example_input.shape[0]:
        raise ModelShapeError(
            f"forward() returns a tensor of shape {list(out.shape)} for a batch of "
            f"{example_input.shape[0]}: espn needs logits of shape [N, classes]"
        )


def image_channels(spec: ModelSpec, family: str) -> int:
    """The channels of ``spec``'s images, for a model ``family`` that takes (C, H, W) only."""
    if len(spec.input_shape) != 3:
        raise ValueError(
            f"{family} take images shaped (channels, height, width), got input shape "
            f"{tuple(spec.input_shape)}"
        )
    return int(spec.input_shape[0])
