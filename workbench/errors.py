"""Errors users can act on. The CLI prints them as one line and exits with `exit_code`."""

from __future__ import annotations


class WorkbenchError(Exception):
    """A user-facing error: bad input, a missing model, a wrong setting. Never a bug of ours."""

    exit_code = 1


class DataError(WorkbenchError):
    """A data file is malformed; the message names the file, the 1-based line and the field."""

    exit_code = 3

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
                 code: str = "invalid"):
        self.path, self.line, self.code = path, line, code
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(f"{where}{message}")


class ConfigError(WorkbenchError):
    """An experiment config is invalid. Carries every problem found, not just the first."""

    exit_code = 2

    def __init__(self, problems: list[str], *, source: str | None = None):
        self.problems = problems
        head = f"{source}: " if source else ""
        if len(problems) == 1:
            super().__init__(f"{head}{problems[0]}")
        else:
            body = "; ".join(problems)
            super().__init__(f"{head}{len(problems)} problems: {body}")


class ModelNotFoundError(WorkbenchError):
    """A model spec did not resolve to anything on this machine."""


class BackendError(WorkbenchError):
    """A model backend failed in a way the user can fix (server down, no logprobs, bad key)."""


class TrainingInterrupted(WorkbenchError):
    """Training stopped on request (`should_stop`) after a completed optimizer step.

    `step` is the last completed step; `checkpoint` the complete checkpoint written for it, or
    None when the session has no checkpoint folder. The exit code is the one a shell reports
    for SIGTERM, which is what usually asks for the stop.
    """

    exit_code = 143

    def __init__(self, *, step: int, checkpoint=None):
        self.step, self.checkpoint = step, checkpoint
        where = f"; checkpoint {checkpoint}" if checkpoint is not None else \
            " (no checkpoint folder: nothing saved)"
        super().__init__(f"training stopped after step {step}{where}")

    def __reduce__(self):  # keyword-only arguments: default pickling would lose them
        from functools import partial

        return partial(type(self), step=self.step, checkpoint=self.checkpoint), ()
