"""The library's shape: every part a home, no import circle, modules that fit in a reader's head, and
TensorFlow imported in one module of tfperf.measure only (the rest of it reads samples with NumPy)."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "tfperf"
MAX_LINES = 500


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def lazy_targets(tree: ast.Module) -> set[str]:
    """The modules a package's lazy `_LAZY = {name: module}` table loads on first use."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_LAZY" for t in node.targets):
            return set(ast.literal_eval(node.value).values())
    return set()


def imports(name: str) -> set[str]:
    """The tfperf modules `name` imports, at module level or inside functions, and those it loads lazily."""
    tree = ast.parse(MODULES[name].read_text())
    found = set(lazy_targets(tree))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "tfperf"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tfperf":
            for alias in node.names:  # `from tfperf.measure import rounds` imports a module, not a name
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
    return {m for m in found if m in MODULES and m != name}


def test_no_import_circle():
    graph = {name: imports(name) for name in MODULES}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                pytest.fail("import circle: " + " -> ".join(path[path.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_modules_fit_in_a_readers_head():
    long = {name: n for name, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_tensorflow_is_imported_by_one_module_of_measure():
    def imports_tf(path):
        return any(isinstance(n, (ast.Import, ast.ImportFrom)) and any(
            (getattr(n, "module", None) or a.name).split(".")[0] in ("tensorflow", "keras") for a in n.names)
            for n in ast.walk(ast.parse(path.read_text())))

    assert [n for n, p in MODULES.items() if n.startswith("tfperf.measure") and imports_tf(p)] == [
        "tfperf.measure.timer"]


def test_reading_records_and_the_command_line_do_not_start_tensorflow():
    code = ("import sys, tfperf.cli, tfperf.records.compare, tfperf.records.report, tfperf.measure.rounds, "
            "tfperf.measure.processes, tfperf.deploy, tfperf.doctor; print('tensorflow' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"



def test_the_gpu_benchmarks_import_without_tensorflow():
    """A lent GPU cannot hold TensorFlow's CUDA build: what benchmarks/*_on_gpu.py run there under Keras 3 on JAX
    (the doctor's search and trainer, tfperf's timing and kernel grouping) must import with TensorFlow absent."""
    benchmarks = PACKAGE.parent / "benchmarks"
    names = sorted(p.stem for p in benchmarks.glob("*_on_gpu.py"))
    assert "best_configuration_on_gpu" in names
    code = (f"import sys; sys.modules['tensorflow'] = None; sys.path[:0] = [{str(benchmarks)!r}]\n"
            + "".join(f"import {name}\n" for name in names)
            + "import tfperf.train\n")  # the doctor's trainer imports it when it first trains
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "KERAS_BACKEND": "jax"})
    assert done.returncode == 0, done.stderr[-2000:]

def test_every_name_the_faces_offer_resolves():
    import importlib

    for package in ("tfperf", "tfperf.measure"):
        module = importlib.import_module(package)
        for name in module._LAZY:
            assert getattr(module, name) is not None, (package, name)


def test_every_recipe_gives_the_report_its_headline():
    from tfperf.recipe import declarations

    for declared in declarations(PACKAGE.parent / "recipes"):
        assert "Headline" in declared.path.read_text().split("def conclude", 1)[-1], declared.name


def test_each_doctor_experiment_lives_in_one_place():
    """Issue 70: an experiment is its own module and a line in the registry; no other module of tfperf.doctor imports
    it, no function there runs past 80 lines, and a diagnosis holds its sections, not a field per experiment."""
    import dataclasses

    from tfperf.doctor.advice import Diagnosis
    from tfperf.doctor.registry import EXPERIMENTS

    homes = {e.run.__module__ for e in EXPERIMENTS}
    assert len(homes) == len(EXPERIMENTS) and len({e.name for e in EXPERIMENTS}) == len(EXPERIMENTS)
    doctor = {name for name in MODULES if name.startswith("tfperf.doctor.")}
    for home in homes:
        assert [n for n in doctor if home in imports(n)] == ["tfperf.doctor.registry"], home
    long = [(name, f.name) for name in doctor for f in ast.walk(ast.parse(MODULES[name].read_text()))
            if isinstance(f, ast.FunctionDef) and f.end_lineno - f.lineno >= 80]
    assert not long, f"functions over 80 lines: {long}"
    assert len(dataclasses.fields(Diagnosis)) <= 12
    assert all(e.question.endswith("?") for e in EXPERIMENTS)
