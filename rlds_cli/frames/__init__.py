"""Camera frames kept compressed: the image codecs (:mod:`~rlds_cli.frames.codecs`), the
``--frames`` modes and which arrays are frames (:mod:`~rlds_cli.frames.modes`), frames that
arrive encoded (:mod:`~rlds_cli.frames.modes`) and the threads that encode and decode them
(:mod:`~rlds_cli.frames.codecs`). Nothing here knows the cache: the stored form of a frame
column is :mod:`rlds_cli.cache.backends.frames`."""
