"""What a stream builder is given (:class:`StreamRequest`) and how it refuses a setting (:class:`SettingError`),
and the form that names a user's benchmark function: below both the registry of benchmarks and the builders
(:mod:`~avalanche_color.benchmarks.user_data`), which the registry calls, so neither imports the other's module
for them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

# A user's benchmark function, named as entry points name objects: package.module:function (or :Class.method).
CALLABLE_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
CALLABLE_FORM = "package.module:function"


def is_callable_name(name: object) -> bool:
    """Whether ``name`` names a user's benchmark function (``package.module:function``)."""
    return isinstance(name, str) and CALLABLE_NAME.match(name) is not None


class SettingError(ValueError):
    """A stream refused for one of the runner's settings: ``setting`` is its name (a RunConfig field, e.g.
    ``"experiences"``), so that the runner names the right flag."""

    def __init__(self, setting: str, message: str) -> None:
        super().__init__(message)
        self.setting = setting


@dataclass(frozen=True)
class StreamRequest:
    """What a stream is built with.

    Attributes:
        image_size, mean, std: the backbone's input size and normalisation.
        interpolation: the backbone's resampling (timm's name), for the offline streams, whose
            images are resized to its input size; the paper's streams keep S-Prompts' bilinear.
        data: the data set's zip file or folder; None: the benchmark's default place.
        seed: the seed of the benchmark's random split or class order, where it has one.
        task_labels: experience i gets task label i (for oracle routing).
        train_per_class: a seeded subsample of each class's training images (cheaper CPU runs),
            where the benchmark supports it; None: all.
        augmentation: the offline streams' training augmentation, ``"light"`` or ``"paper"``
            (:mod:`~avalanche_color.benchmarks.transforms`); None: the benchmark's own.
        experiences: how many experiences a class-incremental image folder's classes are split into;
            None: two classes each.
    """

    image_size: int
    mean: Sequence[float]
    std: Sequence[float]
    data: Optional[Path] = None
    seed: int = 0
    task_labels: bool = False
    train_per_class: Optional[int] = None
    interpolation: str = "bilinear"
    augmentation: Optional[str] = None
    experiences: Optional[int] = None

    @property
    def images(self) -> dict[str, Any]:
        """The keywords of every stream builder that say how images are prepared."""
        return dict(image_size=self.image_size, mean=self.mean, std=self.std)

    @property
    def paths(self) -> tuple[Path, ...]:
        """The data path as the optional first argument of a builder."""
        return () if self.data is None else (Path(self.data),)
