#!/usr/bin/env python
"""The main job from a checkout: ``python examples/main_job.py [FLAGS]``.

The job itself is :mod:`fairseq_capsagg.pipeline.drivers.main_job` (also ``capsagg-main-job`` or
``python -m fairseq_capsagg.pipeline.drivers.main_job`` once the package is installed).
"""

import sys

from fairseq_capsagg.pipeline.drivers.main_job import main

if __name__ == "__main__":
    sys.exit(main())
