"""Mixed precision for every strategy of the package: the ``precision=`` option (Lightning's names).

* ``"32-true"``: float32 throughout (the default; Avalanche's own loop, unchanged).
* ``"bf16-mixed"``: each forward and its loss, in training and in evaluation, run under
  ``torch.autocast(device, bfloat16)``. The weights stay as they are: the trained ones (experts,
  heads, prompts, magnitudes) float32, so an SGD update smaller than bfloat16's resolution
  (2⁻⁸ of the weight) still changes them; the backward computes each gradient in the dtype of
  its forward and accumulates it into the float32 ``.grad``. The routers, k-means and the
  closed-form solvers switch autocast off for themselves
  (:func:`~avalanche_color.utils.precision.full_precision`).
* ``"16-mixed"``: the same with float16, whose narrow range makes small gradients underflow: a
  ``torch.amp.GradScaler`` multiplies the loss before the backward and divides the gradients
  before the step (which it skips, lowering the scale, when a gradient is inf or NaN).

Casting the ViT itself (``vit.to(torch.bfloat16)``) halves the frozen backbone's memory; the trained weights must
not follow it, or most SGD updates vanish (kept in bfloat16, one step at lr 1e-3 changes no LoRA entry). Every
strategy of the package keeps its trained weights (experts, components, adapters, magnitudes, prompts, keys, heads,
prototypes) float32 beside such a backbone (:mod:`avalanche_color.lora.dtypes`): each kernel casts the factors to
the tokens' dtype, as autocast casts a linear layer's weight, so the model runs with or without autocast. Under
``"32-true"`` the backbone then computes in bfloat16 as given and the heads and the loss in float32;
``"bf16-mixed"`` adds autocast's float32 for the ops it keeps in float32 (on CUDA: norms, softmax, the loss). The
strategies warn when they are about to train weights narrower than float32 (a weight a subclass adds in bfloat16).

The mixin replaces Avalanche's training and evaluation loops (``SGDUpdate.training_epoch``,
``BaseSGDTemplate.eval_epoch``) with the same loops, callbacks in the same order, the forward and
the loss under autocast; mix it in just before ``SupervisedTemplate``.
"""

from __future__ import annotations

import warnings
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Optional

import torch

from avalanche_color.config import PRECISIONS
from avalanche_color.utils.checks import one_of, require

AUTOCAST_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}
# Trained in these dtypes, SGD updates below the weight's resolution are lost.
NARROW_DTYPES = (torch.bfloat16, torch.float16)


def autocast(precision: str, device: torch.device | str) -> AbstractContextManager:
    """The context a forward and its loss run in under ``precision`` on ``device``."""
    require("precision", precision, one_of(PRECISIONS))
    if precision == "32-true":
        return nullcontext()
    return torch.autocast(torch.device(device).type, dtype=AUTOCAST_DTYPES[precision])


def grad_scaler(precision: str, device: torch.device | str) -> Optional[torch.amp.GradScaler]:
    """A gradient scaler for ``"16-mixed"``; None for the others (bfloat16 has float32's range)."""
    require("precision", precision, one_of(PRECISIONS))
    return torch.amp.GradScaler(torch.device(device).type) if precision == "16-mixed" else None


def narrow_parameters(parameters: Any) -> dict[torch.dtype, int]:
    """How many of ``parameters`` (that require gradients) are in each dtype narrower than float32."""
    counts: dict[torch.dtype, int] = {}
    for parameter in parameters:
        if parameter.requires_grad and parameter.dtype in NARROW_DTYPES:
            counts[parameter.dtype] = counts.get(parameter.dtype, 0) + 1
    return counts


class MixedPrecision:
    """Mixin for a ``SupervisedTemplate`` whose ``config`` has a ``precision``: see the module."""

    config: Any
    _grad_scaler: Optional[torch.amp.GradScaler] = None
    _narrow_warned: bool = False

    @property
    def precision(self) -> str:
        return self.config.precision

    def autocast(self) -> AbstractContextManager:
        """The context of this strategy's forwards and losses (nothing under ``"32-true"``)."""
        return autocast(self.precision, self.device)  # type: ignore[attr-defined]

    def training_epoch(self, **kwargs: Any) -> None:
        """Avalanche's training epoch, the forward and the loss under :meth:`autocast`."""
        self._warn_narrow_weights()
        if self.precision == "32-true":
            return super().training_epoch(**kwargs)  # type: ignore[misc]
        if self.precision == "16-mixed" and self._grad_scaler is None:
            self._grad_scaler = grad_scaler(self.precision, self.device)  # type: ignore[attr-defined]
        strategy: Any = self
        for strategy.mbatch in strategy.dataloader:
            if strategy._stop_training:
                break
            strategy._unpack_minibatch()
            strategy._before_training_iteration(**kwargs)
            strategy.optimizer.zero_grad()
            strategy.loss = strategy._make_empty_loss()
            with self.autocast():
                strategy._before_forward(**kwargs)
                strategy.mb_output = strategy.forward()
                strategy._after_forward(**kwargs)
                strategy.loss += strategy.criterion()
            strategy._before_backward(**kwargs)
            strategy.backward()
            strategy._after_backward(**kwargs)
            strategy._before_update(**kwargs)
            strategy.optimizer_step()
            strategy._after_update(**kwargs)
            strategy._after_training_iteration(**kwargs)

    def eval_epoch(self, **kwargs: Any) -> None:
        """Avalanche's evaluation epoch, the forward and the loss under :meth:`autocast`."""
        with self.autocast():
            return super().eval_epoch(**kwargs)  # type: ignore[misc]

    def backward(self) -> None:
        """The backward of the loss (scaled under ``"16-mixed"``)."""
        scaler = self._grad_scaler
        if scaler is None:
            return super().backward()  # type: ignore[misc]
        strategy: Any = self
        scaler.scale(strategy.loss).backward(retain_graph=strategy.retain_graph)

    def unscale_gradients(self) -> None:
        """Under ``"16-mixed"``, divide the gradients by the scale now (before clipping them); else nothing."""
        if self._grad_scaler is not None:
            self._grad_scaler.unscale_(self.optimizer)  # type: ignore[attr-defined]

    def optimizer_step(self) -> None:
        """The optimiser's step (under ``"16-mixed"`` the scaler's: skipped when a gradient is inf or NaN)."""
        scaler = self._grad_scaler
        if scaler is None:
            return super().optimizer_step()  # type: ignore[misc]
        scaler.step(self.optimizer)  # type: ignore[attr-defined]
        scaler.update()

    def _warn_narrow_weights(self) -> None:
        if self._narrow_warned:
            return
        narrow = narrow_parameters(p for group in self.optimizer.param_groups  # type: ignore[attr-defined]
                                   for p in group["params"])
        if narrow:
            self._narrow_warned = True
            dtypes = ", ".join(str(dtype).removeprefix("torch.") for dtype in narrow)
            warnings.warn(
                f"{type(self).__name__} trains weights in {dtypes}: SGD updates smaller than that dtype's "
                f"resolution are lost, so most weights stop changing. Make the trained weights float32 "
                f"(avalanche_color.lora.dtypes.trained_dtype) and use precision='bf16-mixed' for a bfloat16 "
                f"forward, as the package's strategies do (their trained weights stay float32 beside a bfloat16 "
                f"ViT too)", UserWarning, stacklevel=2)
