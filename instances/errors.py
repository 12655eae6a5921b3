"""Input errors that name the file, line and field at fault."""
from __future__ import annotations


class InputError(ValueError):
    """Bad input: names where (file, line) and what (field) is wrong."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 field: str | None = None):
        self.file, self.line, self.field, self.reason = file, line, field, message
        where = []
        if file is not None:
            where.append(str(file))
        if line is not None:
            where.append(f"line {line}")
        if field is not None:
            where.append(f"field '{field}'")
        super().__init__(f"{': '.join([', '.join(where)] if where else [])}{': ' if where else ''}{message}")


class UnknownGpuType(InputError):
    pass


class UnknownModel(InputError):
    pass
