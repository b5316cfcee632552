"""Contract test suites of rlds's plug points, and helpers for tests and benchmarks.

Shipped with the package (as zarr ships ``StoreTests``) so other packages' plug-ins are checked
against the same promises as rlds's own.

:mod:`rlds_cli.testing.contracts` holds one base class per plug point, to subclass in a
``test_*.py`` file: ``ReaderContract`` (a source format reader, built in or added through the
``rlds_cli.readers`` entry-point group), ``BackendContract`` (a storage backend),
``ExporterContract`` (an ``rlds export`` format), ``SamplerContract``, ``EpochalContract``,
``PrioritizedContract`` and ``ExecutorContract`` (a ``rlds preprocess`` executor).
:mod:`rlds_cli.testing.sources` has the small sources they start from.

Also :mod:`rlds_cli.testing.slow_link` (``Link``: per-request latency and a bandwidth cap in front
of a local object store) and :mod:`rlds_cli.testing.headless_chromium` (``Chromium``: headless
Chromium over the DevTools pipe, for ``rlds show`` pages), for tests and benchmarks.

The contracts import pytest (``slow_link`` and ``headless_chromium`` do not); nothing else
in rlds imports this package (``tests/meta/test_layering.py``), so ``rlds --help`` and the read
path never load pytest. This ``__init__`` imports nothing.
"""
