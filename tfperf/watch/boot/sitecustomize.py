"""Started by `tfperf watch` in the watched program (this folder leads its PYTHONPATH): load the probe by file
path, without putting tfperf on the program's path, then run the sitecustomize the program would have run."""

import importlib.machinery
import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
_folder = os.environ.get("TFPERF_WATCH_DIR")
if _folder:
    try:
        _spec = importlib.util.spec_from_file_location("_tfperf_watch_probe",
                                                       os.path.join(os.path.dirname(_here), "probe.py"))
        _probe = importlib.util.module_from_spec(_spec)
        sys.modules["_tfperf_watch_probe"] = _probe
        _spec.loader.exec_module(_probe)
        _probe.install(_folder)
    except Exception as _exc:  # noqa: BLE001 - the watch must never be why the program fails
        sys.stderr.write(f"tfperf watch: not watching this process ({type(_exc).__name__}: {_exc})\n")

# The program's own sitecustomize, had this one not come first on the path.
_rest = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_theirs = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
if _theirs is not None and _theirs.loader is not None:
    _module = importlib.util.module_from_spec(_theirs)
    sys.modules["sitecustomize"] = _module
    _theirs.loader.exec_module(_module)
