"""What minitx tells torch.compile, said without importing the compiler; and the one compiled
function the attention kinds share, flex attention, compiled at its first call.

`torch.compiler.assume_constant_result` imports torch._dynamo (and with it sympy, triton and a few
hundred modules: about 1.3 s, more than the rest of `import minitx`) only to set one attribute on
the function, which dynamo reads when it traces a call to it. minitx marks functions at import
time, in modules every model imports, so it sets that attribute itself; the compiler is then
loaded by whoever compiles. tests/model/test_compile.py checks that the attribute is still the
one torch's decorator sets, and that a compiled MTA model still traces through a marked function
whole (fullgraph).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)

# torch._dynamo.decorators.assume_constant_result sets this and nothing else; dynamo's
# UserFunctionVariable reads it to call the function once while tracing and keep its answer.
CONSTANT_RESULT = "_dynamo_marked_constant"


def constant_result(fn: F) -> F:
    """fn, marked so that torch.compile calls it once while tracing and takes its result for a
    constant of the graph (as torch.compiler.assume_constant_result does, without its import)."""
    setattr(fn, CONSTANT_RESULT, True)
    return fn


@functools.lru_cache(maxsize=1)
def compiled_flex_attention():
    """torch's flex attention, compiled once per process (block-sparse masks: a window, documents)."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)
