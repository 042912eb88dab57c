"""`TrainingArguments` and what its fields name, checked at construction on the driver.

- `training_args`: the dataclass: declarations with their help texts, derived values, `to_dict`/`__repr__`;
- `normalise`: every accepted spelling brought to one form, before the checks;
- `checks`: the checks by topic, and `TOPICS`, which says which topic owns which field;
- `choices`: the values each choice field accepts;
- `json_text`: the one parser of JSON-object text (dict fields, `fsdp_config`, the argument parser);
- `scaling`: `num_workers`, a count or an elastic (min, max) range;
- `fsdp_config`: transformers' `fsdp` / `fsdp_config`, reduced to FSDP2's options;
- `report_to`: the reporter names, built in and registered (`register_reporter`);
- `process_view`: transformers' process properties (`process_index`, `device`, ...) answered on the driver;
- `transformers_fields`: every transformers field, classified (same / different / refused) with its note;
- `docs_table`: docs/arguments.md's table, generated from both classes;
- `parser`: `ArgumentParser`, HfArgumentParser's shape (command line, dict, YAML/JSON files).
- `seq2seq_args`: `Seq2SeqTrainingArguments`, transformers' generation fields on top (`Seq2SeqTrainer`'s).
"""
