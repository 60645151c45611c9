"""rmkit: train, validate, export and serve reward models; exact alignment losses."""

__version__ = "0.1.0"
