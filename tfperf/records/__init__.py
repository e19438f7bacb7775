"""Records: the environment a figure depends on (`environment`), one JSON record per measured row in JSON
lines files (`jsonl`), each recipe's headline (`findings`), Markdown reports and charts (`report`) and
their HTML (`html`), and run-to-run comparison (`compare`). None of it imports TensorFlow at import time."""
