"""The built-in cell families, listed in one place: importing this module runs their
``@register_cell`` decorators (``lstmablate/cells/__init__.py`` does, and the
``lstmablate.cells`` entry point names it)."""

from . import dyck  # noqa: F401  dyck-rnn
from . import gru  # noqa: F401  gru
from . import knn  # noqa: F401  knn-rnn
from . import lstm  # noqa: F401  lstm and its ablations
from . import minrnn  # noqa: F401  mingru, minlstm
from . import multiplicative  # noqa: F401  mrnn, mlstm, mmrnn, mmlstm
from . import qrnn  # noqa: F401  qrnn
from . import ran  # noqa: F401  ran
from . import sru  # noqa: F401  sru, sru-2017
