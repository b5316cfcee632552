"""The ``rlds`` command line: thin commands that call the library and render its results."""
