"""The package version (read by hatchling and written into every manifest)."""

__version__ = "0.1.0"
