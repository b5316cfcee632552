"""A compiled loop over Blosc chunk decodes (numba).

Runs the per-chunk ``blosc_decompress_ctx`` calls without the GIL. Through ctypes each call costs
~0.5 us of GIL-held interpreter work, more than LZ4 on 84x84 gray Atari frames: zarr batches ran
at 0.35x of memmap on 2 CPUs, 0.78x with this loop.

The decoder's address is an argument, so the compiled function can be cached on disk
(``cache=True``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic


@intrinsic
def _decompress(typingctx: Any, fn: Any, src: Any, dest: Any, nbytes: Any) -> Any:
    """``blosc_decompress_ctx(src, dest, nbytes, 1)`` through the function at address ``fn``
    (all arguments integers); returns its result."""
    sig = types.int32(types.int64, types.int64, types.int64, types.int64)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        fn_addr, src_addr, dest_addr, size = args
        byte_ptr = ir.IntType(8).as_pointer()
        # int blosc_decompress_ctx(const void *src, void *dest, size_t destsize, int numinternalthreads)
        fnty = ir.FunctionType(ir.IntType(32), [byte_ptr, byte_ptr, ir.IntType(64), ir.IntType(32)])
        target = builder.inttoptr(fn_addr, fnty.as_pointer())
        return builder.call(
            target,
            [
                builder.inttoptr(src_addr, byte_ptr),
                builder.inttoptr(dest_addr, byte_ptr),
                size,
                ir.Constant(ir.IntType(32), 1),
            ],
        )

    return sig, codegen


@njit(cache=True, nogil=True, boundscheck=False)
def decode_range(fn: int, sources: np.ndarray, dests: np.ndarray, nbytes: int, a: int, b: int) -> int:
    """Decode chunk ``k`` from address ``sources[k]`` to ``dests[k]`` (``nbytes`` each) for
    ``k`` in ``[a, b)``; returns the first ``k`` that does not decode to ``nbytes``, else -1."""
    for k in range(a, b):
        if _decompress(fn, sources[k], dests[k], nbytes) != nbytes:  # type: ignore[call-arg]
            return k
    return -1
