"""fairseq_capsagg.patches.resumable_batches: the training split's iterator, created in any epoch (a resumed
training), holds the batches of epoch 1 (the training that never stopped), at the epoch asked for; an
iterator fairseq already made is returned as it is."""

from fairseq import options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.tasks.translation import TranslationTask

from fairseq_capsagg import patches

patches.install()  # as --user-dir does


def training_iterator(data_bin, epoch, get_batch_iterator=TranslationTask.get_batch_iterator):
    """A new task's iterator of the training split, created in ``epoch``, and its batches."""
    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(data_bin), "--task", "translation", "--source-lang", "en", "--target-lang", "de", "--arch", "transformer"])
    task = TranslationTask.setup_task(convert_namespace_to_omegaconf(args).task)
    task.load_dataset("train")
    itr = get_batch_iterator(task, task.dataset("train"), max_tokens=300, seed=1, epoch=epoch)
    return task, itr, [tuple(batch) for batch in itr.frozen_batches]


def test_an_iterator_created_in_a_later_epoch_holds_epoch_ones_batches(tiny_data_bin):
    _, first, batches = training_iterator(tiny_data_bin, 1)
    _, resumed, resumed_batches = training_iterator(tiny_data_bin, 3)
    assert resumed.epoch == 3 and first.epoch == 1
    assert resumed_batches == batches
    # fairseq's own draw for epoch 3: the same sizes, other sentences together
    unpatched = getattr(TranslationTask.get_batch_iterator, "__wrapped__", None)
    assert unpatched is not None
    _, _, drawn_again = training_iterator(tiny_data_bin, 3, unpatched)
    assert sorted(map(len, drawn_again)) == sorted(map(len, batches)) and drawn_again != batches


def test_an_iterator_fairseq_reuses_is_returned_as_it_is(tiny_data_bin):
    task, first, _ = training_iterator(tiny_data_bin, 1)
    again = task.get_batch_iterator(task.dataset("train"), max_tokens=300, seed=1, epoch=2)
    assert again is first and again.epoch == 1  # train.py asks with the next epoch; next_epoch_itr moves it
