"""kopf handlers; importing this package registers them all."""
from . import setup  # noqa: F401
from . import single_pod, train_job  # noqa: F401
