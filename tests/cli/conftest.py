"""The checkpoint fixtures (`store`, `make_checkpoint`) for the `raytrainer checkpoints` command's tests."""

from tests.checkpoint.conftest import make_checkpoint  # noqa: F401  (fixture)
from tests.storage.stores import store  # noqa: F401  (fixture)
