"""Camera frames kept compressed: image codecs, ``--frames`` modes, decoding on a CUDA device.

Nothing here knows the cache: a frame column's stored form is :mod:`rlds_cli.cache.backends.frames`."""
