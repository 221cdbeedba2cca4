"""Version of the ElasticDL client and framework (one place; ``elasticdl version`` prints it)."""

__version__ = "0.3.0"
