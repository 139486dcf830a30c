"""sluice: a progress-aware deep-learning training platform.

The public face is small: the CLI (`sluice ...`), the REST API, the job spec
(`sluice.spec`) and the in-job SDK (`sluice.sdk`). Everything else is internal.
"""

__version__ = "0.1.0"
