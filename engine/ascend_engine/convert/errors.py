"""The one error type the convert command reports as a clean message (file, field or tensor named) and exit 1."""


class ConvertError(ValueError):
    """Input that cannot be converted; raised before anything is written."""
