"""Clusters for the distributed recipes, by job: `processes` (a launcher run to its end, ports, TF_CONFIG, tasks
that never outlive us), `placement` (this machine or emulated hosts), `hosts` (namespaces joined by shaped links),
`ring` (the ring all-reduce model and its overlap with backpropagation) and `errors` (ClusterError)."""
