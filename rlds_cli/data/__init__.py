"""Data files shipped inside the package: the demo dataset that `make demo` converts offline."""
