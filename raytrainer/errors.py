"""Errors raised on the driver before any worker starts.

Each message names what is wrong and how to fix it: the user reads it once, in the driver's terminal,
instead of a traceback from deep inside a Ray actor.
"""


class ConfigError(ValueError):
    """An argument, dataset, model or cluster setting that cannot work. Raised before any actor starts."""


class StorageError(ConfigError):
    """`output_dir` (or a checkpoint URL) cannot be reached, read or written."""


def missing_package(package: str, extra: str, what: str) -> ConfigError:
    """`what` needs an optional package: the error names the pip extra that installs it."""
    return ConfigError(f"{what} needs the {package!r} package, which is not installed: "
                       f'pip install "raytrainer[{extra}]".')
