"""spherecal: the composition root — CLI, configuration, simulation harness."""

__version__ = "0.1.0"
