"""Import every built-in cell family so its ``@register_cell`` decorators run."""

from . import dyck  # noqa: F401
from . import gru  # noqa: F401
from . import lstm  # noqa: F401
from . import multiplicative  # noqa: F401
