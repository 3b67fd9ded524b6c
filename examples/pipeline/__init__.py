"""The main job: train and compare layer aggregators on a real corpus (see ../main_job.py)."""
