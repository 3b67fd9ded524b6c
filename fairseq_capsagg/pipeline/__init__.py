"""The experiments: the main job and Table 1's drivers, their stages and reports
(``capsagg-main-job``, ``capsagg-table1``); they need the ``experiments`` extra."""

from ..tools.extras import require_extra

require_extra("capsagg-main-job and capsagg-table1 (fairseq_capsagg.pipeline)")
