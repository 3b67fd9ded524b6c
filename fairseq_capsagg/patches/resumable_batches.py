"""A training resumed from a checkpoint draws the batches the uninterrupted training draws.

fairseq builds a split's batches once, when it creates the split's epoch iterator, and reuses that iterator for
every later epoch, shuffling only the order of the batches. Which sentences of equal length share a batch is
drawn with ``seed + epoch``, the epoch the iterator is created in (``FairseqTask.get_batch_iterator``, fairseq
0.12.3). A training from update 0 creates it in epoch 1; one resumed in epoch e creates it in epoch e, so from
the resume on its batches hold other sentences (of the same lengths) and it trains another network: a long run
stopped and resumed (each segment of a converged row, each session's end) was not the run that never stopped.

This builds a reusable iterator's batches with epoch 1's draw in every epoch, the iterator itself at the epoch
asked for. Iterators fairseq rebuilds each epoch (sharded data, ``--rebuild-batches``) are left as they are.
"""

import functools

from fairseq.tasks import FairseqTask


def install_resumable_batches() -> None:
    """Wraps ``FairseqTask.get_batch_iterator`` (the trainer's way to the training split's iterator)."""
    original = FairseqTask.get_batch_iterator
    if getattr(original, "draws_epoch_one_batches", False):
        return

    @functools.wraps(original)
    def get_batch_iterator(self, dataset, *args, epoch=1, disable_iterator_cache=False,
                           update_epoch_batch_itr=False, **kwargs):
        reused = (not disable_iterator_cache and not update_epoch_batch_itr and self.can_reuse_epoch_itr(dataset)
                  and not getattr(self.cfg, "rebuild_batches", False))
        created = reused and dataset not in self.dataset_to_epoch_iter  # else fairseq returns the one it made
        built = original(self, dataset, *args, epoch=1 if created else epoch,
                         disable_iterator_cache=disable_iterator_cache, update_epoch_batch_itr=update_epoch_batch_itr,
                         **kwargs)
        if created:  # at the epoch asked for, with epoch 1's batches
            dataset.set_epoch(epoch)
            built.epoch = max(epoch, 1)
        return built

    get_batch_iterator.draws_epoch_one_batches = True
    FairseqTask.get_batch_iterator = get_batch_iterator
