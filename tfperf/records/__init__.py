"""Records: the environment a figure depends on (`environment`), one JSON record per measured row
(`records`), Markdown reports and charts (`report`) and run-to-run comparison (`compare`). None of it
imports TensorFlow at import time."""
