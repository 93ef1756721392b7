"""kopf handlers; importing this package registers them all."""
from . import train_job  # noqa: F401
from . import setup  # noqa: F401
