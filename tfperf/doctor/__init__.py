"""tfperf doctor: the cookbook's experiments run on the user's own model, and advice ranked by measured gain.

The model is loaded by `tfperf.deploy.loader` (any Keras file, SavedModel or `module:factory`) and fed by
`tfperf.deploy.inputs`. The experiments, one module each, measure through tfperf.measure (interleaved
rounds, verdicts from confidence intervals): `inference` (predict(), model(x), tf.function, XLA, LiteRT,
ONNX Runtime at each batch size, outputs checked against the model's), `retracing`, `threads` (thread
pools, each setting in a process of its own) and `training` (given a loss). `run.diagnose` runs them
within a budget; `advice` ranks the gains whose interval clears the bar and writes the report;
`command` is `tfperf doctor`.
"""

from tfperf.doctor.advice import Diagnosis, summary, write_report
from tfperf.doctor.options import RECIPE, DoctorError, Finding, Options
from tfperf.doctor.run import diagnose, plan

__all__ = ["Diagnosis", "DoctorError", "Finding", "Options", "RECIPE", "diagnose", "plan", "summary", "write_report"]
