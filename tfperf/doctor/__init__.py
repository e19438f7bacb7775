"""tfperf doctor: the cookbook's experiments run on the user's own model, and advice ranked by measured gain.

Each experiment is one module with an `EXPERIMENT` (`experiment.Experiment`: its question, flags and rules, when it
applies, and `run(context) -> Section`), listed once in `registry.EXPERIMENTS` (run in its order, what a flag asked
for first). The model is loaded by `tfperf.deploy.loader` (any Keras file, SavedModel or `module:factory`) and fed
by `tfperf.deploy.inputs`; the experiments measure through tfperf.measure (interleaved rounds, verdicts from
confidence intervals). `run` prepares the options and runs the experiments within a budget; `advice` ranks the gains
whose interval clears the bar and writes the report; `command` is `tfperf doctor`; `child` runs a part in a process
of its own.
"""

from tfperf.doctor.advice import Diagnosis, summary, write_report
from tfperf.doctor.experiment import Context, Experiment, Section
from tfperf.doctor.options import RECIPE, DoctorError, Finding, Options
from tfperf.doctor.registry import EXPERIMENTS
from tfperf.doctor.run import diagnose, plan, prepare

__all__ = ["Context", "Diagnosis", "DoctorError", "EXPERIMENTS", "Experiment", "Finding", "Options", "RECIPE",
           "Section", "diagnose", "plan", "prepare", "summary", "write_report"]
