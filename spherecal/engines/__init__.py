"""Simulation engines beyond one OS process per participant.

``spherecal simulate --engine processes`` (the default, ``spherecal.simulate``)
starts every participant as its own process. ``--engine ray``
(:mod:`spherecal.engines.ray`) hosts many *virtual participants*
(:mod:`spherecal.engines.virtual`) per Ray actor, on one machine or a Ray cluster.
"""
