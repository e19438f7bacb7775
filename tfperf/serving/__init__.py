"""Serving under load: a dynamic batcher in front of any runtime, LoadGen's open-loop runs, serving
configurations (runtime, threads, instances, batching), the search for the best one within a latency
budget, and the `tfperf load` command. Request-level timing lives in `tfperf.measure.load`."""
