"""Op specs: one declarative description per op, from which tests/test_conformance.py
generates the tests of every path and ``python -m customops.doctor`` builds its report.

- :mod:`customops.testing.spec`: :class:`OpSpec`, :class:`SampleInput`, :data:`PATHS`,
  :func:`make_tensor`;
- :mod:`customops.testing.op_specs`: ``OP_SPECS``, one entry per op (add yours there);
- :mod:`customops.testing.paths`: how each path is checked.
"""

from .op_specs import OP_SPECS
from .spec import DEFAULT_TOL, FLOATING_DTYPES, PATHS, OpSpec, SampleInput, make_tensor

__all__ = ["DEFAULT_TOL", "FLOATING_DTYPES", "OP_SPECS", "OpSpec", "PATHS", "SampleInput", "make_tensor"]
