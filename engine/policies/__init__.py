"""Built-in policies; importing this package registers them."""
from . import fcfs  # noqa: F401
from . import arena  # noqa: F401
from . import gavel  # noqa: F401
from . import sia  # noqa: F401
from . import elasticflow  # noqa: F401
