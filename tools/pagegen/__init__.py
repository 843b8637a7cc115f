"""The parts of ``tools/pages.py``, the results pages' generator (its docstring says what a page's
markers may run): :mod:`.markers` (a marked block's syntax, what a marker may ask of
``lstmablate report``, the error every part raises), :mod:`.tables` (the CLI run in this
process, the runs a table reads, the machine line, ``pages runs`` and ``pages records``),
:mod:`.grid` (``pages grid``, a grid's choice) and :mod:`.headline` (``pages headline``, the
README's table).
"""
