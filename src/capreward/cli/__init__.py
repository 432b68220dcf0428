"""The ``capreward`` command line."""
