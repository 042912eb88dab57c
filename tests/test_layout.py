"""The tests mirror the package (docs/design.md, Testing): every package of raytrainer/ has a tests/ folder at the
same path, and most modules of 60 lines or more have a test file named after them, as Ray Train keeps its tests
(raytrainer/coordinator/pump.py -> tests/coordinator/test_pump.py; a top-level raytrainer/trainer.py ->
tests/test_trainer.py; a package's __init__.py -> test_<package>.py in that package's tests/ folder). Where the
rest are tested is said in tests/README.md. `python tests/test_layout.py` lists the modules without one."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "raytrainer"
TESTS = ROOT / "tests"
MIN_LINES = 60  # smaller modules are tested through the component that uses them
MIN_SHARE = 0.80


def packages(package: Path = PACKAGE) -> list[Path]:
    """Every folder of the package with an __init__.py, relative to the package (the root itself is '.')."""
    return sorted(init.parent.relative_to(package) for init in package.rglob("__init__.py"))


def named_test(module: Path, package: Path = PACKAGE, tests: Path = TESTS) -> Path:
    """The test file named after a module: same folders under tests/, test_<module>.py."""
    rel = module.relative_to(package)
    if rel.name == "__init__.py":
        name = rel.parent.name or package.name
        return tests / rel.parent / f"test_{name}.py"
    return tests / rel.parent / f"test_{rel.stem}.py"


def sized_modules(package: Path = PACKAGE, min_lines: int = MIN_LINES) -> list[Path]:
    return sorted(path for path in package.rglob("*.py")
                  if len(path.read_text(encoding="utf-8").splitlines()) >= min_lines)


def untested(package: Path = PACKAGE, tests: Path = TESTS, min_lines: int = MIN_LINES) -> list[Path]:
    """The modules of min_lines or more without a test file named after them."""
    return [path for path in sized_modules(package, min_lines)
            if not named_test(path, package, tests).is_file()]


def share(package: Path = PACKAGE, tests: Path = TESTS, min_lines: int = MIN_LINES) -> float:
    modules = sized_modules(package, min_lines)
    return 1 - len(untested(package, tests, min_lines)) / len(modules)


def test_every_package_has_a_tests_folder():
    missing = [str(pkg) for pkg in packages() if not (TESTS / pkg).is_dir()]
    assert not missing, f"packages of raytrainer/ without a folder of the same path under tests/: {missing}"


def test_most_sized_modules_have_a_test_file_named_after_them():
    modules = sized_modules()
    left = untested()
    measured = 1 - len(left) / len(modules)
    listed = "\n  ".join(str(path.relative_to(ROOT)) for path in left)
    assert measured >= MIN_SHARE, (f"{len(modules) - len(left)} of {len(modules)} modules of {MIN_LINES} lines or "
                                   f"more have a test file named after them ({measured:.0%} < {MIN_SHARE:.0%});"
                                   f" without one:\n  {listed}")


def test_the_rule_counts_what_it_says(tmp_path):
    """The measure itself, on a made-up tree: it can fail."""
    package, tests = tmp_path / "pkg", tmp_path / "tests"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("\n" * 70)
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "big.py").write_text("x = 1\n" * 60)
    (package / "sub" / "other.py").write_text("x = 1\n" * 60)
    (package / "small.py").write_text("x = 1\n" * 59)
    (tests / "sub").mkdir(parents=True)
    (tests / "sub" / "test_big.py").write_text("")
    (tests / "test_other.py").write_text("")  # the wrong folder does not count
    assert packages(package) == [Path("."), Path("sub")]
    assert [p.name for p in sized_modules(package)] == ["__init__.py", "big.py", "other.py"]
    assert untested(package, tests) == [package / "__init__.py", package / "sub" / "other.py"]
    assert share(package, tests) == pytest.approx(1 / 3)
    (tests / "test_pkg.py").write_text("")
    assert untested(package, tests) == [package / "sub" / "other.py"]


if __name__ == "__main__":
    left = untested()
    print(f"{share():.1%} of {len(sized_modules())} modules of {MIN_LINES} lines or more have a test named after "
          f"them; {len(left)} without:")
    for path in left:
        print(f"  {path.relative_to(ROOT)}  ({len(path.read_text(encoding='utf-8').splitlines())} lines)")
    sys.exit(0)
