"""The experiment drivers (``capsagg-main-job``, ``capsagg-table1``) and the rows of their protocols."""
