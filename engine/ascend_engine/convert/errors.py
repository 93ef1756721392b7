"""The one error type the convert command reports as a clean message (file, field or tensor named) and exit 1."""


class ConvertError(ValueError):
    """Input that cannot be converted; raised before anything is written."""


def reason(e: BaseException) -> str:
    """Why an operation failed, without the file name: our messages already start with the file, and an
    OSError's text repeats it ("[Errno 13] Permission denied: '/x/config.json'")."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e)
