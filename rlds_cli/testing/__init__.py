"""The contract suites of rlds's plug points, shipped with the package (as zarr ships
``StoreTests``) so that a reader, backend, exporter, sampler or executor of another package can be
checked against the same promises as rlds's own.

One module per plug point, each a base class to subclass in a ``test_*.py`` file:

* :mod:`rlds_cli.testing.reader`: ``ReaderContract`` (a source format reader, built in or added
  through the ``rlds_cli.readers`` entry-point group);
* :mod:`rlds_cli.testing.backend`: ``BackendContract`` (a storage backend);
* :mod:`rlds_cli.testing.exporter`: ``ExporterContract`` (an ``rlds export`` format);
* :mod:`rlds_cli.testing.sampler`: ``SamplerContract``, ``EpochalContract``, ``PrioritizedContract``;
* :mod:`rlds_cli.testing.executor`: ``ExecutorContract`` (a ``rlds preprocess`` executor).

Beside them, :mod:`rlds_cli.testing.slow_link`: ``Link``, a slow link to a local object store
(per-request latency, a bandwidth cap) for tests and benchmarks of remote reads, and
:mod:`rlds_cli.testing.headless_chromium`: ``Chromium``, a headless Chromium driven over the
DevTools protocol on a pipe, for tests and benchmarks of ``rlds show`` pages.

The contract modules import pytest (``slow_link`` and ``headless_chromium`` do not), and nothing
else in rlds imports any of these (``tests/meta/test_layering.py`` holds that): ``rlds --help``
and the read path never load pytest. This ``__init__`` imports nothing.
"""
