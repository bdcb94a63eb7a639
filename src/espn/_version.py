"""espn's version, declared once: ``espn.__version__``, ``espn --version``, the
distribution's metadata (``pyproject.toml`` reads it) and the manifests a run writes."""

__version__ = "0.1.0"
