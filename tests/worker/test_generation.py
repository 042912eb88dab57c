"""Generation in evaluation and prediction (raytrainer/worker/generation.py): the generate() keyword arguments, the
ones passed winning over Seq2SeqTrainingArguments' generation fields, as transformers resolves them."""

from raytrainer import Seq2SeqTrainingArguments
from raytrainer.worker.generation import resolve_gen_kwargs


def test_generate_kwargs_passed_win_over_the_arguments():
    args = Seq2SeqTrainingArguments(generation_max_length=9, generation_num_beams=2, num_workers=0)
    assert resolve_gen_kwargs(args, {}) == {"max_length": 9, "num_beams": 2}
    assert resolve_gen_kwargs(args, {"max_length": 4, "num_beams": 1}) == {"max_length": 4, "num_beams": 1}
    # max_new_tokens given: generation_max_length is not added beside it (transformers' rule)
    assert resolve_gen_kwargs(args, {"max_new_tokens": 3}) == {"max_new_tokens": 3, "num_beams": 2}
