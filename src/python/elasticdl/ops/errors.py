"""Exceptions raised by :mod:`elasticdl.ops`.

Every bad input becomes one of these (never a crash in native code): they subclass
the builtin ValueError/TypeError so callers may catch either the precise or the
generic class.
"""


class OpsError(ValueError):
    """A value passed to an ``elasticdl.ops`` kernel is invalid (shape, layout, flag)."""


class OpsTypeError(TypeError):
    """An array passed to an ``elasticdl.ops`` kernel has an unsupported dtype or type."""


class IdOutOfRangeError(OpsError, IndexError):
    """An embedding id does not address a row of the table."""

    def __init__(self, position: int, value: int, num_rows: int):
        self.position = int(position)
        self.value = int(value)
        self.num_rows = int(num_rows)
        super().__init__(
            f"ids[{self.position}] = {self.value} is out of range for a table of "
            f"{self.num_rows} rows (valid ids are 0..{self.num_rows - 1})"
        )
