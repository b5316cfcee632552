"""Published datasets on object storage: :func:`rlds_cli.remote.push.push` copies a cached
dataset to any fsspec URL (``s3://bucket/prefix/NAME``, ``gcs://...``, ``file:///...``) and
:func:`rlds_cli.remote.pull.pull` brings it back into a cache.

The remote layout is the dataset's directory, file for file, plus ``rlds-files.json`` (every
file's size and sha256, and the sha256 of the manifest they belong to). ``manifest.json`` is
uploaded last and is the commit marker: a URL without it is not a dataset (or a push is still
under way). Both need the ``remote`` extra (fsspec, and s3fs for ``s3://``); nothing imports
fsspec until a transfer starts.
"""
