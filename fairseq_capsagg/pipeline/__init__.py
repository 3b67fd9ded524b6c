"""The main job: train and compare layer aggregators on a real corpus
(``python -m fairseq_capsagg.pipeline.main_job``)."""
