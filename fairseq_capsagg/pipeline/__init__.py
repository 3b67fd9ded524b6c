"""The main job: train and compare layer aggregators on a real corpus
(``python -m fairseq_capsagg.pipeline.drivers.main_job``)."""
