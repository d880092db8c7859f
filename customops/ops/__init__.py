"""The ops' Python side: one module per op (``customops/ops/<op>.py``) with the public wrapper
and the fake kernel; the autograd formulas are C++ kernels (csrc/ops/<op>/<op>_autograd.cpp).

Importing this package loads the op library first, then every op module, whose ``__all__``
names are re-exported here and from ``customops``. csrc/registration.cpp names each module
(set_python_module) so torch imports it whenever it needs an op's fake kernel.
"""

import importlib
import pkgutil

from .._library import load_library

load_library()

__all__ = []
for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if not _info.name.startswith("_"):
        _module = importlib.import_module(f"{__name__}.{_info.name}")
        for _name in _module.__all__:
            globals()[_name] = getattr(_module, _name)
        __all__ += _module.__all__
__all__ = sorted(__all__)
del _info, _module, _name
