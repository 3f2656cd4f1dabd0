"""After the run: compare the tuned kernels with the alternatives, build the
dispatch table, export an importable package (with the launch runtime it
carries), and write the report."""
