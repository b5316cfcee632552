"""The ``zarr`` storage backend, one module per concept.

:mod:`~rlds_cli.cache.backends.zarr.write`: the backend, the on-disk layout and its writer;
:mod:`~rlds_cli.cache.backends.zarr.read`: columns, the chunk reader and where its bytes come
from; :mod:`~rlds_cli.cache.backends.zarr.codec`: Blosc through ctypes and the decoding threads;
:mod:`~rlds_cli.cache.backends.zarr.compiled`: the compiled decode loop (numba),
imported only when a read uses it.
"""
