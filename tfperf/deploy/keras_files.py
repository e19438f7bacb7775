"""Keras files read before they are loaded: what they hold that would run code, and loading them in safe mode.

A `.keras` file is a zip archive whose `config.json` describes the model; an `.h5` file keeps the same
description in its `model_config` attribute. Keras' safe mode refuses Python lambdas (a `Lambda`
layer's function, a lambda activation): their bytecode would run when the model loads. The
description is read first, so that the refusal names the layers that hold them and says how to go
on, before Keras runs anything.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

from tfperf import jsonio
from tfperf.deploy.errors import ModelError, first_line, listed

KERAS_SUFFIXES = (".keras", ".h5")
_NEEDS = ("give module:factory instead (a Python function that builds the model and loads its weights), or "
          "--trust to load it outside safe mode if you trust whoever made it")


def read_config(path: Path) -> dict[str, Any]:
    """The model description a Keras file holds, read without loading the model; ModelError if unreadable."""
    try:
        if path.suffix == ".keras":
            if not zipfile.is_zipfile(path):
                raise ModelError(f"{path} is not a Keras file (a .keras file is a zip archive): it is corrupt or "
                                 f"something else renamed")
            with zipfile.ZipFile(path) as archive:
                size = archive.getinfo("config.json").file_size
                if size > jsonio.MAX_BYTES:  # checked before a byte is inflated
                    raise ModelError(f"{path}: its config.json is {size:,} bytes, more than the {jsonio.MAX_BYTES:,} "
                                     f"a model description may be: it is not a model Keras wrote")
                return jsonio.loads(archive.read("config.json"), f"{path}:config.json")
        import h5py

        with h5py.File(path, "r") as f:
            text = f.attrs.get("model_config")
        if text is None:
            raise ModelError(f"{path} holds weights but no model (no model_config): build the model in "
                             f"module:factory and load the weights there")
        return jsonio.loads(text, f"{path}:model_config")
    except ModelError:
        raise
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as exc:
        raise ModelError(f"{path} cannot be read as a Keras file ({type(exc).__name__}: {first_line(exc)})") from None


def python_code_layers(config: Any, layer: str = "the model") -> list[str]:
    """The layers whose description holds Python bytecode (a lambda), which loading would run."""
    found: list[str] = []
    if isinstance(config, dict):
        if config.get("class_name") == "__lambda__" or (
                config.get("class_name") == "Lambda" and isinstance(config.get("config", {}).get("function"), list)):
            return [layer]  # a Keras 3 lambda, or a legacy .h5 Lambda whose function is marshalled bytecode
        name = config.get("config", {}).get("name") if isinstance(config.get("config"), dict) else None
        for value in config.values():
            found += python_code_layers(value, name or layer)
    elif isinstance(config, list):
        for value in config:
            found += python_code_layers(value, layer)
    return sorted(set(found))


# Libraries whose layers and models Keras files name ("keras_hub>BertTextClassifier") and that register them when
# imported: installed packages, not code from the file, so importing one to load such a file runs nothing new.
KERAS_LIBRARIES = ("keras_hub", "keras_nlp", "keras_cv", "keras_rs")


def libraries_named(config: Any) -> list[str]:
    """The KERAS_LIBRARIES a model description names (by registered name or module), in order."""
    found: list[str] = []
    if isinstance(config, dict):
        for key in ("registered_name", "module"):
            value = config.get(key)
            if isinstance(value, str):
                root = value.split(">")[0].split(".")[0]
                if root in KERAS_LIBRARIES and root not in found:
                    found.append(root)
        for value in config.values():
            found += [n for n in libraries_named(value) if n not in found]
    elif isinstance(config, list):
        for value in config:
            found += [n for n in libraries_named(value) if n not in found]
    return found


def load_keras_file(path: Path, *, trust: bool = False):
    """The Keras model in a .keras or .h5 file, loaded in Keras' safe mode unless `trust`; ModelError that
    says what to do when it cannot be loaded."""
    import keras

    config = read_config(path)
    risky = python_code_layers(config)
    if risky and not trust:
        raise ModelError(f"{path} holds Python code that Keras' safe mode will not run on load (a lambda in "
                         f"layer {listed(map(repr, risky))}): {_NEEDS}")
    import importlib

    for library in libraries_named(config):  # KerasHub's layers are registered when KerasHub is imported
        try:
            importlib.import_module(library)
        except ImportError:
            raise ModelError(f"{path} is made of {library}'s layers: install {library} (pip install "
                             f"{library.replace('_', '-')}) to load it") from None
    try:
        return keras.saving.load_model(str(path), compile=False, safe_mode=not trust)
    except (TypeError, ValueError) as exc:
        text = str(exc)
        if "safe_mode" in text:
            raise ModelError(f"{path} holds Python code that Keras' safe mode will not run on load: {_NEEDS}") from None
        if "deserializ" in text or "Could not locate" in text or "Unknown layer" in text:
            raise ModelError(f"{path} needs classes or functions this process does not have (custom layers, "
                             f"models or functions): give module:factory instead, a Python function that builds "
                             f"the model and loads its weights") from None
        raise ModelError(f"{path} cannot be loaded: {first_line(exc)}") from None
    except Exception as exc:  # a damaged archive or weights file
        raise ModelError(f"{path} cannot be loaded ({type(exc).__name__}: {first_line(exc)})") from None
