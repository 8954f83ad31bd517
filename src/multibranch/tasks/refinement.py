"""A task that refines another (code generation refines translation): its folder holds only what it
changes, and the registry joins it to the task it refines, so that no task folder imports another.

    class CodeTask(Refinement):          # tasks/code/task.py: the data it owns, its metrics
        name = "code"
        ...
    CodeTask.of(TranslationTask)         # tasks/registry.py: translation with those changes on top

Inside a refinement, `super()` reaches the refined task (`owns_data`: the base's check and its own).
"""

from __future__ import annotations

from multibranch.train.task import Task


class Refinement(Task):
    """What a task changes in the task it refines; `of(base)` is the task itself."""

    @classmethod
    def of(cls, base: type[Task]) -> type[Task]:
        """The task: a class of this refinement over `base` (its methods first), named like the refinement."""
        return type(cls.__name__, (cls, base), {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
                                                "__doc__": cls.__doc__})
