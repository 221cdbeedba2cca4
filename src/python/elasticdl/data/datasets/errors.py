"""Errors of ``elasticdl dataset prepare``; the CLI prints their one-line message (exit 2)."""


class DatasetError(ValueError):
    """Unknown dataset, bad source, or output directory that cannot be used."""


class SourceUnavailableError(DatasetError):
    """The raw data is neither given, installed, cached nor downloadable."""
