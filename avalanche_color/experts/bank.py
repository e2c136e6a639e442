"""The experts of a routed model, their heads and their records, with an explicit life cycle.

An expert is one module per *slot* (CoLoR: a :class:`~avalanche_color.lora.qv_experts.QVLoRA` in
every block's qkv layer; S-Prompts: its prompt tokens) plus a linear head. The slots live where the
model computes with them (inside the backbone, for LoRA), so the bank refers to them without
owning them; it owns the heads and, per expert, where it comes from (training experience, task
label) and whether its experience is over.

Life cycle: :meth:`ExpertBank.start_expert` adds an expert, which becomes the one that trains;
:meth:`ExpertBank.finish_expert` ends it. Which expert trains is set in one place,
:meth:`ExpertBank.set_trainable`, which also sets ``requires_grad``: nothing reads ``requires_grad``
back to decide anything (a user's ``model.requires_grad_(True)`` changes no computation).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Optional, Protocol

import torch
from torch import Tensor, nn

from avalanche_color.experts.heads import ExpertHead


class ExpertKind(Protocol):
    """What an expert is, for a routed model: the slots its modules go in (one module per slot) and how
    a new one is made, with the expert's settings (CoLoR's rank, S-Prompts' prompt length) held here."""

    slots: Sequence[nn.ModuleList]

    def new_expert_modules(self) -> list[nn.Module]:
        """The modules of one new expert, one per slot, on the slots' device, not yet added."""
        ...


class ExpertBank(nn.Module):
    """Every expert's modules (in ``slots``) and head, its origin, and which expert trains.

    Args:
        slots: the lists to which each expert adds one module, registered where they live.
    """

    experiences: Tensor
    tasks: Tensor
    finished: Tensor

    def __init__(self, slots: Sequence[nn.ModuleList]) -> None:
        super().__init__()
        self.slots = list(slots)  # a plain list: the slots are submodules of the model, not of the bank
        self.heads = nn.ModuleList()
        # Where each expert comes from: its training experience and task label (an experience
        # with several task labels records its smallest).
        self.register_buffer("experiences", torch.empty(0, dtype=torch.long))
        self.register_buffer("tasks", torch.empty(0, dtype=torch.long))
        # Whether each expert's experience is over (its router fitted for good).
        self.register_buffer("finished", torch.empty(0, dtype=torch.bool))
        self.trainable: Optional[int] = None  # the expert that trains: set only by set_trainable

    def __len__(self) -> int:
        return len(self.heads)

    def start_expert(self, modules: Sequence[nn.Module], head: ExpertHead, experience: int = -1,
                     task: int = 0) -> int:
        """Add an expert (one module per slot, and its head); it becomes the one that trains.

        Returns:
            the new expert's index.
        """
        for slot, module in zip(self.slots, modules, strict=True):
            slot.append(module)
        self.heads.append(head)
        new = self.experiences.new_tensor
        self.experiences = torch.cat((self.experiences, new([experience])))
        self.tasks = torch.cat((self.tasks, new([task])))
        self.finished = torch.cat((self.finished, self.finished.new_zeros(1)))
        self.set_trainable(len(self) - 1)
        return len(self) - 1

    def finish_expert(self, expert: int) -> None:
        """End ``expert``'s experience: it never trains again (training on it again adds a further expert)."""
        self.finished[expert] = True
        if self.trainable == expert:
            self.set_trainable(None)

    def set_trainable(self, expert: Optional[int]) -> None:
        """Make ``expert`` the one that trains (None: none does), its parameters the only ones with
        ``requires_grad``; every other expert's parameters are frozen and lose stale gradients."""
        if expert is not None and not 0 <= expert < len(self):
            raise ValueError(f"expert must be None or an index in [0, {len(self)}), got {expert!r}")
        for index in range(len(self)):
            for parameter in self.expert_parameters(index):
                parameter.requires_grad_(index == expert)
                if index != expert:
                    parameter.grad = None
        self.trainable = expert

    def newest_unfinished(self) -> Optional[int]:
        """The newest expert if its experience is not over (the one that trains after loading), else None."""
        newest = len(self) - 1
        return newest if newest >= 0 and not bool(self.finished[newest]) else None

    def current_expert(self, experience: int) -> Optional[int]:
        """The newest expert if it belongs to ``experience`` and is not finished (a run resumed inside it)."""
        newest = self.newest_unfinished()
        return newest if newest is not None and int(self.experiences[newest]) == experience else None

    def expert_modules(self, expert: int) -> Iterator[nn.Module]:
        """The modules that hold ``expert``'s own parameters, its head excluded."""
        for slot in self.slots:
            yield slot[expert]

    def expert_parameters(self, expert: int) -> Iterator[nn.Parameter]:
        """The parameters of one expert: its own modules' and its head's (what its optimiser takes)."""
        for module in self.expert_modules(expert):
            yield from module.parameters()
        yield from self.heads[expert].parameters()

    def check_distinct_task(self, task: int, experience: int) -> None:
        """Oracle routing finds an expert by task label: refuse a label another experience already has."""
        for other_experience, other_task in zip(self.experiences.tolist(), self.tasks.tolist()):
            if other_task == task and other_experience != experience:
                raise ValueError(
                    f"router='oracle' routes by task label, so every experience needs its own: experience "
                    f"{experience} has task label {task}, like experience {other_experience}. Use a "
                    f"task-incremental stream (e.g. task_incremental_benchmark, or nc_benchmark(..., "
                    f"task_labels=True)), or another router (router='prototypes': CoLoR)"
                )
