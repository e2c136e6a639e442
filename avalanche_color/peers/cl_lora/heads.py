"""CL-LoRA's per-experience heads (``utils/inc_net.py`` ``OurNet`` and ``backbone/linears.py`` of the
authors' code): the cosine proxy head each experience trains with, and the class prototypes it leaves.

One row per (class, experience): its class, its experience and its prototype (zeros until the
experience ends). On a class-incremental stream that is one row per class, the code's diagonal
blocks of ``fc``; a class that returns in a later experience (a domain stream) gets another row.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from avalanche_color.peers.cl_lora.losses import cosine_logits
from avalanche_color.utils.state import host_value, keep_host_value


class ExperienceHeads(nn.Module):
    """Per experience: a proxy head ``σ cos(f, w_c)`` over its classes, its prototypes, whether it is finished.

    Args:
        features: the width of the features.
        like: a tensor of the trained weights' dtype (float32 beside a bfloat16 ViT) and the backbone's device.
    """

    finished: Tensor
    row_classes: Tensor
    row_experience: Tensor
    prototypes: Tensor
    ROWS = ("finished", "row_classes", "row_experience", "prototypes")  # buffers that grow with the stream

    def __init__(self, features: int, like: Tensor) -> None:
        super().__init__()
        self.proxy_weights = nn.ParameterList()  # per experience: (its classes, features)
        self.proxy_sigmas = nn.ParameterList()  # per experience: (1,), σ
        self.register_buffer("finished", torch.zeros(0, dtype=torch.bool, device=like.device))
        self.register_buffer("row_classes", torch.zeros(0, dtype=torch.long, device=like.device))
        self.register_buffer("row_experience", torch.zeros(0, dtype=torch.long, device=like.device))
        self.register_buffer("prototypes", like.new_zeros(0, features))

    def add_experience(self, classes: list[int], generator: torch.Generator) -> None:
        """A proxy head over ``classes`` (w uniform in ±1/√features, σ = 1) and their prototype rows."""
        like, e = self.prototypes, len(self.finished)
        bound = 1 / like.shape[1] ** 0.5
        weight = (torch.rand(len(classes), like.shape[1], generator=generator, dtype=torch.float64) * 2 - 1) * bound
        self.proxy_weights.append(nn.Parameter(weight.to(like.device, like.dtype)))
        self.proxy_sigmas.append(nn.Parameter(like.new_ones(1)))
        # The new rows are known on the host: kept beside the grown buffers, so that the experience's
        # first training step reads none of them back from the device.
        finished = self.finished_experiences() + [False]
        row_classes = host_value(self, "classes", self.row_classes, lambda t: t.tolist()) + list(classes)
        row_experience = host_value(self, "rows", self.row_experience, lambda t: t.tolist()) + [e] * len(classes)
        self.finished = torch.cat((self.finished, self.finished.new_zeros(1)))
        self.row_classes = torch.cat((self.row_classes, torch.tensor(classes, device=like.device)))
        self.row_experience = torch.cat((self.row_experience, self.row_experience.new_full((len(classes),), e)))
        self.prototypes = torch.cat((self.prototypes, like.new_zeros(len(classes), like.shape[1])))
        keep_host_value(self, "finished", self.finished, finished)
        keep_host_value(self, "classes", self.row_classes, row_classes)
        keep_host_value(self, "rows", self.row_experience, row_experience)

    def finished_experiences(self) -> list[bool]:
        """Per experience, whether it is finished (read on the host once per change)."""
        return host_value(self, "finished", self.finished, lambda t: [bool(f) for f in t.tolist()])

    def training_experience(self) -> Optional[int]:
        """The experience being learned: the newest, until :meth:`finish`; None after."""
        finished = self.finished_experiences()
        return len(finished) - 1 if finished and not finished[-1] else None

    def rows(self, experience: int) -> list[int]:
        experiences = host_value(self, "rows", self.row_experience, lambda t: t.tolist())
        return [i for i, e in enumerate(experiences) if e == experience]

    def class_ids(self, experience: int) -> list[int]:
        """``experience``'s classes, in the order of its proxy head's and prototypes' rows."""
        classes = host_value(self, "classes", self.row_classes, lambda t: t.tolist())
        return [classes[i] for i in self.rows(experience)]

    def proxy_logits(self, features: Tensor, experience: int) -> Tensor:
        return cosine_logits(features, self.proxy_weights[experience], self.proxy_sigmas[experience])

    def prototype_logits(self, features: dict[int, Tensor], num_classes: int) -> Tensor:
        """(batch, ``num_classes``): per class, its best ``cos(f_e, proto)`` over the experiences e of ``features``
        (experience -> the feature of its network) that trained it; ``-inf`` for the other classes."""
        scores = None
        for e, f in features.items():
            cos = F.normalize(f.to(self.prototypes.dtype), dim=1) @ F.normalize(self.prototypes[self.rows(e)], dim=1).T
            if scores is None:
                scores = cos.new_full((cos.shape[0], num_classes), float("-inf"))
            classes = self.class_ids(e)
            scores[:, classes] = torch.maximum(scores[:, classes], cos)
        if scores is None:
            raise ValueError("prototype_logits needs the features of at least one experience, got none")
        return scores

    @torch.no_grad()
    def set_prototypes(self, experience: int, prototypes: Tensor) -> None:
        self.prototypes[self.rows(experience)] = prototypes.to(self.prototypes.dtype)

    @torch.no_grad()
    def finish(self) -> None:
        if len(self.finished):
            self.finished[-1] = True
