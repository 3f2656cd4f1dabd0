"""Torch references of the ops pipe ships (imported lazily: torch is heavy).

A reference takes the op's inputs and scalars as keyword arguments and
returns its outputs (one tensor, or a tuple in the spec's output order). The
judge calls it on float64 copies of the inputs for the verdict (those its
`widens` attribute names in their own dtype, for it to widen), and on the
op's own dtype for the baseline timing.
"""
