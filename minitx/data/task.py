"""The registry of known-answer tasks (synthetic data sources), as minitx/kinds.py is the kinds'.

A `TaskSpec` names a task (a value of `data.source`) and its options: a dataclass defined beside
the task's generator, whose fields are the task's settings (`data.task.<name>.<field>` in a
config, `--data.task.zoology.pairs 16` on a command line) and whose annotations and
`__post_init__` are their checks. What the data module and evaluation ask of a task is `Task`,
below: its samples, its vocabulary, and the evaluation hooks a task may offer.

Adding a task is one file (its options, its `Task`, its `TaskSpec`) and one registration, in
minitx/data/config.py, which builds the `data.task` section from this registry.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from minitx import options


class TaskSample(typing.Protocol):
    """What every task's sample holds: the ids (the input and one more token: targets are the ids
    shifted by one) and, aligned with them, True where a token is scored."""

    ids: list[int]
    loss_mask: list[bool]


@dataclass(frozen=True)  # a dataclass without fields: jsonargparse reads a task's options as plain fields
class Task:
    """A known-answer task built from its options: what the data module and evaluation call.

    Required (the data module): `sample(seed, index)` (a pure function of its arguments),
    `max_length()` (tokens of the longest sample) and `tokenizer()`; `pad_id`, the token that pads
    a batch's shorter samples, is 0 unless the task says otherwise.
    Evaluation hooks (minitx/evaluation/tasks.py), each optional; the defaults here say the task
    has none:
      reference_losses(samples)  what known strategies lose on the same test samples (markov)
      sweeps_lengths             scored again at each of --lengths (induction): at_length(length)
                                 gives the same task at another input length, trained_span() what
                                 the trained samples reach (an answer's furthest distance back
                                 from its query, its latest position)
      recalls                    the samples carry recall_positions(): (keys, values, queries)
                                 positions, whose attention the recall circuit reads (zoology, induction)
      depth_grid                 evaluated over needle depths x lengths instead of one test set (needle)
    """

    pad_id: ClassVar[int] = 0
    sweeps_lengths: ClassVar[bool] = False
    recalls: ClassVar[bool] = False
    depth_grid: ClassVar[bool] = False

    def sample(self, seed: int, index: int) -> TaskSample:
        raise NotImplementedError

    def max_length(self) -> int:
        raise NotImplementedError

    def tokenizer(self) -> Any:
        raise NotImplementedError

    def reference_losses(self, samples: list) -> dict[str, float] | None:
        return None

    def at_length(self, length: int) -> Task:
        raise NotImplementedError(f"{type(self).__name__} does not sweep lengths (sweeps_lengths)")

    def trained_span(self) -> tuple[int, int]:
        raise NotImplementedError(f"{type(self).__name__} does not sweep lengths (sweeps_lengths)")


@dataclass(frozen=True)
class TaskSpec:
    """What one known-answer task declares about itself.

    name: the value of `data.source`, and the section `data.task.<name>`.
    options: a dataclass with a default for every field: the task's settings. Its annotations are
        checked (int, float, bool, str, Literal choices, None), its __post_init__ checks the rest
        and raises UserError naming `data.task.<name>.<field>`.
    length_option: the option that sets a sample's length, named when the samples do not fit the
        model's block_size.
    build: options -> the Task; None when the options object is the Task itself.
    """

    name: str
    options: type
    length_option: str
    build: Callable[[Any], Task] | None = None

    def task(self, options: Any) -> Task:
        return options if self.build is None else self.build(options)


registry: dict[str, TaskSpec] = {}


def register(spec: TaskSpec) -> TaskSpec:
    """Add a task (or replace the one of the same name); returns the spec."""
    options.check_options_class(f"task {spec.name}", spec.options)
    if spec.build is None and not issubclass(spec.options, Task):
        raise TypeError(
            f"task {spec.name}: its options are not a Task; subclass minitx.data.task.Task or give build"
        )
    if spec.length_option not in [f.name for f in fields(spec.options)]:
        raise TypeError(f"task {spec.name}: length_option {spec.length_option!r} is not one of its options")
    registry[spec.name] = spec
    return spec


def build_options(name: str, given: Any) -> Any:
    """The options object of task `name` from what a config holds for `data.task.<name>`: a
    mapping of the options set (the rest take their defaults), or the options object itself."""
    spec = registry[name]
    if isinstance(given, spec.options):
        return given
    return options.build_options(f"data.task.{name}", f"the {name} task", spec.options, given)
