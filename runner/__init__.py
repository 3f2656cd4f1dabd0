"""pipe: autoresearch for GPU kernels, driven by a checked-in YAML spec.

The runner is the only judge: it renders a candidate, checks the forbidden
actions, compiles, verifies against the reference, times, decides and records.
"""

__version__ = "0.1.0"
