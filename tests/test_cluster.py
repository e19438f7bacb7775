"""Local clusters: ports, TF_CONFIG, the child-to-parent protocol, and tasks that fail or hang."""

import json
import sys

import pytest

from tfperf import flags
from tfperf.cluster import ClusterError, LocalCluster, free_ports, local_cluster, tf_config
from tfperf.measure.processes import ChildError, last_reply, replies, reply


def test_ports_and_tf_config():
    ports = free_ports(5)
    assert len(set(ports)) == 5
    cluster = local_cluster({"chief": 1, "worker": 2, "ps": 0})
    assert set(cluster) == {"chief", "worker"} and len(cluster["worker"]) == 2
    config = json.loads(tf_config(cluster, "worker", 1))
    assert config == {"cluster": cluster, "task": {"type": "worker", "index": 1}}


def test_reply_round_trip_and_missing_reply():
    output = "noise\n" + reply({"step_s": 0.5, "sizes": [1, 2]}) + "\n{\"not\": \"a reply\"}\n" + reply([3]) + "\n"
    assert replies(output) == [{"step_s": 0.5, "sizes": [1, 2]}, [3]] and last_reply(output) == [3]
    with pytest.raises(ChildError, match="worker0 exited without printing its result"):
        last_reply("no result here", "worker0")


def test_failed_task_is_named_with_its_log(tmp_path):
    with LocalCluster(tmp_path) as procs:
        procs.start("ok", [sys.executable, "-c", "print('fine')"], {})
        procs.start("bad", [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"], {})
        with pytest.raises(ClusterError, match=r"task bad exited with 3(.|\n)*boom"):
            procs.wait(timeout=60)


def test_hung_task_hits_the_deadline_and_is_killed(tmp_path):
    with LocalCluster(tmp_path) as procs:
        hung = procs.start("server", [sys.executable, "-c", "import time; time.sleep(600)"], {})
        with pytest.raises(ClusterError, match="server did not finish within 1 s"):
            procs.wait(timeout=1)
    assert hung.poll() is not None  # leaving the block killed it


def test_cluster_flags_are_shared():
    p = flags.ArgumentParser()
    flags.add_cluster_flags(p, sizes_help="bytes")
    args = p.parse_args(["--workers", "3", "--sizes", "1024", "4096"])
    assert (args.workers, args.sizes, args.timeout) == (3, [1024, 4096], 600)
