#!/usr/bin/env python
"""Launcher of the Table 1 driver from a checkout: ``capsagg-table1`` (``fairseq_capsagg.pipeline.drivers.table1``)."""
import sys

from fairseq_capsagg.pipeline.drivers.table1 import main

sys.exit(main())
