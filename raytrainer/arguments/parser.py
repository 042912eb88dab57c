"""`ArgumentParser`: dataclasses (`TrainingArguments` and the user's own) from the command line, a dict, or a
YAML/JSON file, in the shape of Hugging Face's `HfArgumentParser`.

`python train.py config.yaml --learning_rate 3e-4` loads the file first and lets the options override it.
Values argparse cannot convert are usage errors (argparse prints usage and exits 2, as `HfArgumentParser`
does); everything decided at dataclass level -- unknown keys, missing required fields, `__post_init__`
validation -- raises `ConfigError` unchanged.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Union

import yaml

from ..errors import ConfigError
from .json_text import parse_json_object

CONFIG_SUFFIXES = (".yaml", ".yml", ".json")


def string_to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text in ("yes", "true", "t", "y", "1"):
        return True
    if text in ("no", "false", "f", "n", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false, yes/no, 1/0), got {value!r}")


def int_or_float(value: Any) -> Union[int, float]:
    """HF types step counts `float` so that `0.1` can mean a ratio; an int literal must stay an int count."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    try:
        return int(value)
    except ValueError:
        return float(value)


def json_dict(value: Any) -> Optional[dict]:
    """A dict option's JSON text (json_text.py's parser; blank text is unset). A bad one is a usage error."""
    if isinstance(value, dict):
        return value
    try:
        return parse_json_object(value)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def str_or_bool(value: Any) -> Union[str, bool]:
    """A field typed `Union[str, bool]` (include_num_input_tokens_seen): true/false words are booleans."""
    try:
        return string_to_bool(value)
    except argparse.ArgumentTypeError:
        return str(value)


ONE_OR_MORE = "str or list[str]"  # the parse form of a `str | list[str]` field (see _unwrap)


class OneOrMore(argparse.Action):
    """`--report_to tensorboard` gives the str, `--report_to tensorboard mlflow` the list. (transformers' parser
    takes one str there, and a str can mean something else than a list of one: optim_target_modules' regex.)"""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values[0] if len(values) == 1 else list(values))


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) is Union or isinstance(tp, types.UnionType)


def _unwrap(name: str, tp: Any) -> Any:
    """The one type a union field is parsed as. Unions holding dict parse JSON; the others follow
    transformers' HfArgumentParser, so both parsers read a field the same way: `Optional[X]` -> X (the
    member after str when None is not second), `Union[X, Y, ..., str]` -> X if Y is str, else Y."""
    if not _is_union(tp):
        return tp
    args = typing.get_args(tp)
    others = [a for a in args if a is not type(None)]
    if len(others) == 1:
        return others[0]
    if any(typing.get_origin(a) is dict or a is dict for a in others):
        return dict
    if set(others) == {str, bool}:
        return Union[str, bool]
    if str in others and any(typing.get_origin(a) is list for a in others):
        return ONE_OR_MORE  # report_to, optim_target_modules, debug: one name, or several
    if str not in args and len(others) > 1:
        raise TypeError(f"field {name!r}: the parser supports Optional[X] and unions with str or dict, not {tp}")
    if type(None) not in args:
        return args[0] if args[1] is str else args[1]
    return args[0] if args[1] is type(None) else args[1]


def _field_options(field: dataclasses.Field, tp: Any) -> tuple[dict, Optional[dict]]:
    """argparse keyword arguments for one field, and those of its `--no_<field>` complement (or None)."""
    help_text = field.metadata.get("help", "")
    if field.default is not dataclasses.MISSING:  # argparse's own default display is off, see below
        help_text = f"{help_text} (default: {field.default})".strip()
    kwargs: dict[str, Any] = {"help": help_text.replace("%", "%%")}  # argparse %-formats help strings
    if "choices" in field.metadata:
        kwargs["choices"] = list(field.metadata["choices"])
    tp = _unwrap(field.name, tp)
    origin = typing.get_origin(tp) or tp
    complement = None
    if tp is bool:
        # `--flag` alone means True; `--flag false` is accepted too, as in HfArgumentParser.
        kwargs.update(type=string_to_bool, nargs="?", const=True)
        if field.default is True:
            complement = {"help": f"Set {field.name} to False.", "action": "store_false", "dest": field.name}
    elif tp == Union[str, bool]:
        kwargs.update(type=str_or_bool, nargs="?", const=True)
    elif tp is ONE_OR_MORE:
        kwargs.update(type=str, nargs="+", action=OneOrMore)
    elif origin is dict:
        kwargs["type"] = json_dict
    elif origin in (list, tuple):
        item_args = typing.get_args(tp)
        kwargs.update(type=item_args[0] if item_args and item_args[0] is not Ellipsis else str, nargs="+")
    elif origin is typing.Literal:
        kwargs.update(choices=typing.get_args(tp), type=type(typing.get_args(tp)[0]))
    elif isinstance(tp, type) and issubclass(tp, enum.Enum):
        kwargs.update(type=tp, choices=list(tp))
    elif tp is float and field.name.endswith("_steps"):
        kwargs["type"] = int_or_float
    elif tp in (int, float, str) or isinstance(tp, type):
        kwargs["type"] = tp  # a class converts its own text (e.g. num_workers: NumWorkers("1,4"))
    else:  # typing.Any (parallelism_config, which is refused unless None): the text reaches __post_init__
        kwargs["type"] = str
    for key in ("nargs", "const"):  # transformers' metadata, e.g. a bare --fsdp meaning True
        if key in field.metadata:
            kwargs[key] = field.metadata[key]
    # Defaults stay with the dataclass: a field absent from the namespace is simply not passed, so a config
    # file's values (put in the namespace first) survive and required fields are checked in one place.
    kwargs["default"] = argparse.SUPPRESS
    return kwargs, complement


def _has_default(field: dataclasses.Field) -> bool:
    return field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING


class ArgumentParser(argparse.ArgumentParser):
    """An `argparse.ArgumentParser` whose options are the fields of one or more dataclasses."""

    def __init__(self, dataclass_types: Union[type, Iterable[type]], **kwargs):
        kwargs.setdefault("formatter_class", argparse.ArgumentDefaultsHelpFormatter)
        super().__init__(**kwargs)
        if dataclasses.is_dataclass(dataclass_types):
            dataclass_types = [dataclass_types]
        self.dataclass_types = list(dataclass_types)
        self._converters: dict[str, Callable[[Any], Any]] = {}
        for dtype in self.dataclass_types:
            self._add_dataclass_arguments(dtype)

    def _add_dataclass_arguments(self, dtype: type) -> None:
        try:
            hints = typing.get_type_hints(dtype)
        except NameError as e:
            raise TypeError(f"cannot resolve the type hints of {dtype.__name__} ({e}); declare it at module "
                            "level") from e
        group = self.add_argument_group(getattr(dtype, "_argument_group_name", dtype.__name__))
        for field in dataclasses.fields(dtype):
            if not field.init:
                continue
            kwargs, complement = _field_options(field, hints[field.name])
            names = [f"--{field.name}"] + ([f"--{field.name.replace('_', '-')}"] if "_" in field.name else [])
            group.add_argument(*names, **kwargs)
            if complement is not None:
                # Added after the field itself: both write the same dest and argparse keeps the last given.
                group.add_argument(f"--no_{field.name}", f"--no-{field.name.replace('_', '-')}",
                                   default=argparse.SUPPRESS, **complement)
            self._converters[field.name] = kwargs["type"]

    # ------------------------------------------------------------------ building the dataclasses
    def _coerce(self, values: dict) -> dict:
        """Apply the CLI conversions to strings from a file or dict.

        YAML reads `3e-4` (no dot) as a string and users write `"true"` or a JSON string for a dict; converting
        here gives the same value the CLI would.
        """
        out = {}
        for key, value in values.items():
            convert = self._converters.get(key)
            if isinstance(value, str) and convert is not None and convert is not str:
                try:
                    value = convert(value)
                except (ValueError, TypeError, argparse.ArgumentTypeError) as e:
                    raise ConfigError(f"{key}={value!r}: {e}") from None
            out[key] = value
        return out

    def _build(self, values: dict) -> tuple[list, set]:
        """One instance per dataclass from `values`; returns them and the keys no dataclass used."""
        unused = set(values)
        outputs = []
        for dtype in self.dataclass_types:
            fields = [f for f in dataclasses.fields(dtype) if f.init]
            missing = [f.name for f in fields if f.name not in values and not _has_default(f)]
            if missing:
                raise ConfigError(f"{dtype.__name__} needs {', '.join('--' + m for m in missing)}.")
            inputs = {f.name: values[f.name] for f in fields if f.name in values}
            unused -= inputs.keys()
            outputs.append(dtype(**inputs))  # __post_init__'s ConfigError propagates unchanged
        return outputs, unused

    @staticmethod
    def _reject_unknown(unused: Iterable[str], source: str) -> None:
        if unused:
            keys = sorted(unused)
            raise ConfigError(f"unknown key{'s' if len(keys) > 1 else ''} {', '.join(map(repr, keys))} in "
                              f"{source}: not a field of any of the argument dataclasses.")

    # ------------------------------------------------------------------ public API
    def parse_args_into_dataclasses(self, args: Optional[list] = None, return_remaining_strings: bool = False,
                                    look_for_args_file: bool = True, args_filename: Optional[str] = None,
                                    args_file_flag: Optional[str] = None):
        """Parse `args` (default `sys.argv[1:]`) into one instance per dataclass type, in order.

        As transformers' `HfArgumentParser`: the options of an args file (whitespace-separated, read first so
        the command line overrides them) come from `args_filename`, else, with `look_for_args_file`, from the
        script's name with the suffix `.args` when it exists, and from each file given by `args_file_flag`
        (e.g. "--args_file"; the last one given wins). Ours on top: a first argument ending in .yaml/.yml/.json
        is a config file whose values the options override. Options added to the parser by hand come back as
        an extra `argparse.Namespace`, and with `return_remaining_strings` the unparsed strings come last.
        """
        args = list(sys.argv[1:] if args is None else args)
        args = self._with_args_files(args, look_for_args_file, args_filename, args_file_flag)
        base: dict = {}
        if args and not args[0].startswith("-") and args[0].lower().endswith(CONFIG_SUFFIXES):
            base = self._coerce(self._read_config(args[0]))
            self._reject_unknown(set(base) - set(self._converters), args[0])
            args = args[1:]
        # argparse only fills defaults for names absent from the namespace, so the file's values act as defaults.
        namespace, remaining = self.parse_known_args(args, namespace=argparse.Namespace(**base))
        values = vars(namespace)
        outputs, unused = self._build(values)
        extra = {k: values[k] for k in unused}
        if extra:
            outputs.append(argparse.Namespace(**extra))
        if return_remaining_strings:
            return (*outputs, remaining)
        if remaining:
            raise ConfigError(f"unrecognised command-line arguments: {remaining}")
        return tuple(outputs)

    @staticmethod
    def _with_args_files(args: list, look_for_args_file: bool, args_filename: Optional[str],
                         args_file_flag: Optional[str]) -> list:
        """`args` preceded by the options of the args files (transformers' rules, see above)."""
        if not (args_file_flag or args_filename or (look_for_args_file and sys.argv)):
            return args
        files = []
        if args_filename:
            files.append(Path(args_filename))
        elif look_for_args_file and sys.argv and sys.argv[0]:
            files.append(Path(sys.argv[0]).with_suffix(".args"))
        if args_file_flag:
            flag_parser = argparse.ArgumentParser(add_help=False)
            flag_parser.add_argument(args_file_flag, type=str, action="append")
            flags, args = flag_parser.parse_known_args(args)
            files.extend(Path(p) for p in getattr(flags, args_file_flag.lstrip("-").replace("-", "_")) or [])
        file_args: list = []
        for path in files:
            if path.is_file():
                file_args += path.read_text(encoding="utf-8").split()
        return file_args + args

    def parse_dict(self, d: dict, allow_extra_keys: bool = False) -> tuple:
        outputs, unused = self._build(self._coerce(d))
        if not allow_extra_keys:
            self._reject_unknown(unused, "the arguments dict")
        return tuple(outputs)

    def parse_json_file(self, path: str, allow_extra_keys: bool = False) -> tuple:
        return self._parse_file(path, allow_extra_keys)

    def parse_yaml_file(self, path: str, allow_extra_keys: bool = False) -> tuple:
        return self._parse_file(path, allow_extra_keys)

    def _parse_file(self, path: str, allow_extra_keys: bool) -> tuple:
        values = self._read_config(path)
        outputs, unused = self._build(self._coerce(values))
        if not allow_extra_keys:
            self._reject_unknown(unused, str(path))
        return tuple(outputs)

    @staticmethod
    def _read_config(path: str) -> dict:
        with open(path, encoding="utf-8") as f:
            # JSON is a subset of YAML 1.2 but not of PyYAML's 1.1 in every corner: read each with its own parser.
            data = json.load(f) if str(path).lower().endswith(".json") else yaml.safe_load(f)
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a mapping of argument names to values, got {type(data).__name__}.")
        return data
