"""Build: render a template for every shape, check the forbidden actions on the
source, compile it with the backend, check the compiled code, and key the
binaries. No verdicts on behaviour: those are the judge's."""
