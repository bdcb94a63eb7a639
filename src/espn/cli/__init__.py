"""The ``espn`` command line."""
